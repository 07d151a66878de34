"""The KEP-SVGP baseline fine-tuned end to end on tiny configs: one epoch from a fitted backbone, its record (replaced
layers, training time, the ELBO's terms), resuming, and the reloaded model under the artifact contract; images and
texts (attention over each text's real tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config_dict, tiny_text_config_dict
from training.baselines.kep_svgp import KEP_SVGP_FILE, kep_svgp_dir, load_kep_svgp, train_kep_svgp
from training.config import validated
from training.fit.backbone import fit_backbone
from training.runtime import load_checkpoint


def test_kep_svgp_fine_tunes_one_epoch_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw = tiny_config_dict(tmp_path)
    raw["fit"]["epochs"] = 1
    raw["kep_svgp"] = {"layers": 1, "rank": 4, "rank_multi": 2, "epochs": 1, "batch_size": 64, "warmup_steps": 2,
                       "val_images": 100, "val_samples": 2}
    cfg = validated(raw)
    fit_backbone(cfg)
    path = train_kep_svgp(cfg)
    assert path == kep_svgp_dir(cfg) / KEP_SVGP_FILE
    payload = load_checkpoint(path)
    assert payload["replaced_layers"] == [2] and payload["num_layers"] == 2
    assert payload["seconds"] > 0 and payload["kep_svgp_config"]["rank"] == 4
    (record,) = payload["history"]
    assert record["train_kl"] > 0 and record["train_ksvd"] >= 0 and 0.0 <= record["val_accuracy"] <= 1.0
    capsys.readouterr()
    train_kep_svgp(cfg)  # the checkpoint holds the last epoch: nothing is trained again
    assert "resuming KEP-SVGP fine-tuning at epoch 1" in capsys.readouterr().out
    model = load_kep_svgp(cfg)
    pixels = torch.rand(2, 1, 28, 28)
    out = model(pixels, 3)  # [S, B, C]
    assert out.shape == (3, 2, 10) and not torch.allclose(out[0], out[1])
    assert model.sample_rows(pixels, torch.tensor([1, 2])).shape == (3, 10)


def test_text_kep_svgp_fine_tunes_over_real_tokens(tmp_path: Path) -> None:
    from training.data.tokens import load_run_tokenizer

    raw = tiny_text_config_dict(tmp_path)
    raw["fit"]["epochs"] = 1
    raw["kep_svgp"] = {"layers": 1, "rank": 4, "rank_multi": 2, "epochs": 1, "batch_size": 32, "warmup_steps": 2,
                       "val_images": 60, "val_samples": 2}
    cfg = validated(raw)
    fit_backbone(cfg)
    payload = load_checkpoint(train_kep_svgp(cfg))
    assert payload["replaced_layers"] == [2] and payload["num_layers"] == 2
    (record,) = payload["history"]
    assert record["train_kl"] > 0 and record["train_ksvd"] >= 0 and 0.0 <= record["val_accuracy"] <= 1.0
    model = load_kep_svgp(cfg)
    encoded = load_run_tokenizer(cfg.run_dir).encode("a fine , warm film")
    ids, mask = torch.tensor([encoded.ids]), torch.tensor([encoded.attention_mask])
    out = model(ids, mask, 3)  # [S, B, C]
    assert out.shape == (3, 1, 2) and not torch.allclose(out[0], out[1])
    pad = torch.zeros(1, 5, dtype=torch.long)
    torch.manual_seed(0)
    first = model(ids, mask, 2)
    torch.manual_seed(0)  # the same draws with five more padding tokens: the same rows
    torch.testing.assert_close(first, model(torch.cat([ids, pad], 1), torch.cat([mask, pad], 1), 2))
