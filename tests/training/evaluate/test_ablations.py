"""Named distillation variants change exactly the settings they name."""

import pytest

from training.config import DistilConfig, KernelConfig
from training.evaluate.ablations import variant_overrides


def test_variants_change_one_setting() -> None:
    base = DistilConfig(kernel=KernelConfig(mlp_ratio=2.0, frequency_embedding_size=32))
    assert variant_overrides("both", base) == {}
    assert variant_overrides("unlabeled", base) == {"l2_target": "teacher", "unlabeled_copies": 1}
    assert variant_overrides("corpus", base)["unlabeled_corpus"] == "debian_descriptions"
    assert variant_overrides("readout", base) == {"finetune_readout": True}
    assert variant_overrides("rollout", base) == {"l1_on_rollout": True}
    assert variant_overrides("depth_2", base) == {"depth": 2, "tau": None}
    assert variant_overrides("tau_0.1", base) == {"tau": 0.1}
    width = variant_overrides("mlp_0.5", base)["kernel"]
    assert width == KernelConfig(mlp_ratio=0.5, frequency_embedding_size=32)  # the rest of the kernel kept


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown ablation"):
        variant_overrides("wider", DistilConfig())
