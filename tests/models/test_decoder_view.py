"""The Qwen2 / Llama decoder view and its artifact: chained transitions reproduce the transformers classifier (loaded
from a saved folder, eager attention) on right-padded batches, the prefix and teacher steps equal the transitions,
the causal GQA mixture variance is exact, the decoder director scripts and follows the contract, and what the plain
layers cannot reproduce is refused."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

from models.decoder_director import decoder_backbone_from_view, decoder_director_from_view
from models.decoder_layers import DecoderEmbedding
from models.decoder_view import DecoderTransitionView
from models.kernel import TransitionKernel
from models.text_director import TextDirector, fold_for_artifact

VOCAB = 100
FAMILIES = [
    pytest.param("qwen2", {}, id="qwen2-gqa"),
    pytest.param("llama", {"attention_bias": False}, id="llama-gqa"),
    pytest.param("llama", {"attention_bias": False, "num_key_value_heads": 4}, id="llama-mha"),
    pytest.param("llama", {"attention_bias": True, "mlp_bias": True}, id="llama-biases"),
    pytest.param("llama", {"attention_bias": False, "head_dim": 16, "rope_theta": 500.0}, id="llama-wide-heads"),
]

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(family: str, **overrides: Any) -> Qwen2Config | LlamaConfig:
    args: dict[str, Any] = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                            "num_labels": 3, "pad_token_id": 0}
    args.update(overrides)
    return Qwen2Config(**args) if family == "qwen2" else LlamaConfig(**args)


def _lively(model: nn.Module, seed: int) -> nn.Module:
    """Re-draw every weight at a scale where attention is far from uniform and the variance is O(0.1-1) (the
    transformers initialisation, std 0.02, leaves a tiny random model with almost no mixture variance)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 1.5 / param.shape[1] ** 0.5)
    return model.eval()


def _model(tmp_path: Path, family: str = "qwen2", seed: int = 0, **overrides: Any) -> nn.Module:
    """A tiny random classifier, saved with ``save_pretrained`` and loaded back from the folder (eager attention)."""
    torch.manual_seed(seed)
    cls = Qwen2ForSequenceClassification if family == "qwen2" else LlamaForSequenceClassification
    _lively(cls(_config(family, **overrides)), seed).save_pretrained(tmp_path / family)
    return cls.from_pretrained(tmp_path / family, attn_implementation="eager").eval()


def _padded_batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (real tokens >= 1, pad id 0 at the end) and attention_mask [B, L]."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=gen)  # [B, L]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # [B, L]
    return ids * mask, mask


def _rollout(view: DecoderTransitionView, ids: torch.Tensor, mask: torch.Tensor
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(X_t, var_t) for t = 0..T] along the backbone's own trajectory (X_0 with a zero variance)."""
    x = view.embed(ids, mask)
    states = [(x, torch.zeros_like(x))]
    for t in range(1, view.num_steps + 1):
        states.append(view.transition(t, states[-1][0], mask.bool()))
    return states


@pytest.mark.parametrize(("family", "overrides"), FAMILIES)
def test_chained_transitions_reproduce_the_classifier(tmp_path: Path, family: str, overrides: dict) -> None:
    model = _model(tmp_path, family, **overrides)
    view = DecoderTransitionView(model)
    ids, mask = _padded_batch([9, 4, 1, 7], seed=1)
    real = mask.bool()
    captured: list[torch.Tensor] = []  # a_l: the input of layer l's post-attention norm
    hooks = [layer.post_attention_layernorm.register_forward_hook(lambda m, i, o: captured.append(i[0]))
             for layer in model.model.layers]
    with torch.no_grad():
        expected_logits = model(input_ids=ids, attention_mask=mask).logits  # [B, C]
        expected_hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, D]
        for hook in hooks:
            hook.remove()
        states = _rollout(view, ids, mask)
        logits = view.readout(states[-1][0], real)
        final = view.final_hidden(states[-1][0])
    assert view.num_steps == 3 and view.dim == 32 and view.num_heads == 4
    assert float((logits - expected_logits).abs().max()) <= 1e-4
    assert float((final - expected_hidden)[real].abs().max()) <= 1e-4
    for (x, variance), a in zip(states[1:], captured[:3], strict=True):  # X_t = a_t at every t
        assert float((x - a)[real].abs().max()) <= 1e-4
        assert variance.shape == x.shape
        assert bool((variance >= 0).all()) and bool(torch.isfinite(variance).all())
    assert float(states[1][1][real].mean()) > 1e-3  # the lively model has a real spread


