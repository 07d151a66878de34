"""The DIRECTOR training objective (docs/method.md).

L1 (uncertainty-aware): KL(q_t || p_theta(. | X_{t-1})), closed-form diagonal Gaussians, teacher-forced
along the frozen backbone's observed trajectory (and optionally along a detached kernel rollout).
L2 (performance-aware): the task's loss of the readout of X_T sampled by a full stochastic rollout: cross-entropy,
or for a multi-label model binary cross-entropy per label, averaged over samples and labels (``models.tasks``).
Text batches pass a key padding mask ([B, N] True for real tokens): padding is masked in the kernel's attention,
excluded from the KL and the diagnostics, and the readout pools over real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.director import StochasticRollout
from models.kernel import TransitionKernel
from models.tasks import SOFTMAX, Task


def gaussian_kl(mu_q: torch.Tensor, var_q: torch.Tensor, mu_p: torch.Tensor, logvar_p: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(N(mu_q, var_q) || N(mu_p, exp(logvar_p)))."""
    var_p = logvar_p.exp()
    return 0.5 * (logvar_p - var_q.log() + (var_q + (mu_q - mu_p).square()) / var_p - 1.0)


def masked_mean(values: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over rows, tokens and features of [R, N, D]; padding tokens (mask False) excluded."""
    if token_mask is None:
        return values.mean()
    weights = token_mask.to(values.dtype).unsqueeze(-1)  # [R, N, 1]
    return (values * weights).sum() / (weights.sum() * values.shape[-1])


class ObservedProcess:
    """The frozen backbone's last K transitions read as q_k = N(X_{T-K+k}, tau * var + floor) (not a module: never
    trained). Steps are numbered k = 1..K like the kernel's; ``first_step`` = T - K transitions run before them
    (partial depth; 0 for the whole stack), so step k is the backbone's transition ``first_step + k``."""

    def __init__(self, view: nn.Module, floors: torch.Tensor, tau: float, mode: str, first_step: int = 0) -> None:
        if mode not in ("attention", "floor"):
            raise ValueError(f"observed_variance must be 'attention' or 'floor', got {mode!r}")
        if floors.shape[0] != int(view.num_steps) - first_step:
            raise ValueError(f"{floors.shape[0]} floors for {int(view.num_steps) - first_step} diffused steps")
        self.view = view
        self.floors = floors  # [K]
        self.tau = tau
        self.mode = mode
        self.first_step = first_step

    @property
    def depth(self) -> int:
        """K, the transitions diffused: the backbone's T less the ``first_step`` run before them."""
        return int(self.view.num_steps) - self.first_step

    def observed_variance(self, k: int, raw_variance: torch.Tensor) -> torch.Tensor:
        floor = self.floors[k - 1].to(raw_variance.device)
        if self.mode == "floor":
            return torch.full_like(raw_variance, float(floor))
        return self.tau * raw_variance + floor

    @torch.no_grad()
    def transition(self, k: int, x: torch.Tensor, mask: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = self.view.transition(self.first_step + k, x, mask)
        return mean, self.observed_variance(k, raw)

    @torch.no_grad()
    def trajectory(self, x0: torch.Tensor, mask: torch.Tensor | None = None
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Deterministic observed states [X_{T-K}..X_T] from ``x0`` = X_{T-K} and variances [var_1..var_K]."""
        states, variances = [x0], []
        for t in range(1, self.depth + 1):
            mean, var = self.transition(t, states[-1], mask)
            states.append(mean)
            variances.append(var)
        return states, variances

    @torch.no_grad()
    def sample(self, x0: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One stochastic rollout of the observed process itself (used to select tau)."""
        x = x0
        for t in range(1, self.depth + 1):
            mean, var = self.transition(t, x, mask)
            x = mean + var.sqrt() * torch.randn_like(mean)
        return x


@dataclass
class LossWeights:
    lambda_1: float = 0.8
    lambda_2: float = 0.2
    beta_nll: float = 0.5
    mean_mse_weight: float = 0.0
    l1_on_rollout: bool = False
    train_samples: int = 1
    l2_target: str = "labels"  # labels | teacher (the backbone's softmax on the same input)


class DistillationLoss(nn.Module):
    """Holds the trainable parts (kernel, readout) so DDP can wrap it; ``forward`` returns the loss and
    per-step diagnostics. The teacher is a plain attribute: frozen and never synchronised."""

    def __init__(self, kernel: TransitionKernel, readout: nn.Module, process: ObservedProcess,
                 weights: LossWeights, task: Task = SOFTMAX) -> None:
        super().__init__()
        self.task = task
        self.kernel = kernel
        self.readout = readout
        self.rollout = StochasticRollout(kernel)
        self.process = process
        self.weights = weights

    def _l1(self, inputs: torch.Tensor, steps: torch.Tensor, target_mean: torch.Tensor, target_var: torch.Tensor,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced KL for all K diffused steps in one kernel call; inputs/targets [K*B, N, D]."""
        mean_p, logvar_p = self.kernel(inputs, steps, mask)  # [K*B, N, D]
        kl = gaussian_kl(target_mean, target_var, mean_p, logvar_p)  # [K*B, N, D]
        if self.weights.beta_nll > 0:
            kl = kl * logvar_p.detach().exp().pow(self.weights.beta_nll)  # beta-NLL weighting
        loss = masked_mean(kl, mask)
        if self.weights.mean_mse_weight > 0:
            loss = loss + self.weights.mean_mse_weight * masked_mean((mean_p - target_mean).square(), mask)
        return loss, mean_p.detach(), logvar_p.detach()

    def _read(self, x: torch.Tensor, mask: torch.Tensor | None, repeats: int) -> torch.Tensor:
        """Readout logits of final states [B*repeats, N, D]; text pools each row's real tokens."""
        if mask is None:
            return self.readout(x)  # [B*r, C]
        return self.readout(x, mask.repeat_interleave(repeats, dim=0))  # [B*r, C]

    def forward(self, x0: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = x0.shape[0]
        depth = self.process.depth
        states, variances = self.process.trajectory(x0, mask)
        steps = torch.arange(1, depth + 1, device=x0.device).repeat_interleave(batch)  # [K*B]
        step_mask = mask.repeat(depth, 1) if mask is not None else None  # [K*B, N]
        inputs = torch.cat(states[:-1])  # [K*B, N, D]
        target_mean, target_var = torch.cat(states[1:]), torch.cat(variances)  # [K*B, N, D]
        l1, mean_p, logvar_p = self._l1(inputs, steps, target_mean, target_var, step_mask)

        if self.weights.l1_on_rollout:
            with torch.no_grad():  # states the kernel actually visits, detached
                rolled = [x0]
                for t in range(1, depth):
                    mean, std = self.rollout.step(rolled[-1], t, mask)
                    rolled.append(mean + std * torch.randn_like(mean))
                targets = [self.process.transition(t, rolled[t - 1], mask) for t in range(1, depth + 1)]
            l1_roll, _, _ = self._l1(torch.cat(rolled), steps, torch.cat([m for m, _ in targets]),
                                     torch.cat([v for _, v in targets]), step_mask)
            l1 = 0.5 * (l1 + l1_roll)

        repeats = torch.full((batch,), self.weights.train_samples, dtype=torch.long, device=x0.device)
        x_final = self.rollout(x0, repeats, mask)  # [B*S, N, D] reparameterised
        logits = self._read(x_final, mask, self.weights.train_samples)  # [B*S, C]
        if self.weights.l2_target == "teacher":
            with torch.no_grad():  # the frozen backbone's own prediction: its trajectory ends in X_T
                target = self.task.soft_targets(self._read(states[-1], mask, 1))  # [B, C]
        else:
            target = labels  # [B] class indices, or [B, C] indicators
        l2 = self.task.loss(logits, target.repeat_interleave(self.weights.train_samples, dim=0))
        loss = self.weights.lambda_1 * l1 + self.weights.lambda_2 * l2

        with torch.no_grad():
            if step_mask is None:
                per_step = lambda v: v.view(depth, batch, -1).mean(dim=(1, 2))  # noqa: E731  [K]
            else:  # means over real tokens
                real = step_mask.to(target_var.dtype).view(depth, batch, -1, 1)  # [K, B, N, 1]
                per_step = lambda v: ((v.view(depth, batch, real.shape[2], -1) * real).sum(dim=(1, 2, 3))  # noqa: E731
                                      / (real.sum(dim=(1, 2, 3)) * v.shape[-1]))  # [K]
            diagnostics = {
                "l1": l1.detach(), "l2": l2.detach(),
                "var_obs": per_step(target_var), "mean_sq_error": per_step((mean_p - target_mean).square()),
                "var_p": per_step(logvar_p.exp()),
            }
        return loss, diagnostics
