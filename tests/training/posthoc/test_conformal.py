"""A version's conformal file: written from the calibration split's served probabilities, read back through the
manifest's section with its checks, and giving the sets and thresholds the maths gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from artifact.conformal import CONFORMAL_FILE, Conformal, read_conformal_file
from models.conformal import ConformalTable, ScoreRule
from models.selective import learn_then_test
from training.posthoc.conformal import RISK_LEVELS, write_conformal


def calibration(n: int = 300, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(n, classes, generator=gen, dtype=torch.float64), dim=1)  # [n, C]
    return probs, torch.multinomial(probs, 1, generator=gen).squeeze(1)  # [n]


def test_the_file_answers_every_coverage_and_risk_as_the_maths_does(tmp_path: Path) -> None:
    probs, labels = calibration()
    section = write_conformal(probs, labels, ["lac", "aps", "raps"], "aps", 0.05, 1, 0.1,
                              "the last 300 validation inputs", tmp_path)
    assert Conformal.model_validate(json.loads(section.model_dump_json())) == section  # round-trips
    document = read_conformal_file(tmp_path, section, num_classes=4)
    test, _ = calibration(50)
    stored = ConformalTable(ScoreRule("aps"), torch.tensor(document["scores"]["aps"], dtype=torch.float64))
    fitted = ConformalTable.fit(probs, labels, ScoreRule("aps"))
    for coverage in (0.5, 0.8, 0.9, 0.95, 0.99):
        assert stored.sets(test, coverage) == fitted.sets(test, coverage)
    mondrian = ConformalTable(ScoreRule("lac"), torch.tensor(document["scores"]["lac"], dtype=torch.float64),
                              tuple(torch.tensor(s, dtype=torch.float64) for s in document["per_class"]["lac"]))
    assert mondrian.sets(test, 0.9) == ConformalTable.fit(probs, labels, ScoreRule("lac"), True).sets(test, 0.9)
    confidence, prediction = probs.max(1)
    for risk in (0.05, 0.2):
        expected = learn_then_test(confidence, prediction == labels, risk, 0.1).threshold
        assert document["selective"]["thresholds"][f"{risk:g}"] == expected
    assert len(document["selective"]["thresholds"]) == len(RISK_LEVELS) == len(section.risk_levels)


def test_a_file_that_breaks_its_section_is_refused(tmp_path: Path) -> None:
    probs, labels = calibration()
    section = write_conformal(probs, labels, ["lac"], "lac", 0.0, 0, 0.1, "calibration", tmp_path)
    document = json.loads((tmp_path / CONFORMAL_FILE).read_text())
    document["scores"]["lac"] = document["scores"]["lac"][::-1]  # descending
    (tmp_path / CONFORMAL_FILE).write_text(json.dumps(document))
    with pytest.raises(ValueError, match="ascending"):
        read_conformal_file(tmp_path, section, num_classes=4)
    with pytest.raises(ValueError, match="default_score"):
        Conformal(n=3, split="x", scores=["lac"], default_score="aps", class_conditional=False, selective_delta=0.1,
                  risk_levels=[0.05])
