"""KEP-SVGP attention: self-attention read as a pair of sparse variational Gaussian processes built on the kernel SVD
of its asymmetric attention kernel (Chen, Tao, Tonin and Suykens, "Self-Attention through Kernel-Eigen Pair Sparse
Variational Gaussian Processes"; docs/method.md, "Baselines: KEP-SVGP").

The equations, per head, with N tokens and s eigen-pairs:

- Attention kernel: ``K_ij = <phi_q(x_i), phi_k(x_j)>`` with ``phi_q``, ``phi_k`` the L2-normalised queries and keys;
  K is asymmetric (``phi_q != phi_k``).
- KSVD (dual): the top-s singular triplets ``K H_r = H_e Lambda`` and ``K^T H_e = H_r Lambda``; primal: the
  projection scores ``e(x) = W_e^T phi_q(x)`` and ``r(x) = W_r^T phi_k(x)`` with ``W_e = Phi_k^T H_r`` and
  ``W_r = Phi_q^T H_e``, so ``e(X) = H_e Lambda`` and ``r(X) = H_r Lambda``. The primal objective
  ``J = 1/2 sum_i e_i^T Lambda^-1 e_i + 1/2 sum_j r_j^T Lambda^-1 r_j - Tr(W_e^T W_r)`` is zero at that solution, so
  training drives ``J^2`` to zero (the KSVD loss) with data-dependent ``W_e``, ``W_r`` (the input's tokens
  combined by learned weights) and a learned diagonal ``Lambda``.
- Two SVGPs: ``f_e`` with kernel ``K K^T`` and ``f_r`` with kernel ``K^T K``, inducing variables the projections on
  the left / right singular vectors. Then ``K_uu = Lambda^2`` and ``K_fu K_uu^-1 = H_e = e(X) Lambda^-1`` (and
  ``H_r = r(X) Lambda^-1``), so with ``q(u) = N(m, S)``, ``S = L L^T``, per output dimension, the posterior is
  ``q(F) = N(H m, H S H^T)`` (the rank-s residual of the prior is dropped, as the method does). The two outputs are
  summed: ``F = H_e u_e + H_r u_r``, sampled by the reparameterisation trick ``u = m + L eps`` once per sample row
  (one draw of the function for all tokens of an input).
- ELBO: ``E_q[log p(y | F)] - KL(q(u_e) || p(u_e)) - KL(q(u_r) || p(u_r))`` with ``p(u) = N(0, Lambda^2)``.
"""

from __future__ import annotations

import copy

import torch
from timm.models.vision_transformer import Attention, Block, VisionTransformer
from torch import nn
from torch.nn import functional as F

from models.backbones import ImageClassifier
from models.vit_view import VitEmbedding


