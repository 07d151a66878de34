"""A ``director.pt`` names its kernel by a typed config; checkpoints written before it still load."""

from __future__ import annotations

import torch

from models.kernel import KernelConfig
from training.loading import saved_kernel_config


def test_the_saved_kernel_config_and_the_older_arguments_give_the_same_config() -> None:
    config = KernelConfig(dim=8, num_heads=2, depth=2, causal=True, logvar_min=torch.zeros(2),
                          logvar_max=torch.ones(2))
    legacy = {key: value for key, value in config.document().items() if key != "depth"} | {"num_steps": 2}
    for payload in ({"kernel_config": config.document()}, {"kernel_args": legacy}):
        loaded = saved_kernel_config(payload)
        assert (loaded.dim, loaded.num_heads, loaded.depth, loaded.causal) == (8, 2, 2, True)
        torch.testing.assert_close(loaded.logvar_max, torch.ones(2))
