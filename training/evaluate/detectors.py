"""The post-hoc OOD detectors an ML engineer tries first, beside every compared method (docs/method.md, "Feature-space
scores"): MDS, RMDS, KNN and ViM on the method's own penultimate features (``models.feature_scores``), GEN and
MaxLogit on its logits. The results pages set each of them against DIRECTOR's served score with paired intervals.

A method's features are the input of its class head (every ``nn.Linear`` with one output per class), read with a
forward pre-hook while the method runs exactly as it is evaluated: the deterministic backbone gives one row per
input, MC dropout and DIRECTOR one per sample (DIRECTOR: the readout's pooled features of each sampled X_T), an
ensemble one per member through that member's own head. Each head's statistics are fitted on its features of the
training split (one draw), and an input's feature score is the mean over its rows: per sample (or member), then
averaged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from models.feature_scores import FEATURE_SCORES, FeatureScorer, fit_feature_scorer
from models.uncertainty import UncertaintySummary, summarize
from training.evaluate.evaluation import DetectorScores, Evaluation, Source
from training.evaluate.logit_cache import stable_seed
from training.loading import AnySplit
from training.ood_metrics import auroc, ood_report

GEN_GAMMA = 0.1  # GEN's exponent (Liu et al., 2023)
GEN_TOP = 100  # the largest probabilities GEN sums over
LOGIT_DETECTORS = ("gen", "max_logit")
DETECTORS = (*FEATURE_SCORES, *LOGIT_DETECTORS)
SCORE_CHUNK = 2048  # feature rows scored at once (KNN holds [rows, bank] similarities)


def class_heads(model: nn.Module, num_classes: int) -> list[nn.Linear]:
    """The linear layers whose outputs are class logits: one per backbone, one per ensemble member."""
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == num_classes]
    if not heads:
        raise ValueError(f"no linear layer with {num_classes} outputs: the model's class head cannot be found")
    return heads


@torch.no_grad()
def head_features(model: nn.Module, split: AnySplit, n_samples: int, num_classes: int, rows_per_forward: int = 256
                  ) -> torch.Tensor:
    """Per input, per class head, the head's input rows while ``model(*inputs, n_samples)`` runs: [N, H, R, D'],
    R = n_samples for a sampled method, 1 for a backbone or an ensemble member."""
    heads = class_heads(model, num_classes)
    captured: list[list[torch.Tensor]] = [[] for _ in heads]

    def keep(index: int) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            captured[index].append(args[0].detach().float().cpu())

        return hook

    def rows(*args: torch.Tensor) -> torch.Tensor:
        for part in captured:
            part.clear()
        model(*args, n_samples)
        batch = args[0].shape[0]
        per_head = [torch.cat(part).view(batch, -1, part[0].shape[-1]) for part in captured]  # H x [b, R, D']
        return torch.stack(per_head, 1)  # [b, H, R, D']

    hooks = [head.register_forward_pre_hook(keep(i)) for i, head in enumerate(heads)]
    try:
        return split.map(rows, max(1, rows_per_forward // n_samples))  # [N, H, R, D']
    finally:
        for hook in hooks:
            hook.remove()


def fit_scorers(model: nn.Module, train_features: torch.Tensor, labels: torch.Tensor, num_classes: int, seed: int,
                knn_bank: int) -> list[FeatureScorer]:
    """One fitted scorer per class head, from that head's training features [N, H, 1, D'] and its own weights."""
    scorers = []
    for index, head in enumerate(class_heads(model, num_classes)):
        weight = head.weight.detach().float()  # [C, D']
        bias = head.bias.detach().float() if head.bias is not None else torch.zeros(num_classes)  # [C]
        scorers.append(fit_feature_scorer(train_features[:, index, 0], labels, num_classes, weight, bias, seed,
                                          bank_size=knn_bank))
    return scorers


@torch.no_grad()
def feature_detector_scores(scorers: list[FeatureScorer], features: torch.Tensor) -> torch.Tensor:
    """Every input's ``FEATURE_SCORES`` [N, 4] from its feature rows [N, H, R, D']: each row scored with its head's
    statistics, then averaged over the rows and the heads."""
    n, heads, rows, dim = features.shape
    total = torch.zeros(n, len(FEATURE_SCORES))  # [N, 4]
    for index, scorer in enumerate(scorers):
        flat = features[:, index].reshape(n * rows, dim)  # [N*R, D']
        scores = torch.cat([scorer(flat[i:i + SCORE_CHUNK]) for i in range(0, flat.shape[0], SCORE_CHUNK)])  # [N*R, 4]
        total += scores.view(n, rows, -1).mean(1)
    return total / heads


def logit_detector_scores(logits: torch.Tensor, summary: UncertaintySummary) -> torch.Tensor:
    """GEN and MaxLogit [N, 2] (higher = more out-of-distribution) of sampled logits [S, N, C]: GEN on the mean
    probabilities, sum over the top classes of p^g (1 - p)^g; MaxLogit, minus the largest mean logit."""
    p = summary.probabilities.double()  # [N, C]
    top = p.topk(min(GEN_TOP, p.shape[1]), dim=1).values  # [N, M]
    gen = (top.pow(GEN_GAMMA) * (1 - top).clamp_min(0).pow(GEN_GAMMA)).sum(1)  # [N]
    max_logit = -logits.double().mean(0).max(dim=1).values  # [N]
    return torch.stack([gen, max_logit], dim=1).float()  # [N, 2]


def paired_auroc_difference(a_id: torch.Tensor, a_ood: torch.Tensor, b_id: torch.Tensor, b_ood: torch.Tensor,
                            n_boot: int, seed: int) -> dict[str, Any]:
    """AUROC(a) - AUROC(b) of two scores of the same inputs, with a 95% percentile interval from resampling the
    in-distribution and the OOD inputs (each with replacement, the same draw for both scores)."""
    gen = torch.Generator().manual_seed(seed)
    diffs = []
    for _ in range(n_boot):
        i = torch.randint(len(a_id), (len(a_id),), generator=gen)
        j = torch.randint(len(a_ood), (len(a_ood),), generator=gen)
        diffs.append(auroc(a_id[i], a_ood[j]) - auroc(b_id[i], b_ood[j]))
    ordered = torch.tensor(diffs).sort().values
    low, high = ordered[int(0.025 * (n_boot - 1))], ordered[int(0.975 * (n_boot - 1))]
    return {"difference": auroc(a_id, a_ood) - auroc(b_id, b_ood), "ci95": [float(low), float(high)]}


def detector_report(scores: DetectorScores, served: dict[str, torch.Tensor], ood_sets: list[str], n_boot: int,
                    seed: int) -> dict[str, Any]:
    """Per OOD set, every detector's AUROC / AUPR / FPR95 against the test split and its paired AUROC difference
    from the served score (served minus detector: an interval above 0 means the served score is better)."""
    out: dict[str, Any] = {}
    for set_name in ood_sets:
        rows = {}
        for index, name in enumerate(DETECTORS):
            test, ood = scores["test"][:, index], scores[set_name][:, index]
            rows[name] = {**ood_report(test, ood), "served_minus_detector": paired_auroc_difference(
                served["test"], served[set_name], test, ood, n_boot, seed)}
        out[set_name] = rows
    return out


def source_detectors(model: nn.Module, n_samples: int, sets: dict[str, AnySplit], train: AnySplit, num_classes: int,
                     logits: Callable[[str, AnySplit], tuple[torch.Tensor, UncertaintySummary]], seed: int,
                     knn_bank: int, rows_per_forward: int) -> DetectorScores:
    """Every detector's scores on each named set for one method: statistics fitted on ``train``, features read at
    ``n_samples`` rows per input, ``logits(name, split)`` the method's own sampled logits and their summary."""
    scorers = fit_scorers(model, head_features(model, train, 1, num_classes, rows_per_forward), train.labels,
                          num_classes, seed, knn_bank)
    out: DetectorScores = {}
    for name, split in tqdm(sets.items(), desc="detectors", leave=False):
        features = head_features(model, split, n_samples, num_classes, rows_per_forward)  # [N, H, R, D']
        out[name] = torch.cat([feature_detector_scores(scorers, features), logit_detector_scores(*logits(name, split))],
                              dim=1)  # [N, 6]
    return out


