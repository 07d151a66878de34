"""The inference device on CPU: choosing it (a broken CUDA refuses to start, per-device defaults), shape buckets
(padding rows never reach a caller, every bucket warmed before ready) and out-of-memory handling. No GPU runs here:
the CUDA paths themselves are tested in tests/gpu/."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from artifact.contract import MANIFEST, parse_manifest
from service.engine import device as device_module
from service.engine.artifact import Artifact, warm_up_buckets
from service.engine.device import (
    DEVICE_DEFAULTS,
    Device,
    DeviceOutOfMemory,
    DeviceUnavailable,
    ForwardGate,
    cpu_forward_slots,
    resolve_device,
)
from service.engine.modalities.image import ImageBatch, ImageDecoder, ImageRunner
from service.engine.modalities.text import pad_tokens
from service.engine.shapes import WARM_CALLS, BatchShapes, Padding, bucket, bucket_sizes, warm_counts
from service.observability.metrics import Metrics
from tests.repository_facts import WHOLE_STACK_DIRECTOR_DIR
from tests.service.conftest import metric_value, random_pixels, serve, settings_for, wait_for


# ---------------------------------------------------------------------------------------------- device choice
def test_cuda_asked_without_a_working_cuda_refuses_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """DIRECTOR_DEVICE=cuda never falls back to the CPU: the error names torch's CUDA build and what was found of a
    driver."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable) as caught:
        resolve_device("cuda", bf16=False, torch_threads=0)
    message = str(caught.value)
    assert "DIRECTOR_DEVICE=cuda" in message and f"built for CUDA {torch.version.cuda or 'none'}" in message
    assert "driver" in message and "nvidia-smi" in message and "DIRECTOR_DEVICE=cpu" in message


def test_cuda_whose_first_kernel_fails_refuses_with_torch_s_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device torch reports as available but that cannot run a kernel (a driver older than the build's CUDA, a
    GPU architecture the wheel lacks): here torch reports CUDA available on a host without a driver, so the probe's
    tensor op fails and its error is quoted."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "ones", _failing_ones)
    with pytest.raises(DeviceUnavailable, match="torch says: .*no NVIDIA driver"):
        resolve_device("cuda", bf16=False, torch_threads=0)


def _failing_ones(*args: object, **kwargs: object) -> torch.Tensor:
    raise RuntimeError("Found no NVIDIA driver on your system.")


def test_auto_without_cuda_serves_on_the_cpu_with_the_cpu_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device = resolve_device("auto", bf16=True, torch_threads=0)
    assert device.torch_device.type == "cpu" and not device.bf16
    assert device.shapes == BatchShapes(128, 2048, buckets=False)
    chosen = resolve_device("cpu", bf16=False, torch_threads=0, max_batch_samples=64, shape_buckets=True)
    assert chosen.shapes == BatchShapes(64, 2048, buckets=True)  # a setting given wins over the device's default


def test_cuda_defaults_are_the_cuda_row_of_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA taken as working (the probe stubbed: no GPU here), the unset batch settings take the CUDA row and
    TF32 matmuls are switched on (the switch itself stubbed so this CPU process keeps full fp32)."""
    monkeypatch.setattr(device_module, "cuda_problem", lambda: None)
    precision: list[str] = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precision.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    device = resolve_device("cuda", bf16=True, torch_threads=0)
    cuda = DEVICE_DEFAULTS["cuda"]
    assert device.is_cuda and device.bf16 and precision == ["high"] and torch.backends.cudnn.allow_tf32
    assert device.shapes == BatchShapes(cuda.max_batch_samples, cuda.max_batch_tokens, cuda.shape_buckets)
    assert cuda.max_batch_samples > DEVICE_DEFAULTS["cpu"].max_batch_samples and cuda.shape_buckets


# ---------------------------------------------------------------------------------------------- buckets
def test_bucket_sizes_are_powers_of_two_then_the_budget() -> None:
    assert bucket_sizes(128) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert bucket_sizes(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert bucket_sizes(1) == (1,)
    sizes = bucket_sizes(100)
    assert [bucket(n, sizes) for n in (1, 3, 33, 64, 65, 100, 130)] == [1, 4, 64, 64, 100, 100, 130]


def test_padding_goes_to_the_last_real_input_and_empty_padding_inputs() -> None:
    shapes = BatchShapes(max_batch_samples=16, max_batch_tokens=64, buckets=True)
    padding = shapes.padding([2, 3, 1], 16)  # 3 inputs, 6 rows -> 4 inputs, 8 rows
    assert padding == Padding(inputs=4, rows=8, real_inputs=3, real_rows=6)
    assert padding.repeats([2, 3, 1]).tolist() == [2, 3, 3, 0]
    assert BatchShapes(16, 64, buckets=False).padding([2, 3, 1], 16) == Padding(3, 6, 3, 6)
    assert shapes.padding([2, 3], 8).rows == 8  # the largest bucket: text rows are bounded by max_batch_tokens / 8


def test_text_padding_inputs_show_one_pad_token() -> None:
    ids, mask = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 0]])  # [1, 3] each
    padded_ids, padded_mask = pad_tokens(ids, mask, Padding(2, 2, 1, 1), pad_id=0)
    assert padded_ids.tolist() == [[5, 6, 7], [0, 0, 0]] and padded_mask.tolist() == [[1, 1, 0], [1, 0, 0]]


class RowsByInput(torch.nn.Module):
    """A stand-in artifact module: each sampled row is (the input's first pixel, the sample's index within its
    input), so a row shows where it came from; it records the shapes it was called with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        self.calls.append((int(pixels.shape[0]), int(repeats.sum())))
        ids = torch.repeat_interleave(pixels[:, 0, 0, 0], repeats)  # [R]
        starts = torch.repeat_interleave(torch.cumsum(repeats, 0) - repeats, repeats)  # [R]
        position = torch.arange(ids.shape[0]) - starts  # [R]
        return torch.stack([ids, position.float()], dim=1)  # [R, 2]


