"""The text artifact module: plain-module embedding/readout equal to the transformers ones, the word-table dtypes,
the artifact contract, and padding invariance (exact without noise, in distribution with noise), scripted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from models.bert_view import BertTransitionView
from models.folded_kernel import FoldedKernel
from models.half_storage import quantize_rows
from models.kernel import TransitionKernel
from models.text_backbones import from_pretrained_minilm, load_minilm_tokenizer
from models.text_director import (
    TextBackbone,
    TextDirector,
    TextReadout,
    TokenEmbedding,
    fold_for_artifact,
    text_director_from_view,
)
from models.text_layers import gelu_approximation
from tests.models.test_bert_view import _padded_batch, _tiny_classifier
from training.posthoc.writing import load_scripted, save_scripted, script_module

VOCAB = 100


pytestmark = pytest.mark.usefixtures("one_thread")


def _director(seed: int = 0, pooling: str = "mean", noise: float = 1.0) -> TextDirector:
    """A lively tiny BERT (3 classes) with a kernel whose mean map is not the identity, a confident head and noise
    large enough to move the answer."""
    view = BertTransitionView(_tiny_classifier(seed=seed, pooling=pooling))
    torch.manual_seed(seed)
    kernel = TransitionKernel(view.dim, view.num_heads, view.num_steps, logvar_init=math.log(0.05))
    with torch.no_grad():
        kernel.adaLN_modulation[-1].weight.normal_(std=0.1)
        kernel.mean_head.weight.normal_(std=0.1)
    director = text_director_from_view(view, kernel).eval().requires_grad_(False)
    director.readout.head.out.weight.mul_(30.0)  # a head that answers with some confidence, so noise moves it
    director.rollout.noise_scale.fill_(noise)
    return director


def _scripted(director: TextDirector, table_dtype: str = "float32") -> torch.jit.ScriptModule:
    return script_module(fold_for_artifact(director, table_dtype, max_positions=64))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_plain_modules_equal_the_transformers_ones(pooling: str) -> None:
    model = _tiny_classifier(seed=1, pooling=pooling)
    view = BertTransitionView(model)
    ids, mask = _padded_batch([9, 4, 1, 7], vocab=VOCAB, seed=1)
    real = mask.bool()
    embedding = TokenEmbedding.from_bert(model.encoder.embeddings)  # float32 table
    readout = TextReadout.from_bert(view.readout_head)
    with torch.no_grad():
        x0 = view.embed(ids, mask)
        states = [x0]
        for t in range(1, view.num_steps + 1):
            states.append(view.transition(t, states[-1], real)[0])
        expected = view.readout(states[-1], real)
        torch.testing.assert_close(embedding(ids), x0, atol=1e-5, rtol=0)
        torch.testing.assert_close(readout(states[-1], real), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(expected, model(ids, mask), atol=1e-5, rtol=0)  # and the whole classifier
    assert readout.feed_forward.gelu_approximate == "none"  # BERT's exact GELU


def test_per_row_int8_is_within_half_a_step() -> None:
    table = torch.randn(50, 16) * torch.logspace(-3, 1, 50)[:, None]  # rows of very different scales
    codes, scales = quantize_rows(table)
    assert codes.dtype == torch.int8 and scales.shape == (50,)
    error = (codes.float() * scales[:, None] - table).abs()  # [50, 16]
    assert bool((error <= scales[:, None] / 2 + 1e-7 * table.abs().amax(1, keepdim=True)).all())
    assert int(codes.abs().amax(1).min()) == 127  # every row uses its full range


def test_minilm_word_tables_within_stated_tolerances() -> None:
    """MiniLM-L6's X_0 (width 384, RMS ~0.5) from the stored tables. Measured: float16 max abs error 1.2e-3, int8
    max 2.9e-2 and mean 6.3e-3 (per-row int8 rows are within max|row|/254; MiniLM's largest rows reach |1.05|, and
    the LayerNorm divides by the token's std). Tolerances: float32 1e-5; float16 2e-3; int8 max 5e-2, mean 1e-2."""
    model = from_pretrained_minilm(num_classes=2).eval()
    view = BertTransitionView(model)
    texts = ["A gorgeous, witty film.", "The plot is a tired mess that drags on without any point at all.", "meh"]
    batch = load_minilm_tokenizer()(texts, padding=True, return_tensors="pt")
    ids, real = batch["input_ids"], batch["attention_mask"].bool()
    with torch.no_grad():
        expected = view.embed(ids, batch["attention_mask"])  # [3, L, 384]
        errors = {dtype: (TokenEmbedding.from_bert(model.encoder.embeddings, dtype, 64)(ids) - expected)[real].abs()
                  for dtype in ("float32", "float16", "int8")}
    assert float(errors["float32"].max()) <= 1e-5
    assert 0.0 < float(errors["float16"].max()) <= 2e-3
    assert float(errors["int8"].max()) <= 5e-2 and float(errors["int8"].mean()) <= 1e-2
    sizes = {dtype: TokenEmbedding.from_bert(model.encoder.embeddings, dtype) for dtype in ("float16", "int8")}
    assert sizes["float16"].word_table.dtype == torch.float16 and sizes["int8"].word_table.dtype == torch.int8
    assert sizes["int8"].word_scale.shape == (30522,)


def test_forward_and_sample_rows_follow_the_contract() -> None:
    director = _director()
    ids, mask = _padded_batch([5, 8, 3], vocab=VOCAB, seed=2)
    logits = director(ids, mask, 6)
    assert logits.shape == (6, 3, 3)
    assert not torch.allclose(logits[0], logits[1])  # independent samples
    torch.manual_seed(4)
    first = director(ids, mask, 6)
    torch.manual_seed(4)
    torch.testing.assert_close(director(ids, mask, 6), first)  # reproducible under the seed
    director.rollout.noise_scale.fill_(0.0)
    rows = director.sample_rows(ids, mask, torch.tensor([2, 1, 3]))
    assert rows.shape == (6, 3)
    single = [director.sample_rows(ids[i : i + 1, : int(mask[i].sum())], mask[i : i + 1, : int(mask[i].sum())],
                                   torch.tensor([1])) for i in range(3)]
    expected = torch.cat([single[0].expand(2, -1), single[1], single[2].expand(3, -1)])  # grouped by input
    torch.testing.assert_close(rows, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("table_dtype", ["float32", "int8"])
def test_padding_changes_nothing_without_noise(table_dtype: str) -> None:
    """A text's logits are the same (1e-5) alone and batched with longer texts, in the scripted artifact."""
    served = _scripted(_director(seed=3, noise=0.0), table_dtype)
    ids, mask = _padded_batch([4, 11, 7], vocab=VOCAB, seed=3)
    alone = served(ids[:1, :4], mask[:1, :4], 2)  # [2, 1, C]
    padded = served(ids, mask, 2)  # [2, 3, C]
    torch.testing.assert_close(padded[:, :1], alone, atol=1e-5, rtol=0)
    rows = served.sample_rows(ids, mask, torch.tensor([3, 1, 2]))
    torch.testing.assert_close(rows[:3], alone[0].expand(3, -1), atol=1e-5, rtol=0)
    assert float((padded[0, 1] - padded[0, 0]).abs().max()) > 1e-3  # the texts do get different answers


def test_padding_keeps_the_answer_distribution() -> None:
    """With noise, a text's sampled probabilities have the same distribution alone and padded. For f(p) = p and
    f(p) = p^2 per class, the two sample means of S independent draws each differ by a normal variable of standard
    error sqrt(var_alone / S + var_padded / S); they must agree within 5 standard errors (a false alarm has
    probability ~6e-7 per statistic), while the draws themselves differ."""
    served = _scripted(_director(seed=5, noise=1.0))
    ids, mask = _padded_batch([5, 12, 9], vocab=VOCAB, seed=5)
    samples = 4000
    torch.manual_seed(0)
    alone = served(ids[:1, :5], mask[:1, :5], samples)[:, 0].softmax(-1)  # [S, C]
    torch.manual_seed(1)
    padded = served(ids, mask, samples)[:, 0].softmax(-1)  # [S, C]
    assert float(alone.std(0).max()) > 1e-2  # the noise really moves the answer
    assert not torch.allclose(alone[:100], padded[:100])
    for f_alone, f_padded in ((alone, padded), (alone.square(), padded.square())):
        gap = (f_alone.mean(0) - f_padded.mean(0)).abs()  # [C]
        standard_error = ((f_alone.var(0) + f_padded.var(0)) / samples).sqrt()  # [C]
        assert bool((gap <= 5 * standard_error).all()), (gap, standard_error)


def test_folded_artifact_matches_and_drops_the_conditioning_mlps() -> None:
    director = _director(seed=6)
    with torch.no_grad():  # a modulation that matters, as after distillation
        director.rollout.kernel.adaLN_modulation[-1].weight.normal_(std=0.2)
        director.rollout.kernel.adaLN_modulation[-1].bias.normal_(std=0.2)
    folded = fold_for_artifact(director, "float32", max_positions=16)
    ids, mask = _padded_batch([6, 3], vocab=VOCAB, seed=6)
    torch.manual_seed(2)
    expected = director(ids, mask, 4)
    torch.manual_seed(2)
    torch.testing.assert_close(folded(ids, mask, 4), expected, atol=1e-5, rtol=0)
    keys = set(folded.state_dict())
    assert not any("adaLN_modulation" in k or "t_embedder" in k for k in keys)
    assert isinstance(folded.rollout.kernel, FoldedKernel) and not hasattr(folded.rollout.kernel, "conditioning")
    assert folded.embedding.position.shape == (16, 32)
    served = script_module(folded)
    with pytest.raises(torch.jit.Error, match="max_length"):
        served(torch.ones(1, 17, dtype=torch.long), torch.ones(1, 17, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="int8"):
        fold_for_artifact(fold_for_artifact(director, "int8"), "float16")


def test_only_gelu_readouts_are_accepted() -> None:
    assert gelu_approximation(nn.GELU()) == "none" and gelu_approximation(nn.GELU(approximate="tanh")) == "tanh"
    with pytest.raises(ValueError, match="GELU"):
        gelu_approximation(nn.ReLU())


@pytest.mark.parametrize("layer_dtype", ["float32", "float16"])
def test_text_backbone_artifact_equals_the_classifier(layer_dtype: str, tmp_path: Path) -> None:
    """The deterministic baseline as plain modules: the classifier's logits (float16 layers: within 1e-2), identical
    sample rows, scripted and reloaded; half-stored layers take about half the bytes."""
    model = _tiny_classifier(seed=2, hidden_size=64, intermediate_size=128)
    view = BertTransitionView(model)
    ids, mask = _padded_batch([9, 4, 1, 7], vocab=VOCAB, seed=2)
    module = TextBackbone.from_view(view, "float32", max_positions=64, layer_dtype=layer_dtype)
    path = tmp_path / f"{layer_dtype}.ts"
    save_scripted(script_module(module), path)
    served = load_scripted(path)
    with torch.no_grad():
        expected = model(ids, mask)  # [B, C]
        got = served(ids, mask, 3)  # [S, B, C]
    tolerance = 1e-5 if layer_dtype == "float32" else 1e-2
    for sample in got:
        torch.testing.assert_close(sample, expected, atol=tolerance, rtol=0)
    rows = served.sample_rows(ids, mask, torch.tensor([1, 0, 2, 1]))
    assert rows.shape == (4, 3) and torch.equal(rows[1], rows[2])
    if layer_dtype == "float16":
        full = tmp_path / "float32.ts"
        save_scripted(script_module(TextBackbone.from_view(view, "float32", max_positions=64)), full)
        layers = sum(p.numel() for p in view.layers.parameters())
        assert full.stat().st_size - path.stat().st_size > 1.5 * layers  # ~2 bytes saved per layer weight
