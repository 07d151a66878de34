"""KEP-SVGP attention: the kernel SVD's identities, the SVGP pair's inducing covariances and KL, and the artifact
contract of the classifier that carries it (shapes, draws, seeds, scripting)."""

from __future__ import annotations

import torch
from torch.distributions import MultivariateNormal, kl_divergence
from torch.nn import functional as F

from models.backbones import ImageClassifier, VitConfig, build_vit
from models.kep_svgp import (
    KepSvgpAttention,
    KepSvgpClassifier,
    kernel_eigen_pairs,
    ksvd_objective,
    svgp_kl,
)
from tests.models.scripting import scripted

PIXELS = torch.rand(3, 1, 28, 28)


def feature_maps(n: int, m: int, p: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    phi_q = F.normalize(torch.randn(n, p, generator=gen, dtype=torch.float64), dim=-1)  # [N, p]
    phi_k = F.normalize(torch.randn(m, p, generator=gen, dtype=torch.float64), dim=-1)  # [M, p]
    return phi_q, phi_k


def test_kernel_eigen_pairs_solve_the_shifted_eigenvalue_problem_and_zero_the_primal_objective() -> None:
    phi_q, phi_k = feature_maps(9, 7, 5)
    kernel = phi_q @ phi_k.T  # [N, M], asymmetric
    h_e, h_r, lam = kernel_eigen_pairs(kernel, 3)
    assert h_e.shape == (9, 3) and h_r.shape == (7, 3) and lam.shape == (3,)
    torch.testing.assert_close(kernel @ h_r, h_e * lam)  # K H_r = H_e Lambda
    torch.testing.assert_close(kernel.T @ h_e, h_r * lam)  # K^T H_e = H_r Lambda
    w_e, w_r = phi_k.T @ h_r, phi_q.T @ h_e  # [p, s] the primal weights of the dual solution
    e, r = phi_q @ w_e, phi_k @ w_r  # [N, s], [M, s]
    torch.testing.assert_close(e, h_e * lam)  # e(X) = H_e Lambda
    torch.testing.assert_close(r, h_r * lam)  # r(X) = H_r Lambda
    assert abs(float(ksvd_objective(e, r, w_e, w_r, lam))) < 1e-10  # J = 0 at the stationary solution
    assert abs(float(ksvd_objective(e, r, 1.5 * w_e, w_r, lam))) > 1e-2


def test_the_svgp_pair_has_inducing_covariances_lambda_squared() -> None:
    """u_e = H_e^T f_e with f_e ~ GP(0, K K^T): K_uu = Lambda^2 and K_fu K_uu^-1 = H_e = e(X) Lambda^-1; for a kernel
    of rank s the Nystrom residual K K^T - K_fu K_uu^-1 K_uf the method drops is zero. The same for f_r, K^T K."""
    phi_q, phi_k = feature_maps(9, 9, 4, seed=1)
    kernel = phi_q @ phi_k.T  # rank 4
    h_e, h_r, lam = kernel_eigen_pairs(kernel, 4)
    for prior, h in ((kernel @ kernel.T, h_e), (kernel.T @ kernel, h_r)):
        k_uu = h.T @ prior @ h  # [s, s]
        k_fu = prior @ h  # [N, s]
        torch.testing.assert_close(k_uu, torch.diag(lam.square()))
        torch.testing.assert_close(k_fu @ torch.linalg.inv(k_uu), h)
        torch.testing.assert_close(k_fu @ torch.linalg.inv(k_uu) @ k_fu.T, prior)


def test_kl_matches_torch_distributions() -> None:
    gen = torch.Generator().manual_seed(2)
    heads, s, d = 2, 3, 4
    mean = torch.randn(heads, s, d, generator=gen, dtype=torch.float64)  # [H, s, d]
    tril = torch.tril(torch.randn(heads, d, s, s, generator=gen, dtype=torch.float64), diagonal=-1)
    tril = tril + torch.diag_embed(torch.rand(heads, d, s, generator=gen, dtype=torch.float64) + 0.2)  # [H, d, s, s]
    lam = torch.rand(heads, s, generator=gen, dtype=torch.float64) + 0.3  # [H, s]
    expected = sum(
        float(kl_divergence(MultivariateNormal(mean[h, :, j], scale_tril=tril[h, j]),
                            MultivariateNormal(torch.zeros(s, dtype=torch.float64), torch.diag(lam[h].square()))))
        for h in range(heads) for j in range(d))
    assert abs(float(svgp_kl(mean, tril, lam)) - expected) < 1e-9 * max(1.0, expected)
    attn = KepSvgpAttention(8, 2, 5, rank=3).double()
    with torch.no_grad():
        attn.log_lambda.copy_(lam[:, :3].log())
        attn.scale_lower.normal_()
    with torch.no_grad():
        both, attn_kl = attn.scale_tril(), float(attn.kl())
    expected_attn = sum(
        float(kl_divergence(MultivariateNormal(attn.mean_u[z, h, :, j].detach(), scale_tril=both[z, h, j]),
                            MultivariateNormal(torch.zeros(3, dtype=torch.float64), torch.diag(lam[h].square()))))
        for z in range(2) for h in range(2) for j in range(3))
    assert abs(attn_kl - expected_attn) < 1e-9 * expected_attn


def test_samples_follow_the_posterior_of_the_projection_scores() -> None:
    """Over many rows of the same input, the GP outputs' mean and covariance are H m and H S H^T (summed pair)."""
    torch.manual_seed(3)
    attn = KepSvgpAttention(8, 2, 5, rank=2, rank_multi=1).double()
    with torch.no_grad():  # read the GP outputs: output map and projection are the identity on the first 2 channels
        attn.out.weight.copy_(torch.eye(4, 2, dtype=torch.float64))
        attn.out.bias.zero_()
        attn.proj.weight.copy_(torch.eye(8, dtype=torch.float64))
        attn.proj.bias.zero_()
        attn.log_scale.fill_(-1.0)
        attn.scale_lower.normal_(std=0.3)
    attn.requires_grad_(False)
    x = torch.randn(1, 5, 8, dtype=torch.float64).expand(40000, -1, -1)  # [R, N, D]
    out = attn(x)[:, 2, :2]  # [R, d] head 0, token 2
    qk = attn.qk(x[:1]).view(1, 5, 2, 2, 4).permute(2, 0, 3, 1, 4)
    q, k = F.normalize(qk[0], dim=-1)[0, 0, 2], F.normalize(qk[1], dim=-1)[0, 0, 2]  # [hd]
    chosen = x[0, attn.token_index].view(-1, 2, 4)[:, 0]  # [p, hd]
    lam = attn.lambdas()[0]
    a_e, a_r = q @ (chosen.T @ attn.w_e[0]) / lam, k @ (chosen.T @ attn.w_r[0]) / lam  # [s]
    tril = attn.scale_tril()[:, 0]  # [2, d, s, s]
    mean = a_e @ attn.mean_u[0, 0] + a_r @ attn.mean_u[1, 0]  # [d]
    var = torch.stack([(a_e @ tril[0, j]).square().sum() + (a_r @ tril[1, j]).square().sum() for j in range(2)])
    torch.testing.assert_close(out.mean(0), mean, atol=4 * float(var.max().sqrt()) / 200, rtol=0)
    torch.testing.assert_close(out.var(0), var, rtol=0.05, atol=0)


def tiny_classifier() -> ImageClassifier:
    torch.manual_seed(0)
    cfg = VitConfig(stem_channels=[8, 16], embed_dim=16, depth=2, num_heads=2)
    return build_vit(cfg).eval()


def test_classifier_meets_the_artifact_contract_eager_and_scripted() -> None:
    backbone = tiny_classifier()
    model = KepSvgpClassifier(backbone, layers=1, rank=3, rank_multi=2).eval()
    assert model.replaced == [1]
    assert torch.equal(model.start(PIXELS), backbone.vit.blocks[0](backbone.vit.patch_embed(
        backbone.normalize(PIXELS)) + backbone.vit.pos_embed))  # the kept layer is the backbone's
    for candidate in (model, scripted(model).eval()):
        out = candidate(PIXELS, 4)  # [S, B, C]
        assert out.shape == (4, 3, 10) and bool(torch.isfinite(out).all())
        assert not torch.allclose(out[0], out[1])
        rows = candidate.sample_rows(PIXELS, torch.tensor([2, 1, 3]))
        assert rows.shape == (6, 10)
        torch.manual_seed(7)
        first = candidate.sample_rows(PIXELS, torch.tensor([2, 1, 3]))
        torch.manual_seed(7)
        assert torch.equal(first, candidate.sample_rows(PIXELS, torch.tensor([2, 1, 3])))
    torch.manual_seed(5)
    eager = model(PIXELS, 2)
    torch.manual_seed(5)
    torch.testing.assert_close(scripted(model)(PIXELS, 2), eager)


def test_the_elbo_terms_train_the_replaced_layers_only() -> None:
    backbone = tiny_classifier()
    model = KepSvgpClassifier(backbone, layers=2, rank=3).train()
    assert model.replaced == [0, 1] and len(model.prefix) == 0
    logits, ksvd = model.forward_terms(PIXELS)  # [B, C], []
    loss = F.cross_entropy(logits, torch.tensor([0, 1, 2])) + 0.1 * model.kl() + ksvd
    loss.backward()
    attn = model.blocks[0].attn
    assert logits.shape == (3, 10) and float(ksvd.detach()) >= 0 and float(model.kl().detach()) > 0
    for grad in (attn.mean_u.grad, attn.log_lambda.grad, attn.w_e.grad, attn.qk.weight.grad):
        assert grad is not None and bool(torch.isfinite(grad).all())
    assert all(p.grad is None for p in backbone.parameters())  # the backbone it was built from is untouched
