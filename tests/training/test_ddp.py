"""``distil`` runs unchanged under torchrun: two gloo ranks, two steps, equal parameters at the end."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from tests.conftest import tiny_config_dict
from training.cli import main

RANK_SCRIPT = """
import os, sys, torch
from training.config import load_config
from training.distil.stage import distil
cfg = load_config(sys.argv[1])
rank = int(os.environ["RANK"])
result = distil(cfg, resume=False)
torch.save(result.kernel.state_dict(), os.path.join(sys.argv[2], f"rank{rank}.pt"))
"""


def test_torchrun_two_ranks_end_with_equal_parameters(tmp_path: Path) -> None:
    cfg = tiny_config_dict(tmp_path)
    cfg["fit"]["epochs"] = 1
    cfg["fit"]["max_steps"] = 2
    cfg["distil"]["max_steps"] = 2
    cfg["distil"]["tau"] = 0.3
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["fit-backbone", "--config", str(config)]) == 0
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(config), str(tmp_path)],
        capture_output=True, text=True, timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        torch.testing.assert_close(rank0[key], rank1[key], atol=0, rtol=0)
    fresh = torch.load(tmp_path / "rank0.pt")
    assert any(v.abs().sum() > 0 for k, v in fresh.items() if k.startswith("mean_head"))  # it did train