def kernel_eigen_pairs(kernel: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dual KSVD of an asymmetric kernel [..., N, M]: (H_e [..., N, s], H_r [..., M, s], Lambda [..., s]), the top
    s singular triplets, which solve the shifted eigenvalue problem ``K H_r = H_e Lambda``, ``K^T H_e = H_r Lambda``."""
    left, values, right_t = torch.linalg.svd(kernel, full_matrices=False)
    return left[..., :rank], right_t[..., :rank, :].transpose(-2, -1), values[..., :rank]


def ksvd_objective(e: torch.Tensor, r: torch.Tensor, w_e: torch.Tensor, w_r: torch.Tensor, lam: torch.Tensor
                   ) -> torch.Tensor:
    """The primal KSVD objective per kernel, ``J = 1/2 sum_i e_i^T Lambda^-1 e_i + 1/2 sum_j r_j^T Lambda^-1 r_j
    - Tr(W_e^T W_r)``: e [..., N, s], r [..., M, s], W_e, W_r [..., p, s], Lambda [..., s] -> J [...]. Zero at the
    KSVD's stationary solution."""
    inv = 1.0 / lam.unsqueeze(-2)  # [..., 1, s]
    energy = 0.5 * (e.square() * inv).sum((-2, -1)) + 0.5 * (r.square() * inv).sum((-2, -1))  # [...]
    return energy - (w_e * w_r).sum((-2, -1))  # [...]


def svgp_kl(mean: torch.Tensor, scale_tril: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``sum_d KL(N(m_d, L_d L_d^T) || N(0, Lambda^2))`` in closed form,
    ``1/2 [Tr(Lambda^-2 S) + m^T Lambda^-2 m - s + log|Lambda^2| - log|S|]`` per output dimension d:
    mean [..., s, d], scale_tril [..., d, s, s] (lower triangular, positive diagonal), Lambda [..., s] -> scalar."""
    s = lam.shape[-1]
    inv = 1.0 / lam  # [..., s]
    trace = (scale_tril * inv[..., None, :, None]).square().sum((-3, -2, -1))  # [...] ||Lambda^-1 L_d||_F^2 over d
    maha = (mean * inv.unsqueeze(-1)).square().sum((-2, -1))  # [...]
    d = mean.shape[-1]
    log_det_prior = d * 2.0 * lam.log().sum(-1)  # [...]
    log_det_post = 2.0 * torch.diagonal(scale_tril, dim1=-2, dim2=-1).log().sum((-2, -1))  # [...]
    return (0.5 * (trace + maha - d * s + log_det_prior - log_det_post)).sum()


class KepSvgpAttention(nn.Module):
    """Multi-head KEP-SVGP attention [B, N, D] -> [B, N, D]; a fresh draw of both SVGPs per row of the batch.

    ``rank`` s eigen-pairs per head; ``W_e`` and ``W_r`` combine ``min(N, rank * rank_multi)`` evenly spaced input
    tokens (per head's channels) with learned weights; the sampled GP outputs (s per head) go through a linear map to
    the head's width, then the output projection. Values are not used: the GP outputs replace them."""

    def __init__(self, dim: int, num_heads: int, num_tokens: int, rank: int = 10, rank_multi: int = 10,
                 qk_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim, self.rank = num_heads, dim // num_heads, rank
        self.qk = nn.Linear(dim, 2 * dim, bias=qk_bias)
        chosen = min(num_tokens, rank * rank_multi)
        self.register_buffer("token_index", torch.linspace(0, num_tokens - 1, chosen).round().long())  # [p]
        self.w_e = nn.Parameter(torch.empty(num_heads, chosen, rank))  # [H, p, s]
        self.w_r = nn.Parameter(torch.empty(num_heads, chosen, rank))  # [H, p, s]
        self.log_lambda = nn.Parameter(torch.zeros(num_heads, rank))  # [H, s]
        self.mean_u = nn.Parameter(torch.empty(2, num_heads, rank, rank))  # [2 (e, r), H, s, d]
        self.log_scale = nn.Parameter(torch.empty(2, num_heads, rank, rank))  # [2, H, d, s] log diag of L_d
        self.scale_lower = nn.Parameter(torch.zeros(2, num_heads, rank, rank, rank))  # [2, H, d, s, s]
        self.out = nn.Linear(rank, self.head_dim)
        self.proj = nn.Linear(dim, dim)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        for w in (self.w_e, self.w_r):
            for h in range(self.num_heads):
                nn.init.orthogonal_(w.data[h])
        nn.init.normal_(self.mean_u, std=self.rank ** -0.5)
        nn.init.constant_(self.log_scale, -2.0)  # start with a small posterior spread; the KL widens it

    @classmethod
    def from_timm(cls, attn: Attention, num_tokens: int, rank: int, rank_multi: int) -> KepSvgpAttention:
        """A KEP-SVGP attention whose queries, keys and output projection start from a timm ``Attention``'s."""
        dim = attn.qkv.in_features
        module = cls(dim, attn.num_heads, num_tokens, rank, rank_multi, qk_bias=attn.qkv.bias is not None)
        with torch.no_grad():
            module.qk.weight.copy_(attn.qkv.weight[: 2 * dim])
            if attn.qkv.bias is not None:
                module.qk.bias.copy_(attn.qkv.bias[: 2 * dim])
            module.proj.load_state_dict(attn.proj.state_dict())
        return module

    def lambdas(self) -> torch.Tensor:
        return self.log_lambda.exp()  # [H, s]

    def scale_tril(self) -> torch.Tensor:
        return torch.diag_embed(self.log_scale.exp()) + torch.tril(self.scale_lower, diagonal=-1)  # [2, H, d, s, s]

    def kl(self) -> torch.Tensor:
        """KL(q(u_e) || p(u_e)) + KL(q(u_r) || p(u_r)), summed over heads and output dimensions."""
        return svgp_kl(self.mean_u, self.scale_tril(), self.lambdas().unsqueeze(0).expand(2, -1, -1))

    def forward_terms(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, N, D] -> (sampled output [B, N, D], KSVD loss: the mean over rows and heads of (J / N)^2).

        With ``key_padding_mask`` [B, N] (True on real tokens, right-padded texts) the kernel is the real tokens'
        alone: padded queries and keys are zero (their rows and columns of K vanish), ``W_e``, ``W_r`` combine tokens
        evenly spaced over each text's own length, and N is the text's length."""
        b, n, dim = x.shape
        qk = self.qk(x).view(b, n, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [2, B, H, N, hd]
        q, k = F.normalize(qk[0], dim=-1), F.normalize(qk[1], dim=-1)  # [B, H, N, hd] phi_q, phi_k
        if key_padding_mask is None:
            chosen = x.index_select(1, self.token_index)  # [B, p, D]
            lengths = torch.full((b, 1), float(n), dtype=x.dtype, device=x.device)  # [B, 1]
        else:
            real = key_padding_mask[:, None, :, None].to(x.dtype)  # [B, 1, N, 1]
            q, k = q * real, k * real  # [B, H, N, hd]
            lengths = key_padding_mask.sum(1, keepdim=True).to(x.dtype)  # [B, 1]
            spread = torch.linspace(0, 1, self.token_index.shape[0], device=x.device, dtype=x.dtype)  # [p]
            index = (spread[None] * (lengths - 1)).round().long()  # [B, p] within each text
            chosen = x.gather(1, index[..., None].expand(-1, -1, dim))  # [B, p, D]
        chosen = chosen.view(b, -1, self.num_heads, self.head_dim)  # [B, p, H, hd]
        w_e = torch.einsum("bphd,hps->bhds", chosen, self.w_e)  # [B, H, hd, s]
        w_r = torch.einsum("bphd,hps->bhds", chosen, self.w_r)  # [B, H, hd, s]
        e, r = q @ w_e, k @ w_r  # [B, H, N, s] projection scores (zero on padded tokens)
        lam = self.lambdas()  # [H, s]
        ksvd = (ksvd_objective(e, r, w_e, w_r, lam) / lengths).square().mean()
        eps = torch.randn(2, b, self.num_heads, self.rank, self.rank, dtype=x.dtype, device=x.device)  # [2, B, H, d, s]
        noise = torch.einsum("zhdij,zbhdj->zbhid", self.scale_tril(), eps)  # [2, B, H, s, d] L_d eps_d
        u = self.mean_u.unsqueeze(1) + noise  # [2, B, H, s, d] one draw of u_e, u_r per row
        f = (e / lam[:, None, :]) @ u[0] + (r / lam[:, None, :]) @ u[1]  # [B, H, N, d] H_e u_e + H_r u_r
        out = self.out(f).transpose(1, 2).reshape(b, n, dim)  # [B, N, D]
        return self.proj(out), ksvd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_terms(x)[0]  # [B, N, D]


class KepSvgpBlock(nn.Module):
    """A timm pre-LN block with KEP-SVGP attention: ``a = x + ls1(attn(norm1(x)))``, ``h = a + ls2(mlp(norm2(a)))``
    (stochastic depth off: the block is fine-tuned, not trained from scratch)."""

    def __init__(self, block: Block, attention: KepSvgpAttention) -> None:
        super().__init__()
        self.norm1, self.attn, self.ls1 = block.norm1, attention, block.ls1
        self.norm2, self.mlp, self.ls2 = block.norm2, block.mlp, block.ls2

    def forward_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, ksvd = self.attn.forward_terms(self.norm1(x))  # [B, N, D], []
        x = x + self.ls1(out)  # [B, N, D]
        return x + self.ls2(self.mlp(self.norm2(x))), ksvd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_terms(x)[0]  # [B, N, D]


class KepSvgpClassifier(nn.Module):
    """A ViT classifier whose last ``layers`` blocks have KEP-SVGP attention, behind the artifact contract:
    ``forward(pixels, n_samples) -> [S, B, C]`` and ``sample_rows(pixels, repeats) -> [sum(repeats), C]``. The
    embedding and the first T - L blocks are deterministic: they run once per input, the replaced blocks and the
    head once per sample row (as DIRECTOR's partial depth does)."""

    def __init__(self, backbone: ImageClassifier, layers: int = 1, rank: int = 10, rank_multi: int = 10) -> None:
        super().__init__()
        backbone = copy.deepcopy(backbone)
        vit: VisionTransformer = backbone.vit
        depth = len(vit.blocks)
        if not 1 <= layers <= depth:
            raise ValueError(f"KEP-SVGP replaces 1..{depth} layers, got {layers}")
        if vit.global_pool not in ("avg", "token") or vit.attn_pool is not None:
            raise ValueError(f"unsupported pooling {vit.global_pool!r}")
        self.embedding = VitEmbedding(backbone)
        num_tokens = int(vit.pos_embed.shape[1]) + (0 if self.embedding.embed_prefix else vit.num_prefix_tokens)
        self.prefix = nn.ModuleList(vit.blocks[: depth - layers])
        self.blocks = nn.ModuleList(
            KepSvgpBlock(block, KepSvgpAttention.from_timm(block.attn, num_tokens, rank, rank_multi))
            for block in vit.blocks[depth - layers :])
        self.replaced = list(range(depth - layers, depth))  # 0-based indices of the replaced layers
        self.num_layers = depth
        self.norm, self.fc_norm, self.head = vit.norm, vit.fc_norm, vit.head
        self.pool_avg = vit.global_pool == "avg"
        self.num_prefix_tokens = vit.num_prefix_tokens

    def frozen_parts(self) -> list[nn.Module]:
        """What fine-tuning leaves as it is unless told otherwise: the embedding and the blocks before."""
        return [self.embedding, self.prefix]

    def start(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels in [0, 1] [B, C, H, W] -> the input of the first replaced block [B, N, D] (deterministic)."""
        x = self.embedding(pixels)  # [B, N, D]
        for block in self.prefix:
            x = block(x)  # [B, N, D]
        return x

    def finish(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The replaced blocks and the head on rows [R, N, D] -> (logits [R, C], summed KSVD loss)."""
        ksvd = torch.zeros((), device=x.device)
        for block in self.blocks:
            x, loss = block.forward_terms(x)  # [R, N, D], []
            ksvd = ksvd + loss
        x = self.norm(x)  # [R, N, D]
        x = x[:, self.num_prefix_tokens :].mean(dim=1) if self.pool_avg else x[:, 0]  # [R, D]
        return self.head(self.fc_norm(x)), ksvd  # [R, C]

    def forward_terms(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One sampled logit row per input (training): (logits [B, C], KSVD loss)."""
        return self.finish(self.start(pixels))

    def kl(self) -> torch.Tensor:
        """The ELBO's KL term: both SVGPs' KL summed over the replaced layers."""
        return torch.stack([block.attn.kl() for block in self.blocks]).sum()

    @torch.jit.export
    def sample_rows(self, pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        x = self.start(pixels)  # [B, N, D]
        rows = torch.repeat_interleave(x, repeats, dim=0, output_size=int(repeats.sum()))  # [R, N, D]
        return self.finish(rows)[0]  # [R, C]

    def forward(self, pixels: torch.Tensor, n_samples: int) -> torch.Tensor:
        batch = pixels.shape[0]
        repeats = torch.full((batch,), n_samples, dtype=torch.long, device=pixels.device)
        return self.sample_rows(pixels, repeats).view(batch, n_samples, -1).transpose(0, 1)  # [S, B, C]
