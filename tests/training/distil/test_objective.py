import math

import torch
from torch.distributions import Normal, kl_divergence

from models.backbones import VitConfig, build_vit
from models.kernel import TransitionKernel
from models.vit_view import VitTransitionView
from training.distil.objective import DistillationLoss, LossWeights, ObservedProcess, gaussian_kl, masked_mean
from training.posthoc.calibration import fit_temperature


def test_gaussian_kl_matches_torch_distributions() -> None:
    torch.manual_seed(0)
    mu_q, mu_p = torch.randn(50), torch.randn(50)
    var_q, logvar_p = torch.rand(50) + 0.1, torch.randn(50)
    expected = kl_divergence(Normal(mu_q, var_q.sqrt()), Normal(mu_p, (0.5 * logvar_p).exp()))
    torch.testing.assert_close(gaussian_kl(mu_q, var_q, mu_p, logvar_p), expected)


def test_kl_optimum_is_variance_plus_squared_mean_error() -> None:
    mu_q, var_q, mu_p = torch.tensor(0.3), torch.tensor(0.2), torch.tensor(0.0)
    logvar = torch.tensor(math.log(0.2 + 0.09), requires_grad=True)
    gaussian_kl(mu_q, var_q, mu_p, logvar).backward()
    assert abs(float(logvar.grad)) < 1e-6


def test_masked_mean_ignores_padding() -> None:
    values = torch.ones(2, 3, 4)
    values[:, 2] = 100.0
    mask = torch.tensor([[True, True, False], [True, True, False]])
    assert float(masked_mean(values, mask)) == 1.0


def _objective(**weights) -> tuple[DistillationLoss, VitTransitionView]:
    torch.manual_seed(0)
    view = VitTransitionView(build_vit(VitConfig(patch_size=7, embed_dim=16, depth=3, num_heads=2)).eval())
    view.requires_grad_(False)
    floors = torch.full((3,), 1e-4)
    process = ObservedProcess(view, floors, tau=0.3, mode="attention")
    kernel = TransitionKernel(16, 2, 3, logvar_init=math.log(1e-3), logvar_min=floors.log(),
                              logvar_max=torch.zeros(3))
    return DistillationLoss(kernel, view.readout_head, process, LossWeights(**weights)), view


def test_objective_trains_only_the_kernel_and_reports_per_step_diagnostics() -> None:
    objective, view = _objective(l1_on_rollout=True, mean_mse_weight=0.1, train_samples=2)
    x0 = view.embed(torch.rand(4, 1, 28, 28))
    loss, diag = objective(x0, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in objective.kernel.parameters() if p.requires_grad)
    assert all(p.grad is None for p in view.parameters())
    assert diag["var_obs"].shape == (3,) and diag["mean_sq_error"].shape == (3,) and diag["var_p"].shape == (3,)


def test_fresh_kernel_l1_is_the_identity_gap() -> None:
    """At initialisation the kernel's mean is the identity, so L1 sees exactly the teacher's step size."""
    objective, view = _objective(beta_nll=0.0, lambda_1=1.0, lambda_2=0.0)
    x0 = view.embed(torch.rand(4, 1, 28, 28))
    _, diag = objective(x0, torch.zeros(4, dtype=torch.long))
    states, _ = objective.process.trajectory(x0)
    gaps = torch.stack([(states[t] - states[t - 1]).square().mean() for t in range(1, 4)])
    torch.testing.assert_close(diag["mean_sq_error"], gaps)


def test_teacher_target_is_the_backbones_own_prediction() -> None:
    """l2_target teacher: L2 is the cross-entropy against the frozen backbone's softmax on the same input (no labels
    read), and a student rollout that reproduced the teacher exactly would reach the teacher's entropy."""
    torch.manual_seed(1)
    images = torch.rand(4, 1, 28, 28)
    objective, view = _objective(l2_target="teacher", lambda_1=0.0, lambda_2=1.0)
    x0 = view.embed(images)
    teacher = view.readout_head(objective.process.trajectory(x0)[0][-1]).softmax(-1)  # [B, C]
    torch.manual_seed(5)
    _, with_labels_a = objective(x0, torch.zeros(4, dtype=torch.long))
    torch.manual_seed(5)
    _, with_labels_b = objective(x0, torch.full((4,), 3, dtype=torch.long))
    assert with_labels_a["l2"] == with_labels_b["l2"]  # the labels are not read
    torch.manual_seed(5)
    student = view.readout_head(objective.rollout(x0, torch.ones(4, dtype=torch.long)))  # the same draw
    expected = -(teacher * student.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(with_labels_a["l2"], expected)
    entropy = -(teacher * teacher.log()).sum(-1).mean()
    assert with_labels_a["l2"] >= entropy  # cross-entropy >= the teacher's entropy (Gibbs)


def test_floor_mode_uses_only_the_floor() -> None:
    view = VitTransitionView(build_vit(VitConfig(patch_size=7, embed_dim=16, depth=2, num_heads=2)).eval())
    process = ObservedProcess(view, torch.tensor([1e-3, 2e-3]), tau=1.0, mode="floor")
    _, variances = process.trajectory(view.embed(torch.rand(2, 1, 28, 28)))
    assert bool((variances[1] == 2e-3).all())


def test_fit_temperature_recovers_a_known_temperature() -> None:
    torch.manual_seed(0)
    labels = torch.randint(0, 5, (4000,))
    true_logits = torch.randn(4000, 5) + 2.0 * torch.nn.functional.one_hot(labels, 5)
    # labels drawn from softmax(true_logits); a model reporting 3x those logits is overconfident by T=3
    sampled = torch.distributions.Categorical(logits=true_logits).sample()
    temperature = fit_temperature(3.0 * true_logits, sampled)
    assert 2.6 < temperature < 3.4
