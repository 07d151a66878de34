
import pytest
import torch
from torch import nn
from transformers import BertModel

from models.bert_view import BertTransitionView, feed_forward
from models.text_backbones import TextClassifier, build_tiny_bert, from_pretrained_minilm, load_minilm_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _lively(encoder: BertModel, seed: int) -> BertModel:
    """Re-draw every weight at a scale where attention is far from uniform and the variance is O(0.1-1):
    BERT's initialisation (std 0.02) leaves a tiny random model with almost no mixture variance."""
    gen = torch.Generator().manual_seed(seed)
    dim = encoder.config.hidden_size
    with torch.no_grad():
        for module in encoder.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 1.5 / module.in_features**0.5)
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
            elif isinstance(module, nn.LayerNorm):
                module.weight.copy_(0.5 + torch.rand(dim, generator=gen))
                module.bias.copy_(torch.randn(dim, generator=gen) * 0.1)
            elif isinstance(module, nn.Embedding):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen))
    return encoder.eval()


def _tiny_classifier(seed: int = 0, pooling: str = "mean", **kwargs: int) -> TextClassifier:
    torch.manual_seed(seed)
    return TextClassifier(_lively(build_tiny_bert(**kwargs), seed), num_classes=3, pooling=pooling).eval()


def _padded_batch(lengths: list[int], vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), width), generator=gen)  # [B, L]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # [B, L]
    return ids * mask, mask


def _rollout(
    view: BertTransitionView, ids: torch.Tensor, mask: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(X_t, var_t) for t = 1..T] along the backbone's own trajectory."""
    key_padding_mask = mask.bool()
    x = view.embed(ids, mask)
    states = []
    for t in range(1, view.num_steps + 1):
        x, variance = view.transition(t, x, key_padding_mask)
        states.append((x, variance))
    return states


@pytest.mark.parametrize(
    ("kwargs", "pooling"),
    [
        ({"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}, "mean"),
        ({"hidden_size": 24, "num_layers": 3, "num_heads": 3, "intermediate_size": 48}, "cls"),
    ],
)
def test_chained_transitions_reproduce_the_encoder(kwargs: dict[str, int], pooling: str) -> None:
    model = _tiny_classifier(pooling=pooling, **kwargs)
    view = BertTransitionView(model)
    ids, mask = _padded_batch([9, 4, 1, 7], vocab=100, seed=1)
    real = mask.bool()
    with torch.no_grad():
        expected = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, D]
        states = _rollout(view, ids, mask)
        x_last = states[-1][0]
        logits = view.readout(x_last, real)
        expected_logits = model(ids, mask)
        final = view.final_hidden(x_last)
    assert view.num_steps == kwargs["num_layers"]
    for x, variance in states:
        assert variance.shape == x.shape
        assert bool((variance >= 0).all()) and bool(torch.isfinite(variance).all())
    assert float(states[0][1][real].mean()) > 1e-3  # the lively model has a real spread to compare
    assert float((final - expected)[real].abs().max()) < 1e-5
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=0)


def test_each_state_is_the_attention_sublayer_output() -> None:
    """X_t equals the output of layer t's attention sublayer (residual LayerNorm included), at every t."""
    model = _tiny_classifier(num_layers=3)
    view = BertTransitionView(model)
    ids, mask = _padded_batch([6, 3], vocab=100, seed=2)
    captured: list[torch.Tensor] = []
    hooks = [layer.attention.register_forward_hook(lambda m, i, o: captured.append(o[0]))
             for layer in model.encoder.encoder.layer]
    with torch.no_grad():
        model.encoder(input_ids=ids, attention_mask=mask)
        states = _rollout(view, ids, mask)
    for hook in hooks:
        hook.remove()
    real = mask.bool()
    assert len(captured) == len(states) == 3
    for (x, _), a in zip(states, captured, strict=True):
        assert float((x - a)[real].abs().max()) < 1e-5