def test_a_half_precision_checkpoint_is_computed_in_float32(tmp_path: Path) -> None:
    """A checkpoint loaded in bfloat16: the view's copies are float32 and answer as the float32 model with the same
    (bf16-rounded) weights."""
    reference = _model(tmp_path, "qwen2", seed=2)
    with torch.no_grad():
        for param in reference.parameters():
            param.copy_(param.bfloat16().float())
    half = Qwen2ForSequenceClassification.from_pretrained(tmp_path / "qwen2", attn_implementation="eager",
                                                          dtype=torch.bfloat16).eval()
    assert half.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    view = DecoderTransitionView(half)
    ids, mask = _padded_batch([6, 3], seed=2)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits  # [B, C]
        logits = view.readout(_rollout(view, ids, mask)[-1][0], mask.bool())
    assert all(p.dtype == torch.float32 for p in view.parameters())
    assert float((logits - expected).abs().max()) <= 1e-4


def test_padding_changes_nothing_for_real_tokens(tmp_path: Path) -> None:
    view = DecoderTransitionView(_model(tmp_path, "qwen2", seed=3))
    ids, mask = _padded_batch([4, 10], seed=3)
    with torch.no_grad():
        alone = _rollout(view, ids[:1, :4], mask[:1, :4])
        padded = _rollout(view, ids, mask)
        logits_alone = view.readout(alone[-1][0], mask[:1, :4].bool())
        logits_padded = view.readout(padded[-1][0], mask.bool())
    for (x_a, var_a), (x_p, var_p) in zip(alone, padded, strict=True):
        torch.testing.assert_close(x_p[:1, :4], x_a, atol=1e-5, rtol=0)
        torch.testing.assert_close(var_p[:1, :4], var_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits_padded[:1], logits_alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_transitions", [0, 1, 2, 3])
def test_prefix_equals_the_first_transitions(tmp_path: Path, num_transitions: int) -> None:
    """Partial depth: the plain-module prefix reproduces X_P of the chained transitions on padded texts, scripted."""
    view = DecoderTransitionView(_model(tmp_path, "llama", seed=4, attention_bias=False))
    ids, mask = _padded_batch([5, 9, 2], seed=4)
    real = mask.bool()
    prefix = view.prefix(num_transitions)
    scripted = torch.jit.script(prefix)
    with torch.no_grad():
        expected = _rollout(view, ids, mask)[num_transitions][0]  # [B, L, D]
        x0 = view.embed(ids, mask)
        scale = max(1.0, float(expected[real].abs().max()))  # float32 rounding grows with the states' size
        for module in (prefix, scripted):
            assert float((module(x0, real) - expected)[real].abs().max()) <= 1e-5 * scale
    assert prefix.num_transitions == num_transitions
    with pytest.raises(ValueError, match="0..3"):
        view.prefix(4)


@pytest.mark.parametrize("depth", [1, 3])
def test_teacher_steps_equal_the_transitions(tmp_path: Path, depth: int) -> None:
    view = DecoderTransitionView(_model(tmp_path, "qwen2", seed=5))
    ids, mask = _padded_batch([6, 3, 8], seed=5)
    real = mask.bool()
    steps = view.teacher_steps(depth)
    assert len(steps) == depth
    with torch.no_grad():
        states = _rollout(view, ids, mask)
        for offset, step in enumerate(steps):
            t = view.num_steps - depth + 1 + offset
            for module in (step, torch.jit.script(step)):
                assert float((module(states[t - 1][0], real) - states[t][0])[real].abs().max()) <= 1e-5


def _brute_force_variance(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w_out: torch.Tensor, scale: float,
                          real: torch.Tensor) -> torch.Tensor:
    """sum_h sum_j A_ij (u_j - m_i)^2 with u_j = v_j W_O^h, pairwise in fp64, causal over real keys: [B, N, D]."""
    q, k, v, w_out = q.double(), k.double(), v.double(), w_out.double()
    batch, heads, tokens, head_dim = v.shape
    allowed = torch.ones(tokens, tokens, dtype=torch.bool).tril()[None, None] & real[:, None, None, :]  # [B,1,N,N]
    weights = ((q @ k.transpose(-2, -1)) * scale).masked_fill(~allowed, float("-inf")).softmax(-1)  # [B, H, N, N]
    w_heads = w_out.view(w_out.shape[0], heads, head_dim).permute(1, 2, 0)  # [H, hd, D]
    u = torch.einsum("bhnk,hkd->bhnd", v, w_heads)  # [B, H, N, D]
    means = weights @ u  # [B, H, N, D]
    deviations = (u[:, :, None, :, :] - means[:, :, :, None, :]).square()  # [B, H, N_i, N_j, D]
    return (weights[..., None] * deviations).sum(dim=3).sum(dim=1)  # [B, N, D]


def test_variance_is_exact_and_zero_where_a_token_sees_only_itself(tmp_path: Path) -> None:
    view = DecoderTransitionView(_model(tmp_path, "qwen2", seed=6))
    ids, mask = _padded_batch([5, 3], seed=6)
    real = mask.bool()
    with torch.no_grad():
        x1 = view.transition(1, view.embed(ids, mask), real)[0]
        h1 = view.mlp_sublayers[0](x1)  # [B, L, D] the input of transition 2's attention sublayer
        sublayer = view.attention_sublayers[1]
        q, k, v = sublayer.attn.project(sublayer.norm(h1))  # [B, H, L, hd], k/v repeated (2 -> 4 heads)
        expected = _brute_force_variance(q, k, v, sublayer.attn.o_proj.weight, sublayer.attn.scaling, real)
        _, variance = view.transition(2, x1, real)
    assert q.shape == k.shape == v.shape == (2, 4, 5, 8)
    assert bool((variance >= 0).all())
    assert bool((variance[:, 0] == 0).all())  # the first token attends only to itself under the causal mask
    assert float(variance[real][1:].mean()) > 1e-3
    torch.testing.assert_close(variance.double()[real], expected[real], atol=1e-5, rtol=1e-5)


def test_causal_kernel_ignores_later_tokens() -> None:
    """A causal kernel's token i depends on tokens j <= i only; the default kernel stays bidirectional."""
    torch.manual_seed(7)
    x = torch.randn(2, 6, 16)  # [R, N, D]
    later = x.clone()
    later[:, 4:] = torch.randn(2, 2, 16)
    mask = torch.ones(2, 6, dtype=torch.bool)
    steps = torch.tensor([1, 2])
    for causal in (True, False):
        torch.manual_seed(8)
        kernel = TransitionKernel(16, 2, 2, causal=causal).eval()
        with torch.no_grad():
            kernel.adaLN_modulation[-1].weight.normal_(std=0.3)
            kernel.mean_head.weight.normal_(std=0.3)
            moved = (kernel(x, steps, mask)[0] - kernel(later, steps, mask)[0])[:, :4].abs().max()
            moved_no_mask = (kernel(x, steps)[0] - kernel(later, steps)[0])[:, :4].abs().max()
        assert (float(moved) == 0.0) == causal and (float(moved_no_mask) == 0.0) == causal
    assert torch.jit.script(TransitionKernel(16, 2, 2, causal=True)).causal


def _director(tmp_path: Path, family: str = "qwen2", seed: int = 0, steps: int = 2) -> TextDirector:
    """A lively tiny decoder with a kernel whose mean map is not the identity, its teacher attached, noise off."""
    view = DecoderTransitionView(_model(tmp_path, family, seed=seed))
    torch.manual_seed(seed)
    kernel = TransitionKernel(view.dim, view.num_heads, steps, logvar_init=math.log(0.05), causal=True)
    with torch.no_grad():
        kernel.adaLN_modulation[-1].weight.normal_(std=0.1)
        kernel.mean_head.weight.normal_(std=0.1)
    director = decoder_director_from_view(view, kernel).eval().requires_grad_(False)
    director.rollout.set_teacher(view.teacher_steps(steps))
    director.rollout.noise_scale.fill_(0.0)
    return director


def test_director_scripts_and_follows_the_contract(tmp_path: Path) -> None:
    director = _director(tmp_path, seed=9)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(fold_for_artifact(director)), buffer)
    buffer.seek(0)
    served = torch.jit.load(buffer)  # the artifact as saved and loaded
    ids, mask = _padded_batch([5, 8, 3], seed=9)
    repeats = torch.tensor([2, 1, 3])
    with torch.no_grad():
        logits, served_logits = director(ids, mask, 4), served(ids, mask, 4)
        rows, served_rows = director.sample_rows(ids, mask, repeats), served.sample_rows(ids, mask, repeats)
        (scored, error), (served_scored, served_error) = (director.scored_rows(ids, mask, repeats),
                                                          served.scored_rows(ids, mask, repeats))
        director.rollout.noise_scale.fill_(1.0)
        served.rollout.noise_scale.fill_(1.0)
        torch.manual_seed(3)
        noisy = director(ids, mask, 4)
        torch.manual_seed(3)
        served_noisy = served(ids, mask, 4)
    assert logits.shape == (4, 3, 3) and rows.shape == (6, 3) and error.shape == (3, 1)  # the kernel error alone
    for mine, theirs in ((logits, served_logits), (rows, served_rows), (scored, served_scored),
                         (error, served_error), (noisy, served_noisy)):
        torch.testing.assert_close(theirs, mine, atol=1e-5, rtol=0)
    expected = torch.cat([logits[0, 0].expand(2, -1), logits[0, 1:2], logits[0, 2].expand(3, -1)])  # grouped by input
    torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(scored, rows, atol=1e-5, rtol=0)
    assert bool((error > 0).all())  # the kernel is not the backbone's transition
    assert not torch.allclose(noisy[0], noisy[1])  # independent samples with noise on
    assert float((logits[0, 1] - logits[0, 0]).abs().max()) > 1e-3  # the texts do get different answers


