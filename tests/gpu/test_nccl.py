"""``distil`` under torchrun on two GPUs: NCCL, each rank on its own device, equal parameters at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from tests.conftest import tiny_config_dict
from tests.gpu.conftest import needs_cuda, needs_two_gpus
from tests.training.test_ddp import RANK_SCRIPT
from training.cli import main

pytestmark = [needs_cuda, needs_two_gpus]


def test_torchrun_two_gpus_over_nccl_end_with_equal_parameters(tmp_path: Path) -> None:
    cfg = tiny_config_dict(tmp_path)
    cfg["device"] = "cuda"
    cfg["fit"]["epochs"] = 1
    cfg["fit"]["max_steps"] = 2
    cfg["distil"]["max_steps"] = 2
    cfg["distil"]["tau"] = 0.3
    config = tmp_path / "nccl.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["fit-backbone", "--config", str(config)]) == 0
    script = tmp_path / "rank.py"
    # each rank trained on its own GPU (runtime.init_distributed chose NCCL for it)
    script.write_text(RANK_SCRIPT + "assert next(result.kernel.parameters()).device == "
                      "torch.device('cuda', int(os.environ['LOCAL_RANK']))\n")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun is not None
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(config), str(tmp_path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = torch.load(tmp_path / "rank0.pt", map_location="cpu")
    rank1 = torch.load(tmp_path / "rank1.pt", map_location="cpu")
    for key in rank0:
        torch.testing.assert_close(rank0[key], rank1[key], atol=0, rtol=0)
