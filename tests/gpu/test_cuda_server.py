"""The server on CUDA (real uvicorn): it answers, packs concurrent requests into one forward, reports the GPU's
memory, and survives a real out-of-memory error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from service.engine.artifact import Artifact, read_manifest, validate_manifest
from service.engine.device import Device, DeviceOutOfMemory, resolve_device
from service.engine.modalities import image
from service.engine.modalities.image import ImageBatch
from tests.gpu.conftest import needs_cuda
from tests.service.conftest import metric_value, one_batch, random_pixels, serve, settings_for

pytestmark = needs_cuda


def test_server_on_cuda_answers_and_batches(cuda_repository: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    settings = settings_for(cuda_repository, tmp_path, device="cuda", bf16=False)
    with serve(settings) as running:
        state = running.app_state
        assert state.device.is_cuda and state.device.shapes.buckets
        bodies = [{"inputs": [{"pixels": random_pixels(rng)[0]}], "n_samples": 4} for _ in range(6)]
        responses = one_batch(running, "tiny", bodies)
        assert [r.status_code for r in responses] == [200] * 6
        assert {r.json()["timings"]["batch_requests"] for r in responses} == {6}
        for response in responses:
            prediction = response.json()["predictions"][0]
            assert abs(sum(prediction["probabilities"].values()) - 1.0) < 1e-4
        metrics = httpx.get(f"{running.url}/metrics", timeout=30).text
        allocated = metric_value(metrics, "director_gpu_memory_allocated_bytes")
        reserved = metric_value(metrics, "director_gpu_memory_reserved_bytes")
        assert allocated is not None and reserved is not None and 0 < allocated <= reserved
        assert (metric_value(metrics, "director_gpu_memory_used_bytes") or 0) > 0
        if importlib.util.find_spec("pynvml") is not None:
            utilisation = metric_value(metrics, "director_gpu_utilization_ratio")
            assert utilisation is not None and 0.0 <= utilisation <= 1.0


class Hog(torch.nn.Module):
    """Asks the caching allocator for 64 TiB: a real CUDA out-of-memory error."""

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        return torch.empty(1 << 46, dtype=torch.uint8, device=pixels.device)

    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sample_rows(pixels, repeats), torch.zeros(0)


def test_a_real_out_of_memory_fails_the_batch_and_the_device_goes_on(cuda_artifact: Path) -> None:
    counted: list[int] = []
    device = resolve_device("cuda", bf16=False, torch_threads=0)
    device.on_out_of_memory = lambda: counted.append(1)
    pixels = torch.rand(2, 1, 28, 28)  # [2, 1, 28, 28]
    manifest = validate_manifest(read_manifest(cuda_artifact))
    modality = image.load(manifest, cuda_artifact)
    runner = modality.runner
    cost = runner.batch_cost(16, 0)
    hog = Artifact(cuda_artifact, manifest, Hog(), modality.decoder, runner)  # type: ignore[arg-type]
    with pytest.raises(DeviceOutOfMemory):
        runner.forward(hog.rows, device, ImageBatch(pixels), [2, 2], cost, None)
    assert counted == [1]
    module = torch.jit.load(str(cuda_artifact / "director.ts"), map_location="cuda").eval()
    served = Artifact(cuda_artifact, manifest, module, modality.decoder, runner)
    forward = runner.forward(served.rows, device, ImageBatch(pixels), [2, 3], cost, None)
    rows, errors = forward.rows, forward.scores
    assert errors is None or (errors.shape == (2,) and torch.isfinite(errors).all())
    assert rows.shape[0] == 5 and rows.device.type == "cpu" and torch.isfinite(rows).all()
    assert isinstance(device, Device) and not device.lock.locked()