def test_director_padding_changes_nothing_without_noise(tmp_path: Path) -> None:
    served = torch.jit.script(fold_for_artifact(_director(tmp_path, "llama", seed=10)))
    ids, mask = _padded_batch([4, 11, 7], seed=10)
    with torch.no_grad():
        alone = served(ids[:1, :4], mask[:1, :4], 2)  # [2, 1, C]
        padded = served(ids, mask, 2)  # [2, 3, C]
    torch.testing.assert_close(padded[:, :1], alone, atol=1e-5, rtol=0)


def test_folded_storage_dtypes_stay_close(tmp_path: Path) -> None:
    """An int8 table and float16 layers script and stay near the float32 artifact (tiny lively model: loose)."""
    director = _director(tmp_path, seed=11)
    ids, mask = _padded_batch([6, 4], seed=11)
    with torch.no_grad():
        reference = director(ids, mask, 1)
        small = torch.jit.script(fold_for_artifact(director, table_dtype="int8", layer_dtype="float16"))
        approx = small(ids, mask, 1)
    assert small.embedding.word_table.dtype == torch.int8
    assert float((approx - reference).abs().max()) < 0.1
    with pytest.raises(ValueError, match="layer_dtype"):
        fold_for_artifact(director, layer_dtype="bfloat16")
    with pytest.raises(ValueError, match="int8"):
        fold_for_artifact(fold_for_artifact(director, table_dtype="int8"), table_dtype="float16")
    long_ids, long_mask = _padded_batch([9, 4], seed=11)
    rotary = torch.jit.script(fold_for_artifact(director, max_positions=4))  # no position table to cut
    assert rotary(long_ids, long_mask, 1).shape == (1, 2, 3)


