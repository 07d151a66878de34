"""The artifact on CUDA against the same artifact on the CPU: fp32 rows within tolerance, bf16 labels agreeing."""

from __future__ import annotations

from pathlib import Path

import torch

from artifact.contract import ARTIFACT
from tests.gpu.conftest import needs_cuda

pytestmark = needs_cuda
SAMPLES = 4


def sampled_rows(folder: Path, device: str, images: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """``sample_rows`` of every image with ``SAMPLES`` samples, on ``device``: ``[N * S, C]`` fp32 on the host."""
    module = torch.jit.load(str(folder / ARTIFACT), map_location=device).eval()
    repeats = torch.full((images.shape[0],), SAMPLES, dtype=torch.long, device=device)  # [N]
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        return module.sample_rows(images.to(device), repeats).float().cpu()  # [N * S, C]


def test_fp32_rows_on_cuda_match_the_cpu(quiet_artifact: Path, test_images: torch.Tensor) -> None:
    """Noise off, so both devices compute the same function; full fp32 on CUDA (torch's default, TF32 off here)."""
    cpu = sampled_rows(quiet_artifact, "cpu", test_images)
    cuda = sampled_rows(quiet_artifact, "cuda", test_images)
    torch.testing.assert_close(cuda, cpu, atol=1e-3, rtol=1e-3)


def test_bf16_labels_agree_with_fp32(quiet_artifact: Path, test_images: torch.Tensor) -> None:
    fp32 = sampled_rows(quiet_artifact, "cuda", test_images).argmax(-1)  # [N * S]
    bf16 = sampled_rows(quiet_artifact, "cuda", test_images, bf16=True).argmax(-1)  # [N * S]
    agreement = float((fp32 == bf16).float().mean())
    assert agreement >= 0.99, agreement


def test_sampling_on_cuda_is_reproducible_under_a_seed(cuda_artifact: Path, test_images: torch.Tensor) -> None:
    torch.manual_seed(0)
    first = sampled_rows(cuda_artifact, "cuda", test_images[:64])
    torch.manual_seed(0)
    again = sampled_rows(cuda_artifact, "cuda", test_images[:64])
    assert torch.equal(first, again) and not torch.equal(first[0::SAMPLES], first[1::SAMPLES])
