"""A ``director.pt`` names its kernel by a typed config; checkpoints written before it still load; a stage reads its
run's ``backbone.pt`` once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from models.kernel import KernelConfig
from training.config import load_config
from training.loading import saved_kernel_config


def test_the_saved_kernel_config_and_the_older_arguments_give_the_same_config() -> None:
    config = KernelConfig(dim=8, num_heads=2, depth=2, causal=True, logvar_min=torch.zeros(2),
                          logvar_max=torch.ones(2))
    legacy = {key: value for key, value in config.document().items() if key != "depth"} | {"num_steps": 2}
    for payload in ({"kernel_config": config.document()}, {"kernel_args": legacy}):
        loaded = saved_kernel_config(payload)
        assert (loaded.dim, loaded.num_heads, loaded.depth, loaded.causal) == (8, 2, 2, True)
        torch.testing.assert_close(loaded.logvar_max, torch.ones(2))


def test_a_stage_reads_backbone_pt_once(tiny_export: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The export's run, its DIRECTOR and a fresh view come from one read of backbone.pt (a 0.5B model's is
    gigabytes); the view is built on its own copy of the weights, so folding it leaves the backbone as fitted."""
    import training.loading as loading
    from training.export.stage import load_run

    reads: list[str] = []
    original = loading.load_checkpoint

    def counted(path: Path, *args: Any, **kwargs: Any) -> Any:
        reads.append(Path(path).name)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(loading, "load_checkpoint", counted)
    run = load_run(load_config(tiny_export[0]))
    assert reads.count(loading.BACKBONE_FILE) == 1 and reads.count(loading.DIRECTOR_FILE) == 1
    opened = loading.RunBackbone.open(Path(run.cfg.run_dir))
    view = opened.view()
    assert reads.count(loading.BACKBONE_FILE) == 2  # one more open, nothing more for its view
    first = next(view.parameters())
    assert all(first.data_ptr() != p.data_ptr() for p in opened.backbone.parameters())
