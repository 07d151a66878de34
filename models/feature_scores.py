"""Feature-space OOD scores on a classifier's penultimate features (docs/method.md, "Feature-space scores"), carried in
the artifact as fitted statistics so that the server computes them per input beside the sampled rows. Higher = more
out-of-distribution for every score:

- ``mds``: Mahalanobis distance to the nearest class mean under one shared covariance (Lee et al., 2018);
- ``rmds``: relative Mahalanobis, the class distance minus the distance to the training features' own Gaussian
  (Ren et al., 2021), which removes what every class shares;
- ``knn``: one minus the cosine similarity to the k-th nearest L2-normalised training feature in a bounded bank
  (Sun et al., 2022);
- ``vim``: ViM (Wang et al., 2022), the feature's norm outside the principal subspace (about the head's own origin)
  scaled by alpha, minus the logits' log-sum-exp;
- ``mds_pp``: Mahalanobis++ (Mueller and Hein, 2025), ``mds`` on L2-normalised features (class means and one shared
  covariance fitted on the normalised training features), which removes the feature norm's variation that breaks the
  Gaussian fit of plain MDS.

Fitted once on the training split (``fit_feature_scorer``); the module is scriptable and runs in float32. An exported
artifact computes only the scores its manifest reads (``FeatureScorer.keep``): the server would throw the others away,
and they are not free (KNN compares every input with the whole bank; on fashion-vit the four took as long as a backbone
layer for one image).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.uncertainty import FEATURE_SCORES

__all__ = ["FEATURE_SCORES", "FeatureScorer", "fit_feature_scorer", "served_scores"]
KNN_K = 50  # neighbours (the k-th nearest decides), as OpenOOD's KNN
KNN_BANK = 10_000  # training features kept for KNN at most (a seeded sample)


def whitening(centred: torch.Tensor) -> torch.Tensor:
    """W [D, D] with ``W W^T`` the inverse of the covariance of ``centred`` [N, D] (float64), so that a Mahalanobis
    distance is a Euclidean one after ``x @ W``; a ridge of 1e-6 x the mean eigenvalue keeps a rank-deficient
    covariance (fewer inputs than features, or dead features) invertible."""
    covariance = centred.T @ centred / max(centred.shape[0], 1)  # [D, D]
    ridge = 1e-6 * float(covariance.diagonal().mean().clamp_min(1e-12))
    values, vectors = torch.linalg.eigh(covariance + ridge * torch.eye(covariance.shape[0], dtype=covariance.dtype))
    return vectors / values.clamp_min(ridge).sqrt()  # [D, D]


class FeatureScorer(nn.Module):
    """features [B, D] -> scores [B, F]: the scores it serves (all four unless ``keep`` chose fewer), in
    ``FEATURE_SCORES`` order. The Mahalanobis distances are Euclidean distances between whitened vectors
    (``torch.cdist`` on the differences, not the expanded quadratic form, whose cancellation loses float32 precision
    near the class means)."""

    def __init__(self, class_means: torch.Tensor, class_whitening: torch.Tensor, background_mean: torch.Tensor,
                 background_whitening: torch.Tensor, bank: torch.Tensor, knn_k: int, head_weight: torch.Tensor,
                 head_bias: torch.Tensor, vim_origin: torch.Tensor, vim_residual: torch.Tensor, vim_alpha: float,
                 unit_means: torch.Tensor, unit_whitening: torch.Tensor) -> None:
        super().__init__()
        f32 = torch.float32
        self.register_buffer("background_mean", background_mean.to(f32))  # [D]
        self.register_buffer("class_whitening", class_whitening.to(f32))  # [D, D]
        self.register_buffer("class_points", ((class_means - background_mean) @ class_whitening).to(f32))  # [C, D]
        self.register_buffer("background_whitening", background_whitening.to(f32))  # [D, D]
        self.register_buffer("bank", bank.to(f32))  # [M, D] L2-normalised
        self.knn_k = min(int(knn_k), int(bank.shape[0]))
        self.register_buffer("head_weight", head_weight.to(f32))  # [C, D]
        self.register_buffer("head_bias", head_bias.to(f32))  # [C]
        self.register_buffer("vim_origin", vim_origin.to(f32))  # [D]
        self.register_buffer("vim_residual", vim_residual.to(f32))  # [D, D - r] orthonormal
        self.register_buffer("vim_alpha", torch.tensor(float(vim_alpha)))
        self.register_buffer("unit_whitening", unit_whitening.to(f32))  # [D, D] of the normalised features
        self.register_buffer("unit_points", (unit_means @ unit_whitening).to(f32))  # [C, D]
        # plain attributes, kept by a scripted module: the columns forward computes (``served_scores``)
        self.serves_mds, self.serves_rmds, self.serves_knn, self.serves_vim = True, True, True, True
        self.serves_mds_pp = True

    @torch.jit.unused
    def keep(self, names: Sequence[str]) -> None:
        """Compute only ``names`` (any of ``FEATURE_SCORES``; the columns stay in that order) from now on, and drop
        the statistics no kept score reads (the KNN bank is most of the module's size)."""
        unknown = sorted(set(names) - set(FEATURE_SCORES))
        if unknown:
            raise ValueError(f"unknown feature scores {unknown}; known: {list(FEATURE_SCORES)}")
        dropped = sorted(set(names) - set(served_scores(self)))
        if dropped:
            raise ValueError(f"feature scores {dropped} were dropped with their statistics; they cannot come back")
        self.serves_mds, self.serves_rmds = "mds" in names, "rmds" in names
        self.serves_knn, self.serves_vim = "knn" in names, "vim" in names
        self.serves_mds_pp = "mds_pp" in names
        if not self.serves_knn:
            self.bank = self.bank[:0].clone()  # [0, D]: a view would save the whole storage
        if not self.serves_rmds:
            self.background_whitening = self.background_whitening[:, :0].clone()  # [D, 0]
        if not self.serves_vim:
            self.vim_residual = self.vim_residual[:, :0].clone()  # [D, 0]
        if not self.serves_mds_pp:
            self.unit_whitening = self.unit_whitening[:, :0].clone()  # [D, 0]
            self.unit_points = self.unit_points[:, :0].clone()  # [C, 0]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        raw = features.float()  # [B, D]
        columns: list[torch.Tensor] = []  # [B] each, in FEATURE_SCORES order
        if self.serves_mds or self.serves_rmds:
            centred = raw - self.background_mean  # [B, D]
            whitened = centred @ self.class_whitening  # [B, D]
            class_distance = torch.cdist(whitened, self.class_points,
                                         compute_mode="donot_use_mm_for_euclid_dist").square()  # [B, C]
            if self.serves_mds:
                columns.append(class_distance.min(dim=1).values)  # [B]
            if self.serves_rmds:
                background = (centred @ self.background_whitening).square().sum(1, keepdim=True)  # [B, 1]
                columns.append((class_distance - background).min(dim=1).values)  # [B]
        if self.serves_knn:
            unit = raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True).clamp_min(1e-12)  # [B, D]
            columns.append(1.0 - (unit @ self.bank.T).topk(self.knn_k, dim=1).values[:, -1])  # [B]
        if self.serves_vim:
            logits = raw @ self.head_weight.T + self.head_bias  # [B, C]
            residual = torch.linalg.vector_norm((raw - self.vim_origin) @ self.vim_residual, dim=1)  # [B]
            columns.append(self.vim_alpha * residual - torch.logsumexp(logits, dim=1))  # [B]
        if self.serves_mds_pp:
            unit = raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True).clamp_min(1e-12)  # [B, D]
            distance = torch.cdist(unit @ self.unit_whitening, self.unit_points,
                                   compute_mode="donot_use_mm_for_euclid_dist").square()  # [B, C]
            columns.append(distance.min(dim=1).values)  # [B]
        if len(columns) == 0:
            return raw.new_zeros((raw.shape[0], 0))  # [B, 0]
        return torch.stack(columns, dim=1)  # [B, F]


