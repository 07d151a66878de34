"""The DIRECTOR module: embed -> deterministic prefix -> K sampled kernel steps -> readout, scriptable with
torch.jit.script.

Partial depth (docs/method.md): the first T - K transitions run as the real backbone layers once per input (the
prefix; none when K = T) and the kernel diffuses the last K steps. The first diffused step's mean and variance are
computed once per input and then expanded to that input's own sample count; the other steps run on all sample rows
at once. The rollout numbers its steps 1..K; the kernel's step k imitates the backbone's transition T - K + k.

Kernel error (an input-level OOD score): an export can give the rollout the backbone's own last K transitions (the
``teacher``, deterministic). ``scored_rows`` then also returns, per input, the kernel's mean squared error against the
backbone's next state along the backbone's trajectory: where one shared block imitates the backbone badly, the input
is unlike what it was distilled on. At K = 1 this costs one backbone layer per input, whatever the sample count.
That trajectory ends at the backbone's own X_T, so the same forward gives the backbone's penultimate features, and a
``feature_scorer`` (``models.feature_scores``) turns them into the feature-space scores, returned beside the kernel
error as further columns.
"""

from __future__ import annotations

import torch
from torch import nn

from models.folded_kernel import FoldedKernel
from models.kernel import TransitionKernel


def per_input_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[B, N, D] -> [B]: the mean over tokens and features, real tokens only (mask [B, N] True for real)."""
    if mask is None:
        return values.mean(dim=(1, 2))
    real = mask.to(values.dtype).unsqueeze(-1)  # [B, N, 1]
    return (values * real).sum(dim=(1, 2)) / (real.sum(dim=(1, 2)) * values.shape[-1])


def row_count(repeats: torch.Tensor) -> int:
    """sum(repeats), the one read of ``repeats`` on the host. Under ``torch.export`` the count is data-dependent: it
    is read as an unbacked size checked non-negative, so the exported program keeps any row count."""
    if torch.jit.is_scripting():
        return int(repeats.sum())
    rows = repeats.sum().item()  # an int eagerly, an unbacked SymInt while exporting (int() would specialise it)
    torch._check(rows >= 0)
    return rows  # type: ignore[return-value]


class StochasticRollout(nn.Module):
    """Samples X_T from X_0 with the kernel; ``noise_scale`` multiplies every step's std (a buffer,
    fitted post hoc on validation: the sampling analogue of temperature scaling).

    ``token_correlation`` (rho, a buffer in [0, 1]) is the correlation across tokens of one sample's noise in each
    feature: the noise is ``sqrt(1 - rho) * e_token + sqrt(rho) * e_shared`` with both standard normal, ``e_shared``
    one draw per sample row and feature, the same for every token. Every element keeps the kernel's predicted
    marginal N(mean, std^2) whatever rho; what changes is that noise drawn independently per token (rho = 0, the
    diagonal Gaussian the kernel is trained on) is averaged away by the readout's pooling over tokens, while shared
    noise survives it and moves the pooled features (docs/method.md, "Samples that carry information")."""

    def __init__(self, kernel: TransitionKernel, noise_scale: float = 1.0, teacher: nn.ModuleList | None = None,
                 token_correlation: float = 0.0) -> None:
        super().__init__()
        self.kernel = kernel
        self.num_steps = kernel.num_steps
        # the backbone's own transitions T-K+1..T, each (x, key_padding_mask) -> next state; empty: no kernel error
        self.teacher = nn.ModuleList()
        self.has_teacher = False  # a plain attribute: a scripted module answers it (a scripted ModuleList has no len)
        if teacher is not None:
            self.set_teacher(teacher)
        self.register_buffer("noise_scale", torch.tensor(float(noise_scale)))
        self.register_buffer("token_correlation", torch.zeros(()))
        self.shares_noise = False  # a plain attribute: rho > 0, read without a device sync
        self.set_token_correlation(token_correlation)
        self.folded = False  # the kernel is a ``FoldedKernel`` (an inference artifact)

    @torch.jit.unused
    def set_teacher(self, teacher: nn.ModuleList) -> None:
        """The backbone's own last K transitions (frozen), so that ``forward_scored`` computes the kernel error."""
        if len(teacher) != self.num_steps:
            raise ValueError(f"the teacher has {len(teacher)} transitions; the kernel diffuses {self.num_steps}")
        self.teacher = teacher
        self.has_teacher = True

    @torch.jit.unused
    def drop_teacher(self) -> None:
        """No teacher transitions: an artifact whose served score reads no per-input score."""
        self.teacher = nn.ModuleList()
        self.has_teacher = False

    @torch.jit.unused
    def set_token_correlation(self, rho: float) -> None:
        """Set rho (fitted post hoc, like ``noise_scale``)."""
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"token_correlation must lie in [0, 1], got {rho}")
        self.token_correlation.fill_(float(rho))
        self.shares_noise = rho > 0

    @torch.jit.unused
    def fold_conditioning(self) -> None:
        """Replace the kernel by its folded form (``models.folded_kernel``): each step's adaLN modulation folded into
        that step's weights, the two heads fused (inference artifacts; the rollout can no longer be trained)."""
        if not self.folded:
            self.kernel = FoldedKernel(self.kernel)
            self.folded = True

    def step(
        self, x: torch.Tensor, t: int, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [R, N, D] -> (mean, std) [R, N, D] of p(X_t | X_{t-1} = x)."""
        mean, logvar = self.kernel.step_moments(x, t, key_padding_mask)
        return mean, torch.exp(0.5 * logvar) * self.noise_scale

    def forward(
        self, x0: torch.Tensor, repeats: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x0 [B, N, D], repeats [B] -> X_T [sum(repeats), N, D], rows grouped by input in order."""
        mean, std = self.step(x0, 1, key_padding_mask)  # [B, N, D] once per input
        return self.sample_from(mean, std, repeats, key_padding_mask)

    def forward_scored(
        self, x0: torch.Tensor, repeats: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x0 [B, N, D], repeats [B] -> (X_T [sum(repeats), N, D], kernel error [B], the teacher's own X_T [B, N, D]),
        sharing the first step's mean."""
        mean, std = self.step(x0, 1, key_padding_mask)  # [B, N, D] once per input
        error, teacher_end = self.kernel_error(x0, mean, key_padding_mask)  # [B], [B, N, D]
        return self.sample_from(mean, std, repeats, key_padding_mask), error, teacher_end

    def kernel_error(
        self, x0: torch.Tensor, first_mean: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per input [B] (fp32): the kernel's squared mean error against the teacher's next state, averaged over the K
        steps along the teacher's trajectory (teacher forcing), real tokens and features; and where that trajectory
        ends, the backbone's own X_T [B, N, D] (its features feed the feature-space scores). ``first_mean``
        [B, N, D] is the kernel's mean at step 1 from x0 [B, N, D]."""
        if not self.has_teacher:
            raise RuntimeError("this rollout carries no teacher transitions: it cannot compute the kernel error")
        error = torch.zeros(x0.shape[0], dtype=torch.float32, device=x0.device)  # [B]
        x, mean = x0, first_mean
        t = 1
        for transition in self.teacher:
            if t > 1:
                mean, _ = self.step(x, t, key_padding_mask)  # [B, N, D]
            x = transition(x, key_padding_mask)  # [B, N, D] the backbone's X_{T-K+t}
            error = error + per_input_mean((mean.float() - x.float()).square(), key_padding_mask)  # [B]
            t += 1
        return error / self.num_steps, x

    def sample_from(
        self, mean: torch.Tensor, std: torch.Tensor, repeats: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The first step's mean and std [B, N, D] -> X_T [sum(repeats), N, D]: each input's rows drawn from them,
        then the later steps on all rows at once."""
        rows = row_count(repeats)  # with ``output_size`` given, no repeat_interleave syncs again
        mean = torch.repeat_interleave(mean, repeats, dim=0, output_size=rows)  # [R, N, D]
        std = torch.repeat_interleave(std, repeats, dim=0, output_size=rows)  # [R, N, D]
        row_mask: torch.Tensor | None = None
        if key_padding_mask is not None:
            row_mask = torch.repeat_interleave(key_padding_mask, repeats, dim=0, output_size=rows)  # [R, N]
        x = mean + std * self.noise(mean)  # [R, N, D]
        for t in range(2, self.num_steps + 1):
            mean, std = self.step(x, t, row_mask)
            x = mean + std * self.noise(mean)  # [R, N, D]
        return x

    def noise(self, like: torch.Tensor) -> torch.Tensor:
        """Standard normal noise shaped like ``like`` [R, N, D], correlated across tokens by ``token_correlation``."""
        own = torch.randn_like(like)  # [R, N, D]
        if not self.shares_noise:  # the kernel's diagonal Gaussian, drawn as before (same draws under the same seed)
            return own
        rho = self.token_correlation.to(like.dtype)
        shared = torch.randn(like.shape[0], 1, like.shape[2], dtype=like.dtype, device=like.device)  # [R, 1, D]
        return torch.sqrt(1 - rho) * own + torch.sqrt(rho) * shared  # [R, N, D]


class IdentityPrefix(nn.Module):
    """No prefix: the kernel diffuses the whole stack (K = T)."""

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return x


class NoFeatureScores(nn.Module):
    """The feature scorer of a model that carries none: no columns."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.new_zeros((features.shape[0], 0))  # [B, 0]


def input_scores(error: torch.Tensor, feature_scores: torch.Tensor) -> torch.Tensor:
    """The per-input scores ``scored_rows`` returns [B, 1 + F]: the kernel error [B], then the feature scorer's
    columns [B, F] (``models.feature_scores.FEATURE_SCORES``, or none)."""
    return torch.cat([error.unsqueeze(1), feature_scores.float()], dim=1)  # [B, 1 + F]


class ImageDirector(nn.Module):
    """Artifact-contract image model: ``forward(pixels, n_samples) -> [S, B, C]`` logits and
    ``sample_rows(pixels, repeats) -> [sum(repeats), C]``."""

    def __init__(self, embedding: nn.Module, rollout: StochasticRollout, readout: nn.Module,
                 prefix: nn.Module | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.prefix = prefix if prefix is not None else IdentityPrefix()
        self.rollout = rollout
        self.readout = readout
        self.feature_scorer: nn.Module = NoFeatureScores()

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        x_start = self.prefix(self.embedding(pixels), None)  # [B, N, D] deterministic, once per input
        x_t = self.rollout(x_start, repeats, None)  # [R, N, D]
        return self.readout(x_t)  # [R, C]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        batch = pixels.shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=pixels.device)
        rows = self.sample_rows(pixels, repeats)  # [B*S, C] grouped by input
        return rows.view(batch, n_samples, -1).transpose(0, 1)  # [S, B, C]

    @torch.jit.export
    def scored_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``sample_rows`` and every input's scores [B, 1 + F] (``input_scores``) in one forward (needs the teacher
        transitions)."""
        x_start = self.prefix(self.embedding(pixels), None)  # [B, N, D] deterministic, once per input
        x_t, error, teacher_end = self.rollout.forward_scored(x_start, repeats, None)  # [R, N, D], [B], [B, N, D]
        scores = input_scores(error, self.feature_scorer(self.readout.features(teacher_end, None)))  # [B, 1 + F]
        return self.readout(x_t), scores  # [R, C], [B, 1 + F]