@pytest.mark.parametrize("steps", [1, 3])
def test_fresh_kernel_director_is_the_backbone_cut_at_the_prefix(tmp_path: Path, steps: int) -> None:
    """A fresh kernel (identity mean map, adaLN zero) with noise off leaves X_{T-K} as it is: the director answers
    the backbone's readout of its state after the prefix (the backbone itself when the prefix were whole); the
    deterministic baseline, all T transitions then the readout, is the classifier."""
    model = _model(tmp_path, "qwen2", seed=12)
    view = DecoderTransitionView(model)
    director = decoder_director_from_view(view, TransitionKernel(view.dim, view.num_heads, steps, causal=True)).eval()
    director.rollout.noise_scale.fill_(0.0)
    served = torch.jit.script(fold_for_artifact(director))
    backbone = torch.jit.script(decoder_backbone_from_view(view))
    ids, mask = _padded_batch([7, 2, 5], seed=12)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits  # [B, C]
        cut = view.readout(_rollout(view, ids, mask)[view.num_steps - steps][0], mask.bool())  # [B, C]
        logits = director(ids, mask, 3)  # [3, B, C]
        served_logits = served(ids, mask, 3)  # [3, B, C]
        baseline = backbone(ids, mask, 2)  # [2, B, C]
        rows = backbone.sample_rows(ids, mask, torch.tensor([1, 2, 1]))  # [4, C]
    assert float((logits - cut).abs().max()) <= 1e-5 and float((served_logits - cut).abs().max()) <= 1e-5
    assert float((baseline - expected).abs().max()) <= 1e-4
    torch.testing.assert_close(rows, expected[[0, 1, 1, 2]], atol=1e-4, rtol=0)


