"""The detectors and shift rows of the targets page: each verdict follows from the figures it reads."""

from __future__ import annotations

from typing import Any

from training.evaluate.detector_targets import detector_checks, mutual_information_checks, shift_ece_checks


def detector(auroc: float, fpr95: float, ci95: tuple[float, float]) -> dict[str, Any]:
    return {"auroc": auroc, "fpr95": fpr95, "served_minus_detector": {"difference": 0.0, "ci95": list(ci95)}}


def detectors_results() -> dict[str, Any]:
    backbone = {
        "letters": {"mds": detector(0.96, 0.25, (-0.01, 0.002)), "rmds": detector(0.95, 0.2, (0.0, 0.02)),
                    "knn": detector(0.93, 0.3, (0.01, 0.04)), "vim": detector(0.94, 0.3, (0.0, 0.03)),
                    "gen": detector(0.99, 0.01, (-0.1, -0.05))},  # a logit score: not a feature detector
        "quotes": {"mds": detector(0.86, 0.7, (-0.03, -0.01)), "rmds": detector(0.80, 0.8, (0.0, 0.1)),
                   "knn": detector(0.80, 0.8, (0.0, 0.1)), "vim": detector(0.85, 0.6, (-0.02, 0.0))},
    }
    return {"detectors": {"served_score_auroc": {"letters": {"auroc": 0.958, "fpr95": 0.24},
                                                 "quotes": {"auroc": 0.83, "fpr95": 0.75}},
                          "methods": {"deterministic": {"ood": backbone}}},
            "test_and_ood": {"director_s1": {"ood_score": "mds"},
                             "director_s16": {"ood": {"letters": {"mutual_information": {"auroc": 0.80},
                                                                  "energy": {"auroc": 0.81}},
                                                      "quotes": {"mutual_information": {"auroc": 0.82},
                                                                 "energy": {"auroc": 0.79}}}}}}


def test_the_served_score_is_held_against_the_best_feature_detector() -> None:
    got = {c.target: (c.met, c.reference) for c in detector_checks(detectors_results())}
    letters = got["OOD AUROC on letters >= the best feature detector's on the backbone"]
    assert letters[0] is True and letters[1].startswith("0.960 (mds")  # its interval reaches 0; gen is not a detector
    assert got["FPR95 on letters <= that detector's"][0] is True  # 0.24 against mds's 0.25
    assert got["OOD AUROC on quotes >= the best feature detector's on the backbone"][0] is False  # below 0 throughout
    assert got["FPR95 on quotes <= that detector's"][0] is False  # 0.75 against mds's 0.7


def test_mutual_information_is_held_against_energy() -> None:
    got = {c.target: c.met for c in mutual_information_checks(detectors_results(), "director_s16", "S = 16")}
    assert got == {"MI AUROC on letters (S = 16) >= energy's": False, "MI AUROC on quotes (S = 16) >= energy's": True}
    assert [c.met for c in mutual_information_checks(detectors_results(), "director_s4", "S = 4")] == [None]


def test_ece_under_shift_is_held_against_temperature_scaling_per_severity() -> None:
    shift = {"shift": {"temperature_scaling": {"by_severity": {"1": {"ece": 0.03}, "5": {"ece": 0.27}}},
                       "director_s16_shift_noise": {"by_severity": {"1": {"ece": 0.035}, "5": {"ece": 0.2}}}}}
    got = {c.target: c.met for c in shift_ece_checks(shift, "director_s16_shift_noise", "noise")}
    assert got == {"noise: ECE under shift, severity 1 <= temperature scaling's": False,
                   "noise: ECE under shift, severity 5 <= temperature scaling's": True}
    texts = {"shift": {"temperature_scaling": {"mean": {"ece": 0.05}, "by_domain": {"tweets": {"ece": 0.04},
                                                                                 "editorials": {"ece": 0.06}}},
                       "director_s1": {"mean": {"ece": 0.05}, "by_domain": {"tweets": {"ece": 0.045},
                                                                           "editorials": {"ece": 0.055}}}}}
    got = {c.target: c.met for c in shift_ece_checks(texts, "director_s1", "served")}
    assert got == {"served: ECE under shift, tweets <= temperature scaling's": False,  # every domain, then the mean
                   "served: ECE under shift, editorials <= temperature scaling's": True,
                   "served: ECE under shift, the domains' mean <= temperature scaling's": True}  # a tie meets it
    assert [c.met for c in shift_ece_checks(texts, "director_s4", "absent")] == [None]
