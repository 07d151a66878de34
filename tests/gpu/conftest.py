"""Fixtures of the CUDA tests: the tiny model exported on this host (so its torch scripts it, whatever version a
committed artifact was scripted with), as served and with its sampling noise off (deterministic, so CPU and CUDA
outputs can be compared row for row). Every test here is skipped without a CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import FASHION_ROOT, export_tiny, tiny_config_dict
from tests.service.conftest import copy_version, with_noise_scale
from training.data.images import load_fashion_mnist_split

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@pytest.fixture(scope="session")
def cuda_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/repo/tiny/1``: the tiny pipeline (fit-backbone, distil, export; on the GPU when one is present)."""
    tmp = tmp_path_factory.mktemp("cuda-pipeline")
    return export_tiny(tmp, tiny_config_dict(tmp))[1]


@pytest.fixture(scope="session")
def quiet_artifact(cuda_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_noise_scale(cuda_artifact, tmp_path_factory.mktemp("quiet") / "tiny", 0.0)


@pytest.fixture(scope="session")
def cuda_repository(cuda_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("cuda-repository")
    copy_version(cuda_artifact, repository, "tiny", "1")
    return repository


@pytest.fixture(scope="session")
def test_images() -> torch.Tensor:
    """The first 1,000 Fashion-MNIST test images ``[1000, 1, 28, 28]`` in [0, 1]."""
    return load_fashion_mnist_split(FASHION_ROOT, "test").images[:1000]