def served_scores(scorer: nn.Module) -> tuple[str, ...]:
    """The columns a ``FeatureScorer`` (eager or scripted) computes, in order: every score it was not told to drop by
    ``keep`` (a scorer saved before ``keep`` existed computes the first four; one saved before Mahalanobis++ existed
    does not compute it)."""
    return tuple(name for name in FEATURE_SCORES if getattr(scorer, f"serves_{name}", name != "mds_pp"))


def vim_dimension(dim: int) -> int:
    """The principal subspace's dimension, by ViM's rule: 1000 from 1500 features, 512 from 768, else half."""
    if dim >= 1500:
        return 1000
    if dim >= 768:
        return 512
    return max(dim // 2, 1)


def fit_feature_scorer(features: torch.Tensor, labels: torch.Tensor, num_classes: int, head_weight: torch.Tensor,
                       head_bias: torch.Tensor, seed: int, bank_size: int = KNN_BANK, knn_k: int = KNN_K
                       ) -> FeatureScorer:
    """The statistics of training ``features`` [N, D] with ``labels`` [N] and the final linear layer (``head_weight``
    [C, D], ``head_bias`` [C]) the logits come from. Every class needs at least one input."""
    f = features.double()  # [N, D]
    counts = torch.bincount(labels, minlength=num_classes)
    if bool((counts == 0).any()):
        raise ValueError(f"classes without training inputs: {torch.nonzero(counts == 0).flatten().tolist()}")
    means = torch.zeros(num_classes, f.shape[1], dtype=torch.float64).index_add_(0, labels, f) / counts[:, None]
    class_whitening = whitening(f - means[labels])  # [D, D]
    background_mean = f.mean(0)  # [D]
    background_whitening = whitening(f - background_mean)  # [D, D]
    gen = torch.Generator().manual_seed(seed)
    keep = torch.randperm(f.shape[0], generator=gen)[:bank_size]
    bank = f[keep] / f[keep].norm(dim=1, keepdim=True).clamp_min(1e-12)  # [M, D]
    weight, bias = head_weight.double(), head_bias.double()
    origin = -torch.linalg.pinv(weight) @ bias  # [D]: the feature whose logits are all 0
    centred = f - origin  # [N, D]
    _, vectors = torch.linalg.eigh(centred.T @ centred / f.shape[0])  # ascending eigenvalues
    residual = vectors[:, : f.shape[1] - vim_dimension(f.shape[1])]  # [D, D - r] the smallest directions
    max_logit = (f @ weight.T + bias).max(dim=1).values  # [N]
    norms = (centred @ residual).norm(dim=1)  # [N]
    alpha = float(max_logit.mean() / norms.mean().clamp_min(1e-12))
    unit = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)  # [N, D] Mahalanobis++'s normalised features
    unit_means = torch.zeros_like(means).index_add_(0, labels, unit) / counts[:, None]  # [C, D]
    return FeatureScorer(means, class_whitening, background_mean, background_whitening, bank, knn_k, weight, bias,
                         origin, residual, alpha, unit_means, whitening(unit - unit_means[labels]))