def test_embedding_table_is_exact_in_float32(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama", seed=13, attention_bias=False)
    embedding = DecoderEmbedding.from_hf(model.model.embed_tokens)
    ids, _ = _padded_batch([5, 3], seed=13)
    assert torch.equal(embedding(ids), model.model.embed_tokens(ids))
    assert embedding.vocab_size == VOCAB
    with pytest.raises(ValueError, match="table dtype"):
        DecoderEmbedding(model.model.embed_tokens.weight, "bfloat16")


@pytest.mark.parametrize(
    ("family", "overrides", "problem"),
    [
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "linear"),
        ("qwen2", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
        ("qwen2", {"hidden_act": "gelu"}, "gelu"),
        ("llama", {"hidden_act": "relu", "attention_bias": False}, "relu"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, "sliding"),
    ],
)
def test_unsupported_configs_are_refused(family: str, overrides: dict, problem: str) -> None:
    torch.manual_seed(0)
    cls = Qwen2ForSequenceClassification if family == "qwen2" else LlamaForSequenceClassification
    model = cls(_config(family, **overrides)).eval()
    with pytest.raises(ValueError, match=problem):
        DecoderTransitionView(model)


def test_a_bidirectional_kernel_is_refused(tmp_path: Path) -> None:
    view = DecoderTransitionView(_model(tmp_path, "qwen2", seed=14))
    with pytest.raises(ValueError, match="causal"):
        decoder_director_from_view(view, TransitionKernel(view.dim, view.num_heads, 1))
