from pathlib import Path

import pytest
import torch

from models.backbones import build_vit
from training.config import load_config, set_overrides

CONFIGS = sorted(Path("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_loads_and_builds_its_backbone(path: Path) -> None:
    cfg = load_config(path)
    model = build_vit(cfg.backbone).eval()
    pixels = torch.rand(1, cfg.backbone.in_chans, cfg.backbone.img_size, cfg.backbone.img_size)
    assert model(pixels).shape == (1, cfg.backbone.num_classes)
    assert cfg.distil.observed_variance in ("attention", "floor")


def test_paper_config_matches_the_paper_backbone() -> None:
    cfg = load_config("configs/cifar10_vit7.yaml")
    b = cfg.backbone
    assert (b.depth, b.embed_dim, b.mlp_ratio * b.embed_dim, b.num_heads, b.patch_size, b.global_pool) == (
        7, 384, 384, 12, 4, "avg")
    assert cfg.distil.kernel.mlp_ratio == 1.0


def test_overrides_and_unknown_keys(tmp_path: Path) -> None:
    cfg = load_config("configs/fashion_vit.yaml", {"distil.epochs": 1, "export.version": 8})
    assert cfg.distil.epochs == 1 and cfg.export.version == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("distil:\n  epoch: 3\n")
    with pytest.raises(ValueError, match="distil.epoch: Unexpected keyword argument"):
        load_config(bad)
    # every offending key named at once, nested sections (the backbone's) included, wrong types too
    bad.write_text("distil:\n  epochs: ten\nbackbone:\n  depthh: 2\nexport:\n  version: 1.5\n")
    with pytest.raises(ValueError) as error:
        load_config(bad)
    for expected in ("distil.epochs: Input should be a valid integer", "backbone.depthh: Unexpected keyword",
                     "export.version: Input should be a valid integer"):
        assert expected in str(error.value), str(error.value)


def test_an_unlabeled_corpus_is_for_text_models_distilled_against_the_teacher() -> None:
    text = {"distil.l2_target": "teacher", "distil.unlabeled_corpus": "debian_descriptions"}
    assert load_config("configs/movie_reviews_minilm.yaml", text).distil.unlabeled_corpus == "debian_descriptions"
    with pytest.raises(ValueError, match="unlabeled_corpus must be one of"):
        load_config("configs/movie_reviews_minilm.yaml", {**text, "distil.unlabeled_corpus": "fortunes"})
    with pytest.raises(ValueError, match="text for a text model"):
        load_config("configs/fashion_vit.yaml", text)
    with pytest.raises(ValueError, match="text for a text model"):
        load_config("configs/movie_reviews_minilm.yaml", {**text, "distil.l2_target": "labels"})


def test_set_overrides_read_each_value_as_yaml_and_refuse_a_pair_without_a_value() -> None:
    """The pipeline's commands and the package compiler read ``--set`` the same way."""
    assert set_overrides(["distil.epochs=2", "run_dir=/tmp/run", "export.format=aoti", "data.root=null"]) == {
        "distil.epochs": 2, "run_dir": "/tmp/run", "export.format": "aoti", "data.root": None}
    with pytest.raises(SystemExit, match="key=value"):
        set_overrides(["distil.epochs"])
