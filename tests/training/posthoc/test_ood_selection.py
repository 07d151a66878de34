"""The OOD score choice shared by the exporter and the evaluation: the per-input scores (kernel error, feature scores)
and their combinations are candidates only when they are known, a combination is standardised on in-distribution
validation, ties go to the simpler score, and mutual information falls back at S = 1."""

from __future__ import annotations

import torch

from models.uncertainty import COMBINED, KERNEL_ERROR, summarize
from training.posthoc.ood_selection import COMBINATION_WEIGHTS, ScoreInputs, choose_ood_score, combination_label


def inputs(n: int, logit_scale: float, error_level: float, seed: int) -> ScoreInputs:
    """n inputs whose logits are confident by ``logit_scale`` and whose kernel errors are around ``error_level``."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, n, 3, generator=gen) * 0.1  # [S, n, C]
    logits[..., 0] += logit_scale
    error = error_level * torch.exp(0.3 * torch.randn(n, generator=gen))  # [n] log-normal around the level
    return ScoreInputs(summarize(logits), {KERNEL_ERROR: error})


def test_the_kernel_error_wins_where_only_it_separates() -> None:
    val, ood_val = inputs(200, 3.0, 0.01, 0), inputs(200, 3.0, 0.1, 1)  # same confidence, 10x the error
    choice = choose_ood_score(val, {"ood": ood_val}, n_samples=4)
    assert choice.label == KERNEL_ERROR and choice.chosen.name == KERNEL_ERROR and choice.terms == ()
    assert choice.selection_auroc[KERNEL_ERROR] > 0.99
    fallback = choice.fallback_label if not choice.fallback_label.startswith(COMBINED) else "max_softmax"
    pairs = {label for label in choice.selection_auroc if label.startswith(COMBINED)}
    assert set(choice.selection_auroc) - pairs == {"max_softmax", "predictive_entropy", "mutual_information", "energy",
                                                   KERNEL_ERROR}
    assert len(pairs) == len(COMBINATION_WEIGHTS)  # the kernel error with the best logit score only
    assert all(label.startswith(f"{COMBINED} ({KERNEL_ERROR} w=") for label in pairs), (pairs, fallback)
    reported = choice.reported()
    assert sum(label.startswith(COMBINED) for label in reported) == 1 and choice.combined in reported


def test_a_combination_is_standardised_on_validation() -> None:
    val, ood_val = inputs(300, 3.0, 0.01, 0), inputs(300, 1.0, 0.02, 1)
    choice = choose_ood_score(val, {"ood": ood_val}, n_samples=4)
    best_logit = max(("max_softmax", "predictive_entropy", "energy"), key=choice.selection_auroc.get)
    combined = choice.candidates[combination_label(KERNEL_ERROR, 0.5, best_logit)]
    assert combined.name == COMBINED and [t.score for t in combined.terms] == [KERNEL_ERROR, best_logit]
    values = val.score(COMBINED, combined.terms)  # [300] two standardised terms, weights 0.5 each
    assert abs(float(values.mean())) < 1e-4
    kernel_term, logit_term = combined.terms
    assert kernel_term.log and not logit_term.log and kernel_term.weight == logit_term.weight == 0.5
    torch.testing.assert_close(kernel_term(val.kernel_error).std(), torch.tensor(0.5), rtol=1e-4, atol=1e-6)


def test_without_kernel_errors_only_logit_scores_compete_and_ties_go_to_the_simpler() -> None:
    val, ood_val = inputs(100, 3.0, 0.01, 0), inputs(100, 3.0, 0.01, 1)
    plain = choose_ood_score(ScoreInputs(val.summary), {"ood": ScoreInputs(ood_val.summary)}, n_samples=1)
    assert set(plain.selection_auroc) == {"max_softmax", "predictive_entropy", "energy"} and plain.combined is None
    same = ScoreInputs(val.summary, {KERNEL_ERROR: torch.ones(100)})
    tied = choose_ood_score(same, {"ood": ScoreInputs(val.summary, {KERNEL_ERROR: torch.ones(100)})}, n_samples=2)
    assert tied.selection_auroc[KERNEL_ERROR] == 0.5 and tied.label == "max_softmax"  # all 0.5: the first wins


def test_feature_scores_and_their_pairs_compete_when_the_artifact_gives_them() -> None:
    """A feature score that alone separates wins; every pair (kernel error + logit, kernel error + feature, feature +
    logit) was a candidate at each weight; the mds term of a pair is standardised on a log scale."""
    val, ood_val = inputs(300, 3.0, 0.01, 0), inputs(300, 3.0, 0.01, 1)  # the same logits and errors
    gen = torch.Generator().manual_seed(2)
    for target, level in ((val, 10.0), (ood_val, 40.0)):
        target.inputs.update({"mds": level * torch.exp(0.2 * torch.randn(300, generator=gen)),
                              "knn": torch.rand(300, generator=gen) * 0.1})
    choice = choose_ood_score(val, {"ood": ood_val}, n_samples=4)
    assert choice.label == "mds" and choice.selection_auroc["mds"] > 0.99
    best_logit = max(("max_softmax", "predictive_entropy", "energy"), key=choice.selection_auroc.get)
    for first, second in ((KERNEL_ERROR, best_logit), (KERNEL_ERROR, "mds"), (KERNEL_ERROR, "knn"), ("mds", best_logit),
                          ("knn", best_logit)):
        for weight in COMBINATION_WEIGHTS:
            assert combination_label(first, weight, second) in choice.selection_auroc
    terms = choice.candidates[combination_label("mds", 0.5, best_logit)].terms
    assert terms[0].log and not terms[1].log


def test_mutual_information_falls_back_where_it_is_undefined() -> None:
    gen = torch.Generator().manual_seed(0)
    val_logits = torch.randn(1, 200, 3, generator=gen).expand(8, -1, -1).clone()  # [8, 200, 3] samples agree
    ood_logits = torch.randn(8, 200, 3, generator=gen) * 3  # [8, 200, 3] samples disagree
    choice = choose_ood_score(ScoreInputs(summarize(val_logits)), {"ood": ScoreInputs(summarize(ood_logits))},
                              n_samples=8)
    assert choice.chosen.name == "mutual_information" and choice.fallback.name != "mutual_information"
    assert choice.rule_at(1) == choice.fallback and choice.rule_at(2) == choice.chosen


def test_over_families_a_score_close_to_the_best_on_all_beats_one_that_wins_a_single_family() -> None:
    """Family "errors" is separated by the kernel error alone (the logits agree with validation); family "confident"
    by the logits alone (the errors agree). The kernel error wins "errors" and fails "confident"; the best combination
    is close to the best on both, so the minimax-regret rule serves it, while either family alone picks its winner."""
    val = inputs(300, 3.0, 0.01, 0)
    errors, confident = inputs(300, 3.0, 0.1, 1), inputs(300, 0.0, 0.01, 2)
    alone = choose_ood_score(val, {"errors": errors}, n_samples=4)
    assert alone.label == KERNEL_ERROR
    both = choose_ood_score(val, {"errors": errors, "confident": confident}, n_samples=4)
    assert both.label.startswith(COMBINED)
    assert both.regret[both.label] < both.regret[KERNEL_ERROR]
    assert set(both.family_auroc) == {"errors", "confident"}
    assert both.family_auroc["confident"][KERNEL_ERROR] < 0.7 < both.family_auroc["confident"][both.label]
    weighted = choose_ood_score(val, {"errors": errors, "confident": confident}, n_samples=4,
                                weights={"errors": 1.0, "confident": 0.0})
    assert weighted.label == KERNEL_ERROR  # a family weighted 0 no longer counts