DETECTOR_SOURCES = ("deterministic", "mc_dropout", "ensemble", "director")  # the methods with features


def evaluate_detectors(evaluation: Evaluation, draws_test: int) -> dict[str, Any]:
    """The free detectors above on each method's own features and logits, per OOD set,
    each against the served score (the served version's row's choice in ``test_and_ood``, which runs first, or
    DIRECTOR's at S = 1 when the evaluation has no served version). Scores are cached
    beside the logits, so a rerun fits nothing."""
    inputs, ev, cfg = evaluation.inputs, evaluation.ev, evaluation.cfg
    sets = {"test": inputs.test, **inputs.ood}
    num_classes = int(inputs.train.labels.max()) + 1
    out: dict[str, Any] = {"served_score_auroc": {name: ood_report(evaluation.served_scores["test"],
                                                                   evaluation.served_scores[name])
                                                  for name in inputs.ood},
                           "served_method": evaluation.served_score_method, "methods": {}}
    for source_name in DETECTOR_SOURCES:
        if source_name == "ensemble" and ev.ensemble_members < 2:
            continue  # an ensemble of one is the backbone itself
        source = evaluation.sources[source_name]

        def logits(set_name: str, split: AnySplit, source_name: str = source_name, draws: int = source.draws
                   ) -> tuple[torch.Tensor, UncertaintySummary]:
            wide = draws_test if set_name == "test" and source_name in ("director", "mc_dropout") else None
            sampled = evaluation.logits(source_name, set_name, split, wide)[:draws]  # [S, N, C]
            return sampled, summarize(sampled)

        def compute(source: Source = source, logits: Callable[..., Any] = logits) -> DetectorScores:
            torch.manual_seed(stable_seed(source.model_id, "detectors"))
            return source_detectors(source.model, source.draws, sets, inputs.train, num_classes, logits, cfg.seed,
                                    cfg.export.knn_bank, ev.rows_per_forward)

        scores = evaluation.detector_scores(source, sets, compute)
        out["methods"][source_name] = {"rows_per_input": source.draws,
                                       "ood": detector_report(scores, evaluation.served_scores, list(inputs.ood),
                                                              ev.bootstrap, cfg.seed)}
    return out
