import torch
from timm.layers import Attention
from torch import nn

from models.observed_variance import attention_with_mixture_variance, post_layernorm_variance


def _monte_carlo_hard_attention(attn: Attention, x: torch.Tensor, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample J_h ~ Cat(A_i^h) independently per head and push the chosen value through W_O."""
    batch, tokens, dim = x.shape
    heads, hd = attn.num_heads, attn.head_dim
    qkv = attn.qkv(x).reshape(batch, tokens, 3, heads, hd).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # [B, H, N, hd]
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)  # [B, H, N, N]
    picks = torch.multinomial(weights.reshape(-1, tokens), draws, replacement=True)  # [B*H*N, draws]
    picks = picks.view(batch, heads, tokens, draws)
    chosen = torch.gather(v.unsqueeze(3).expand(-1, -1, -1, draws, -1), 2,
                          picks.unsqueeze(-1).expand(-1, -1, -1, -1, hd))  # [B, H, N, draws, hd]
    concat = chosen.permute(0, 2, 3, 1, 4).reshape(batch, tokens, draws, heads * hd)  # [B, N, draws, H*hd]
    outputs = attn.proj(concat)  # [B, N, draws, D]
    return outputs.mean(2), outputs.var(2)


def test_mixture_variance_matches_monte_carlo_hard_attention() -> None:
    torch.manual_seed(0)
    attn = Attention(12, num_heads=3, qkv_bias=True).eval()
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        mean, variance = attention_with_mixture_variance(attn, x)
        torch.testing.assert_close(mean, attn(x), atol=1e-5, rtol=1e-5)  # the soft-attention output
        mc_mean, mc_var = _monte_carlo_hard_attention(attn, x, draws=200_000)
    torch.testing.assert_close(mc_mean, mean, atol=2e-2, rtol=0)
    torch.testing.assert_close(mc_var, variance, atol=2e-2, rtol=3e-2)


def _pairwise_deviation_variance(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """Reference: sum_h sum_j A_ij (u_j - m_i)^2 with the [B, N, N, D] deviation tensor, fp64."""
    batch, tokens, dim = x.shape
    heads, hd = attn.num_heads, attn.head_dim
    q, k, v = attn.qkv(x).reshape(batch, tokens, 3, heads, hd).permute(2, 0, 3, 1, 4).double().unbind(0)
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)  # [B, H, N, N]
    w_heads = attn.proj.weight.double().view(dim, heads, hd).permute(1, 2, 0)  # [H, hd, D]
    u = torch.einsum("bhnk,hkd->bhnd", v, w_heads)  # [B, H, N, D]
    mean = weights @ u  # [B, H, N, D]
    deviation = u[:, :, None, :, :] - mean[:, :, :, None, :]  # [B, H, N_i, N_j, D]
    return (weights[..., None] * deviation.square()).sum(dim=3).sum(dim=1).float()


def test_matches_the_pairwise_deviation_form() -> None:
    torch.manual_seed(0)
    attn = Attention(24, num_heads=4, qkv_bias=True).eval()
    x = torch.randn(3, 9, 24) * 3
    with torch.no_grad():
        attn.qkv.bias[48:] += 50.0  # values far from zero: where a naive one-pass form loses digits
        _, variance = attention_with_mixture_variance(attn, x)
        reference = _pairwise_deviation_variance(attn, x)
    torch.testing.assert_close(variance, reference, rtol=1e-5, atol=1e-7)


def test_variance_is_nonnegative_when_one_pass_cancels() -> None:
    """Large common offsets make E[u^2] - E[u]^2 cancel catastrophically; two passes stay exact."""
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2, qkv_bias=True).eval()
    with torch.no_grad():
        attn.qkv.bias[16:] += 1e4  # huge value offset: every token's u is ~1e4 plus a tiny spread
        _, variance = attention_with_mixture_variance(attn, torch.randn(1, 6, 8))
    assert bool((variance >= 0).all())
    assert float(variance.max()) < 10.0  # a one-pass formula gives O(1e4 * eps * 1e4) noise here


def test_padding_tokens_get_no_weight() -> None:
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2).eval()
    x = torch.randn(1, 6, 8)
    mask = torch.tensor([[True, True, True, True, False, False]])
    with torch.no_grad():
        mean, variance = attention_with_mixture_variance(attn, x, mask)
        ref_mean, ref_var = attention_with_mixture_variance(attn, x[:, :4])
    torch.testing.assert_close(mean[:, :4], ref_mean, atol=1e-5, rtol=0)
    torch.testing.assert_close(variance[:, :4], ref_var, atol=1e-5, rtol=0)


def test_post_layernorm_scaling() -> None:
    norm = nn.LayerNorm(4)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 3.0]))
    pre = torch.tensor([[[1.0, 3.0, -1.0, 5.0]]])
    variance = torch.ones(1, 1, 4)
    scaled = post_layernorm_variance(variance, pre, norm)
    expected = norm.weight.square() / (pre.var(-1, unbiased=False, keepdim=True) + norm.eps)
    torch.testing.assert_close(scaled, expected)