def test_padding_changes_nothing_for_real_tokens() -> None:
    model = _tiny_classifier(seed=3)
    view = BertTransitionView(model)
    ids, mask = _padded_batch([4, 10], vocab=100, seed=3)
    with torch.no_grad():
        alone = _rollout(view, ids[:1, :4], mask[:1, :4])
        padded = _rollout(view, ids, mask)
        logits_alone = view.readout(alone[-1][0], mask[:1, :4].bool())
        logits_padded = view.readout(padded[-1][0], mask.bool())
    for (x_a, var_a), (x_p, var_p) in zip(alone, padded, strict=True):
        torch.testing.assert_close(x_p[:1, :4], x_a, atol=1e-5, rtol=0)
        torch.testing.assert_close(var_p[:1, :4], var_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits_padded[:1], logits_alone, atol=1e-5, rtol=0)


def test_variance_is_zero_where_attention_is_one_hot() -> None:
    model = _tiny_classifier(seed=4)
    view = BertTransitionView(model)
    # A sequence with one real token beside a longer one: its only key is itself at every step.
    ids, mask = _padded_batch([1, 8], vocab=100, seed=4)
    with torch.no_grad():
        states = _rollout(view, ids, mask)
    for _, variance in states:
        assert float(variance[0, 0].abs().max()) == 0.0
        assert float(variance[1, :8].mean()) > 1e-3
    # Every query puts all its weight on the token with the largest first feature: keys k_j = c x_j[0] 1,
    # queries a constant, so the score gap between tokens is c^2 times a feature gap.
    first = model.encoder.encoder.layer[0].attention.self
    with torch.no_grad():
        first.query.weight.zero_()
        first.query.bias.fill_(1.0)
        first.key.weight.zero_()
        first.key.weight[:, 0] = 1e5
        first.key.bias.zero_()
        x1, variance = view.transition(1, view.embed(ids, mask), mask.bool())
    assert bool(torch.isfinite(x1).all())
    assert float(variance.abs().max()) < 1e-12


