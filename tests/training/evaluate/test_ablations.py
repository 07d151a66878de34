"""Named distillation variants change exactly the settings they name."""

from pathlib import Path

import pytest

from training.config import DistilConfig, DistilKernelConfig
from training.evaluate.ablations import link_backbone, variant_overrides


def test_variants_change_one_setting() -> None:
    base = DistilConfig(kernel=DistilKernelConfig(mlp_ratio=2.0, frequency_embedding_size=32))
    assert variant_overrides("both", base) == {}
    assert variant_overrides("unlabeled", base) == {"l2_target": "teacher", "unlabeled_copies": 1}
    assert variant_overrides("corpus", base)["unlabeled_corpus"] == "debian_descriptions"
    assert variant_overrides("readout", base) == {"finetune_readout": True}
    assert variant_overrides("rollout", base) == {"l1_on_rollout": True}
    assert variant_overrides("depth_2", base) == {"depth": 2, "tau": None}
    assert variant_overrides("tau_0.1", base) == {"tau": 0.1}
    width = variant_overrides("mlp_0.5", base)["kernel"]
    assert width == DistilKernelConfig(mlp_ratio=0.5, frequency_embedding_size=32)  # the rest of the kernel kept


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown ablation"):
        variant_overrides("wider", DistilConfig())


def test_a_variant_links_the_backbone_a_symbolic_link_names(tmp_path: Path) -> None:
    # a calibrate depth folder holds its backbone as a relative link to the run's own file
    (tmp_path / "backbone.pt").write_bytes(b"weights")
    main = tmp_path / "depth-1"
    main.mkdir()
    (main / "backbone.pt").symlink_to(Path("..") / "backbone.pt")
    variant = main / "ablations" / "depth_2"
    variant.mkdir(parents=True)
    (variant / "backbone.pt").symlink_to(Path("..") / "backbone.pt")  # dangling, as an earlier attempt left it
    link_backbone(main / "backbone.pt", variant / "backbone.pt")
    assert (variant / "backbone.pt").read_bytes() == b"weights"
    assert not (variant / "backbone.pt").is_symlink()