def image_artifact(module: torch.nn.Module, tmp_path: Path) -> Artifact:
    """``module`` behind a committed whole-stack DIRECTOR manifest (fashion-vit/1), narrowed to 1x2x2 images, two
    labels, S <= 8."""
    committed = parse_manifest(json.loads((WHOLE_STACK_DIRECTOR_DIR / MANIFEST).read_text()))
    manifest = committed.model_copy(update={
        "labels": ["a", "b"], "input": committed.input.model_copy(update={"channels": 1, "height": 2, "width": 2}),
        "sampling": committed.sampling.model_copy(update={"default_samples": 2, "max_samples": 8})})
    return Artifact(tmp_path, manifest, module, ImageDecoder((1, 2, 2)), ImageRunner((1, 2, 2)))  # type: ignore[arg-type]


def forward_rows(artifact: Artifact, device: Device, pixels: torch.Tensor, repeats: list[int], max_batch_samples: int
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The image runner's forwards of ``pixels`` within a budget of ``max_batch_samples`` rows."""
    cost = artifact.runner.batch_cost(max_batch_samples, 0)
    forward = artifact.runner.forward(artifact.rows, device, ImageBatch(pixels), repeats, cost, None)
    return forward.rows, forward.scores


def test_padding_rows_never_reach_the_caller(tmp_path: Path) -> None:
    """Three inputs (ids 1, 2, 3) with 2, 3 and 1 samples run as 4 inputs and 8 rows; what comes back is exactly the
    6 real rows, in order, the same as without buckets."""
    module = RowsByInput()
    artifact = image_artifact(module, tmp_path)
    pixels = torch.arange(1, 4, dtype=torch.float32).view(3, 1, 1, 1).expand(3, 1, 2, 2).contiguous()  # [3, 1, 2, 2]
    bucketed = Device(torch.device("cpu"), shapes=BatchShapes(16, 64, buckets=True))
    rows, errors = forward_rows(artifact, bucketed, pixels, [2, 3, 1], max_batch_samples=16)
    assert module.calls == [(4, 8)] and errors is None  # the manifest's score reads logits only
    expected = [[1, 0], [1, 1], [2, 0], [2, 1], [2, 2], [3, 0]]
    assert rows.tolist() == expected
    plain, _ = forward_rows(artifact, Device(torch.device("cpu")), pixels, [2, 3, 1], max_batch_samples=16)
    assert module.calls[-1] == (3, 6) and plain.tolist() == expected


def test_every_bucket_is_warmed_before_ready(tmp_path: Path) -> None:
    module = RowsByInput()
    artifact = image_artifact(module, tmp_path)
    shapes = BatchShapes(max_batch_samples=16, max_batch_tokens=64, buckets=True)
    warm_up_buckets(artifact, Device(torch.device("cpu"), shapes=shapes))
    for rows in bucket_sizes(16):
        for inputs in {1, rows}:
            assert module.calls.count((inputs, rows)) == WARM_CALLS, (inputs, rows)
    assert len(module.calls) == WARM_CALLS * len(list(warm_counts(16)))


# ---------------------------------------------------------------------------------------------- out of memory
class OutOfMemoryOnce(torch.nn.Module):
    """A mock, because no GPU runs here: the first forward raises ``torch.OutOfMemoryError`` as CUDA's caching
    allocator does when a batch does not fit; later forwards go to the real artifact module."""

    def __init__(self, module: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.module = module
        self.raised = False

    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        if not self.raised:
            self.raised = True
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.module.sample_rows(pixels, repeats)

    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same, for an artifact whose OOD score reads the kernel error."""
        if not self.raised:
            self.raised = True
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.module.scored_rows(pixels, repeats)


def test_out_of_memory_fails_the_batch_not_the_device(tmp_path: Path) -> None:
    """A mock OOM (no GPU here) becomes ``DeviceOutOfMemory``, counted once; the next forward runs."""
    counted: list[int] = []
    device = Device(torch.device("cpu"), on_out_of_memory=lambda: counted.append(1))
    artifact = image_artifact(OutOfMemoryOnce(RowsByInput()), tmp_path)  # type: ignore[arg-type]
    pixels = torch.ones(1, 1, 2, 2)  # [1, 1, 2, 2]
    with pytest.raises(DeviceOutOfMemory, match="out of memory on cpu"):
        forward_rows(artifact, device, pixels, [2], max_batch_samples=8)
    assert counted == [1] and not device.lock.locked()
    assert forward_rows(artifact, device, pixels, [2], max_batch_samples=8)[0].tolist() == [[1, 0], [1, 1]]


def test_server_answers_an_out_of_memory_batch_with_503_and_keeps_serving(tiny_repository: Path,
                                                                          tmp_path: Path) -> None:
    """A real server with shape buckets on (as on CUDA) whose model's first forward raises a mock OOM (no GPU
    here): that request gets 503 with Retry-After, the OOM counter says 1, and the next request is answered."""
    rng = np.random.default_rng(0)
    settings = settings_for(tiny_repository, tmp_path, max_batch_samples=8, shape_buckets=True)
    with serve(settings) as running:
        entry = running.app_state.repository.get("tiny", None)
        assert entry is not None and entry.artifact is not None
        entry.artifact.module = OutOfMemoryOnce(entry.artifact.module)  # type: ignore[assignment]
        body = {"inputs": [{"pixels": random_pixels(rng)[0]}], "n_samples": 3}
        failed = httpx.post(f"{running.url}/predict", json=body, timeout=60)
        assert failed.status_code == 503 and failed.headers["Retry-After"] == "1"
        assert "out of device memory" in failed.json()["error"]
        served = httpx.post(f"{running.url}/predict", json={**body, "inputs": body["inputs"] * 3}, timeout=60)
        assert served.status_code == 200 and len(served.json()["predictions"]) == 3
        metrics = httpx.get(f"{running.url}/metrics", timeout=30).text
        assert metric_value(metrics, "director_gpu_out_of_memory_total") == 1.0


def test_gpu_memory_gauges_and_no_utilisation_sample_without_cuda() -> None:
    """Allocated, reserved and peak come from ``Device.memory_stats`` (None on CPU leaves them alone); utilisation
    has no sample in a process that never initialised CUDA."""
    metrics = Metrics()
    metrics.observe_device_memory(None)
    assert Device(torch.device("cpu")).memory_stats() is None
    metrics.observe_device_memory((1024, 4096, 2048))
    text = metrics.expose().decode()
    assert metric_value(text, "director_gpu_memory_allocated_bytes") == 1024.0
    assert metric_value(text, "director_gpu_memory_reserved_bytes") == 4096.0
    assert metric_value(text, "director_gpu_memory_peak_bytes") == 2048.0
    assert "# TYPE director_gpu_utilization_ratio gauge" in text
    assert metric_value(text, "director_gpu_utilization_ratio") is None


def test_the_forward_gate_shares_its_slots_and_lets_one_exclusive_holder_in_alone() -> None:
    """Unseeded forwards share the gate up to its slots; a seeded batch (exclusive) waits for them, keeps new shared
    turns out while it waits, and runs alone."""
    import threading

    gate = ForwardGate(slots=2)
    inside, events = [0], []
    most = [0]
    guard = threading.Lock()
    entered, leave = [threading.Event() for _ in range(2)], threading.Event()

    def shared(name: str, index: int | None) -> None:
        with gate.shared():
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                events.append(f"{name} in")
            if index is not None:  # one of the first two: hold the turn until told to leave
                entered[index].set()
                assert leave.wait(timeout=30)
            with guard:
                inside[0] -= 1

    def exclusive() -> None:
        with gate, guard:
            events.append(f"exclusive in with {inside[0]} shared")

    first = [threading.Thread(target=shared, args=(f"s{i}", i)) for i in range(2)]
    for thread in first:
        thread.start()
    wait_for(lambda: all(e.is_set() for e in entered), "both shared turns taken")
    writer = threading.Thread(target=exclusive)
    writer.start()
    wait_for(lambda: gate.exclusive_waiting == 1, "the exclusive request waiting")
    late = threading.Thread(target=shared, args=("late", None))
    late.start()  # it cannot get in ahead of the waiting exclusive request, whenever it reaches the gate
    leave.set()
    for thread in [*first, writer, late]:
        thread.join(timeout=10)
    assert most[0] == 2
    assert events.index("exclusive in with 0 shared") < events.index("late in")  # no shared turn jumps the queue
    assert not gate.locked() and gate.acquire(blocking=False)
    gate.release()
    with pytest.raises(RuntimeError):
        gate.release()


def test_cpu_forward_slots_follow_the_cores_over_the_threads() -> None:
    assert cpu_forward_slots(1, cores=2) == 2 and cpu_forward_slots(2, cores=2) == 1
    assert cpu_forward_slots(0, cores=16) == 1  # torch's default already uses every core
    assert cpu_forward_slots(4, cores=2) == 1
    assert resolve_device("cpu", bf16=False, torch_threads=0, concurrent_forwards=3).lock.slots == 3