def _monte_carlo_attention_sublayer(
    model: TextClassifier, t: int, h: torch.Tensor, mask: torch.Tensor, draws: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard attention J_h ~ Cat(A_i^h) per head, through W_O, the residual, and the attention LayerNorm
    linearised at the soft-attention point with its statistics held there: LN(z + d) ~ LN(z) + g d / s(z)."""
    layer = model.encoder.encoder.layer[t - 1]
    attn, out = layer.attention.self, layer.attention.output
    batch, tokens, dim = h.shape
    heads, hd = attn.num_attention_heads, attn.attention_head_size

    def split(y: torch.Tensor) -> torch.Tensor:
        return y.view(batch, tokens, heads, hd).transpose(1, 2)  # [B, H, L, hd]

    q, k, v = split(attn.query(h)), split(attn.key(h)), split(attn.value(h))
    scores = (q @ k.transpose(-2, -1)) * attn.scaling  # [B, H, L, L]
    weights = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf")).softmax(-1)
    picks = torch.multinomial(weights.reshape(-1, tokens), draws, replacement=True).view(batch, heads, tokens, draws)
    chosen = torch.gather(v.unsqueeze(3).expand(-1, -1, -1, draws, -1), 2,
                          picks.unsqueeze(-1).expand(-1, -1, -1, -1, hd))  # [B, H, L, draws, hd]
    concat = chosen.permute(0, 2, 3, 1, 4).reshape(batch, tokens, draws, heads * hd)  # [B, L, draws, H*hd]
    pre_samples = out.dense(concat) + h.unsqueeze(2)  # [B, L, draws, D]
    soft = out.dense((weights @ v).transpose(1, 2).reshape(batch, tokens, dim)) + h  # [B, L, D]
    scale = out.LayerNorm.weight / (soft.var(-1, unbiased=False, keepdim=True) + out.LayerNorm.eps).sqrt()
    samples = out.LayerNorm(soft).unsqueeze(2) + scale.unsqueeze(2) * (pre_samples - soft.unsqueeze(2))
    return samples.mean(2), samples.var(2)  # [B, L, D] each


@pytest.mark.parametrize("t", [1, 2])
def test_variance_matches_monte_carlo_hard_attention(t: int) -> None:
    model = _tiny_classifier(seed=5, hidden_size=16, num_heads=2, intermediate_size=32)
    view = BertTransitionView(model)
    ids, mask = _padded_batch([5, 3], vocab=100, seed=5)
    real = mask.bool()
    torch.manual_seed(0)
    with torch.no_grad():
        x = view.embed(ids, mask)
        for step in range(1, t):
            x, _ = view.transition(step, x, real)
        h = x if t == 1 else feed_forward(model.encoder.encoder.layer[t - 2], x)  # layer t's attention input
        mean, variance = view.transition(t, x, real)
        mc_mean, mc_var = _monte_carlo_attention_sublayer(model, t, h, mask, draws=100_000)
    assert float(variance[real].mean()) > 0.05
    torch.testing.assert_close(mc_mean[real], mean[real], atol=2e-2, rtol=0)
    torch.testing.assert_close(mc_var[real], variance[real], atol=2e-2, rtol=3e-2)


def test_transition_rejects_bad_step() -> None:
    view = BertTransitionView(_tiny_classifier())
    with pytest.raises(ValueError):
        view.transition(0, torch.zeros(1, 3, 32))
    with pytest.raises(ValueError):
        view.transition(3, torch.zeros(1, 3, 32))


def test_pretrained_minilm_view() -> None:
    """The real MiniLM-L6: chained transitions reproduce last_hidden_state of the real tokens of a padded batch
    (eager attention), the variance is non-negative, and padding changes nothing."""
    model = from_pretrained_minilm(num_classes=2).eval()
    tokenizer = load_minilm_tokenizer()
    view = BertTransitionView(model)
    texts = ["A gorgeous, witty film.", "The plot is a tired mess that drags on without any point at all."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    short = int(mask[0].sum())
    assert view.num_steps == 6 and view.dim == 384 and short < ids.shape[1]
    with torch.no_grad():
        expected = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # [2, L, 384]
        padded = _rollout(view, ids, mask)
        alone = _rollout(view, ids[:1, :short], mask[:1, :short])
        logits = view.readout(padded[-1][0], mask.bool())
        expected_logits = model(ids, mask)
        final = view.final_hidden(padded[-1][0])
    real = mask.bool()
    assert float((final - expected)[real].abs().max()) < 1e-5
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=0)
    for (x_p, var_p), (x_a, var_a) in zip(padded, alone, strict=True):
        assert bool((var_p >= 0).all())
        assert float(var_p[real].mean()) > 0.0
        torch.testing.assert_close(x_p[:1, :short], x_a, atol=1e-5, rtol=0)
        torch.testing.assert_close(var_p[:1, :short], var_a, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_transitions", [0, 1, 2])
def test_prefix_equals_the_first_transitions(num_transitions: int) -> None:
    """Partial depth: the plain-module prefix reproduces X_P of the chained transitions on padded texts, scripted."""
    view = BertTransitionView(_tiny_classifier(seed=4))
    ids, mask = _padded_batch([5, 9, 2], vocab=100, seed=4)
    real = mask.bool()
    prefix = view.prefix(num_transitions)
    with torch.no_grad():
        x = view.embed(ids, mask)
        expected = x
        for t in range(1, num_transitions + 1):
            expected, _ = view.transition(t, expected, real)
        scripted = torch.jit.script(prefix)
        for module in (prefix, scripted):
            got = module(x, real)  # [B, L, D]
            torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)  # padding rows are never read
    assert prefix.num_transitions == num_transitions
