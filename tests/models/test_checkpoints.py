"""Converted user checkpoints: tiny random Hugging Face / timm classifiers, saved and reloaded from a folder, become
canonical backbones whose logits, transition views, specs and scripted text artifacts equal the source's; what cannot
be represented exactly is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    ElectraConfig,
    ElectraForSequenceClassification,
    PreTrainedModel,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
)

from models.backbones import ImageClassifier
from models.bert_view import BertTransitionView
from models.checkpoints import (
    bert_family_from_hf,
    text_classifier_from_spec,
    text_classifier_spec,
    vit_from_hf,
    vit_from_spec,
    vit_from_timm,
    vit_spec,
)
from models.text_backbones import ClassifierHead, TextClassifier
from models.text_director import TextBackbone, TextReadout
from models.vit_view import VitTransitionView

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 64, "num_labels": 3}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TOLERANCE = 1e-4


def _lively(model: nn.Module, seed: int) -> nn.Module:
    """Re-draw every weight at a scale where attention is far from uniform and the logits spread (the default
    initialisation, std 0.02, leaves a tiny random model answering almost the same for every input)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            elif param.dim() == 1:  # LayerNorm gains, LayerScale
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif param.dim() == 2 and "embed" not in name and "token" not in name:  # linear layers
                param.copy_(torch.randn(param.shape, generator=gen) * 1.5 / param.shape[1] ** 0.5)
            else:  # embedding tables, patch convolutions, class / position tokens
                fan_in = param[0].numel() if param.dim() == 4 else 1
                param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
    return model.eval()


def _reloaded(model: PreTrainedModel, folder: Path) -> PreTrainedModel:
    """``model`` saved with ``save_pretrained`` and read back with ``from_pretrained`` (eager attention, eval)."""
    model.save_pretrained(folder)
    return type(model).from_pretrained(folder, attn_implementation="eager").eval()


# ----------------------------------------------------------------------------------------------------- vision


def _vit_view_logits(model: ImageClassifier, pixels: torch.Tensor) -> torch.Tensor:
    view = VitTransitionView(model)
    x = view.embed(pixels)
    for t in range(1, view.num_steps + 1):
        x, _ = view.transition(t, x)
    return view.readout(x)  # [B, C]


def _check_vit(model: ImageClassifier, pixels: torch.Tensor, expected: torch.Tensor) -> None:
    """(a) backbone logits, (b) the chained transition view, (c) the spec round trip (JSON), scripted view parts."""
    with torch.no_grad():
        logits = model(pixels)
        viewed = _vit_view_logits(model, pixels)
        spec = json.loads(json.dumps(vit_spec(model)))
        rebuilt = vit_from_spec(spec)
        rebuilt.load_state_dict(model.state_dict())
        view = VitTransitionView(model)
        scripted_embed = torch.jit.script(view.embedding)
        scripted_readout = torch.jit.script(view.readout_head)
        x = view.embed(pixels)
        for t in range(1, view.num_steps + 1):
            x, _ = view.transition(t, x)
        scripted = scripted_readout(x)
        torch.testing.assert_close(scripted_embed(pixels), view.embed(pixels), atol=1e-6, rtol=0)
    assert not model.training
    assert float(expected.std()) > 0.1  # the lively model answers differently per input
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(viewed, expected, atol=TOLERANCE, rtol=0)
    assert torch.equal(rebuilt(pixels), logits)
    torch.testing.assert_close(scripted, viewed, atol=1e-5, rtol=0)


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_hf_vit_converts_exactly(qkv_bias: bool, tmp_path: Path) -> None:
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=3, id2label=LABELS,
                       label2id={v: k for k, v in LABELS.items()}, qkv_bias=qkv_bias)
    torch.manual_seed(0)
    source = _reloaded(_lively(ViTForImageClassification(config), seed=0), tmp_path)
    processor = {"do_normalize": True, "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.25, 0.3],
                 "do_rescale": True, "rescale_factor": 1 / 255}
    model, labels = vit_from_hf(source, processor)
    pixels = torch.rand(4, 3, 16, 16)
    mean, std = torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = source(pixel_values=(pixels - mean) / std).logits  # [B, C]
    assert labels == ["negative", "neutral", "positive"]
    spec = vit_spec(model)
    assert spec["layer_norm_eps"] == config.layer_norm_eps and spec["vit"]["qkv_bias"] is qkv_bias
    _check_vit(model, pixels, expected)


def test_hf_vit_default_normalisation(tmp_path: Path) -> None:
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=3)
    source = _reloaded(_lively(ViTForImageClassification(config), seed=1), tmp_path)
    model, labels = vit_from_hf(source)
    pixels = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(pixels), source(pixel_values=(pixels - 0.5) / 0.5).logits, atol=TOLERANCE,
                                   rtol=0)
    assert labels == ["LABEL_0", "LABEL_1", "LABEL_2"]


@pytest.mark.parametrize("kind", [DeiTForImageClassification, DeiTForImageClassificationWithTeacher])
def test_hf_deit_converts_exactly(kind: type, tmp_path: Path) -> None:
    """DeiT's distillation token sits after the class token, inside the position embedding; the plain classifier
    reads the class token only, the one with a teacher head averages both heads."""
    config = DeiTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, num_labels=3)
    source = _reloaded(_lively(kind(config), seed=4), tmp_path)
    model, _ = vit_from_hf(source)
    pixels = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        expected = source(pixel_values=(pixels - 0.5) / 0.5).logits  # [B, C]
    spec = vit_spec(model)
    assert spec["distilled"] is (kind is DeiTForImageClassificationWithTeacher)
    assert spec["vit"]["reg_tokens"] == (0 if spec["distilled"] else 1)
    assert VitTransitionView(model).embed(pixels).shape == (3, 18, 32)  # [CLS, DIST] + 16 patches
    _check_vit(model, pixels, expected)


def _timm_vit(**kwargs: object) -> VisionTransformer:
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, depth=2,
                             embed_dim=32, num_heads=4, **kwargs)


def test_timm_checkpoint_converts_exactly(tmp_path: Path) -> None:
    torch.manual_seed(2)
    trained = _lively(_timm_vit(), seed=2)
    path = tmp_path / "vit.pth"
    torch.save(trained.state_dict(), path)
    source = _timm_vit(checkpoint_path=str(path)).eval()
    model, labels = vit_from_timm(source)  # mean/std 0.5 from the pretrained_cfg
    pixels = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        expected = source((pixels - 0.5) / 0.5)
    assert labels is None and model.mean.flatten().tolist() == [0.5] * 3
    assert model.vit is not source and model.vit.head.weight.data_ptr() != source.head.weight.data_ptr()
    _check_vit(model, pixels, expected)


def test_timm_variant_converts_exactly() -> None:
    """Average pooling without a class token, layer scale, qk-norm, a pre-norm, tanh GELU, no qkv bias."""
    torch.manual_seed(3)
    source = _lively(VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=3, embed_dim=32, depth=2,
                                       num_heads=4, mlp_ratio=2.0, qkv_bias=False, qk_norm=True, init_values=0.1,
                                       class_token=False, global_pool="avg", pre_norm=True, act_layer="gelu_tanh"),
                     seed=3)
    model, _ = vit_from_timm(source, mean=[0.3, 0.4, 0.5], std=[0.2, 0.2, 0.2])
    pixels = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        expected = source((pixels - torch.tensor([0.3, 0.4, 0.5]).view(1, 3, 1, 1)) / 0.2)
    spec = vit_spec(model)
    assert spec["gelu_approximate"] == "tanh" and spec["vit"]["fc_norm"] and spec["vit"]["pre_norm"]
    _check_vit(model, pixels, expected)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_timm_register_tokens_convert_exactly(no_embed_class: bool) -> None:
    """Register tokens after the class token, with the position embedding over them or over the patches only."""
    source = _lively(_timm_vit(reg_tokens=4, no_embed_class=no_embed_class), seed=5)
    model, _ = vit_from_timm(source)
    pixels = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        expected = source((pixels - 0.5) / 0.5)
    assert vit_spec(model)["vit"]["reg_tokens"] == 4
    _check_vit(model, pixels, expected)


def test_timm_distilled_deit_converts_exactly() -> None:
    source = _lively(VisionTransformerDistilled(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=2,
                                                num_heads=4), seed=6)
    model, _ = vit_from_timm(source, mean=[0.5] * 3, std=[0.5] * 3)
    pixels = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        expected = source((pixels - 0.5) / 0.5)  # eval: the class and distillation heads averaged
    assert type(model.vit) is VisionTransformerDistilled
    _check_vit(model, pixels, expected)


def test_timm_refusals() -> None:
    with pytest.raises(ValueError, match="pooling"):
        vit_from_timm(_timm_vit(global_pool="map"))
    with pytest.raises(ValueError, match="fixed image size"):
        vit_from_timm(_timm_vit(dynamic_img_size=True))
    with pytest.raises(ValueError, match="mean"):
        vit_from_timm(VisionTransformer(img_size=16, patch_size=4, num_classes=3, embed_dim=32, depth=1, num_heads=4))


# ----------------------------------------------------------------------------------------------------- text


def _padded_batch(lengths: list[int], pad_id: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids whose real tokens avoid the low (special, pad) ids."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(4, TEXT["vocab_size"], (len(lengths), width), generator=gen)  # [B, L]
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # [B, L]
    return torch.where(mask.bool(), ids, torch.full_like(ids, pad_id)), mask


def _text_source(name: str) -> PreTrainedModel:
    labels = {"id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}}
    if name == "bert":
        return BertForSequenceClassification(BertConfig(**TEXT, **labels))
    if name == "roberta":
        return RobertaForSequenceClassification(RobertaConfig(**TEXT, **labels, pad_token_id=1))
    if name == "xlm-roberta":
        return XLMRobertaForSequenceClassification(XLMRobertaConfig(**TEXT, **labels, pad_token_id=1))
    if name == "electra":
        return ElectraForSequenceClassification(ElectraConfig(**TEXT, **labels, embedding_size=32))
    return DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64, num_labels=3,
        **labels))


def _view_logits(view: BertTransitionView, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X_T, logits) of the chained transitions."""
    real = mask.bool()
    x = view.embed(ids, mask)
    for t in range(1, view.num_steps + 1):
        x, _ = view.transition(t, x, real)
    return x, view.readout(x, real)


@pytest.mark.parametrize(("name", "activation"),
                         [("bert", "tanh"), ("roberta", "tanh"), ("xlm-roberta", "tanh"), ("electra", "gelu"),
                          ("distilbert", "relu")])
def test_hf_text_classifier_converts_exactly(name: str, activation: str, tmp_path: Path) -> None:
    torch.manual_seed(4)
    source = _reloaded(_lively(_text_source(name), seed=4), tmp_path)
    model, labels = bert_family_from_hf(source)
    pad_id = source.config.pad_token_id
    ids, mask = _padded_batch([9, 4, 1, 7], pad_id, seed=5)
    real = mask.bool()
    with torch.no_grad():
        expected = source(input_ids=ids, attention_mask=mask).logits  # [B, C]
        logits = model(ids, mask)
        view = BertTransitionView(model)
        x_last, viewed = _view_logits(view, ids, mask)
        spec = json.loads(json.dumps(text_classifier_spec(model)))
        rebuilt = text_classifier_from_spec(spec)
        rebuilt.load_state_dict(model.state_dict())
        respun = rebuilt(ids, mask)
        plain = TextReadout.from_bert(view.readout_head)(x_last, real)
        served = torch.jit.script(TextBackbone.from_view(view, max_positions=32))(ids, mask, 2)  # [S, B, C]
    assert labels == ["negative", "neutral", "positive"] and not model.training
    assert isinstance(model.head, ClassifierHead) and model.head.activation == activation
    assert model.pooling == "cls" and model.num_classes == 3
    assert float(expected.std()) > 0.1  # the lively model answers differently per input
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(viewed, expected, atol=TOLERANCE, rtol=0)
    assert torch.equal(respun, logits)
    assert spec["head"]["activation"] == activation and spec["head"]["pre_features"] == 32
    torch.testing.assert_close(plain, viewed, atol=1e-5, rtol=0)
    for sample in served:
        torch.testing.assert_close(sample, viewed, atol=1e-5, rtol=0)


def test_bare_encoder_gets_a_fresh_linear_head(tmp_path: Path) -> None:
    """A bare encoder keeps the plain head layout (``head.weight``), so existing payloads load it; spec round trip."""
    source = _reloaded(_lively(BertModel(BertConfig(**TEXT)), seed=6), tmp_path)
    model, labels = bert_family_from_hf(source, num_classes=5, pooling="mean")
    ids, mask = _padded_batch([6, 3], 0, seed=6)
    with torch.no_grad():
        expected = source(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, D]
        hidden = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        rebuilt = text_classifier_from_spec(text_classifier_spec(model))
        rebuilt.load_state_dict(model.state_dict())
        torch.testing.assert_close(hidden[mask.bool()], expected[mask.bool()], atol=TOLERANCE, rtol=0)
        assert torch.equal(rebuilt(ids, mask), model(ids, mask))
    assert labels is None and isinstance(model.head, nn.Linear) and model.num_classes == 5
    assert {"head.weight", "head.bias"} <= set(model.state_dict())
    with pytest.raises(ValueError, match="num_classes"):
        bert_family_from_hf(source)


def test_plain_classifier_head_keeps_the_linear_layout() -> None:
    """A ``ClassifierHead`` without dense layer and activation is stored as its linear layer."""
    encoder = BertModel(BertConfig(**TEXT), add_pooling_layer=False)
    out = nn.Linear(32, 3)
    model = TextClassifier(encoder, 3, "cls", head=ClassifierHead(out))
    assert model.head is out and model.num_classes == 3
    with pytest.raises(ValueError, match="head maps"):
        TextClassifier(encoder, 4, "cls", head=ClassifierHead(nn.Linear(32, 3), nn.Linear(32, 32), "tanh"))
    with pytest.raises(ValueError, match="activation"):
        ClassifierHead(out, activation="swish")


def test_text_refusals() -> None:
    electra = ElectraForSequenceClassification(ElectraConfig(**TEXT, embedding_size=16))
    with pytest.raises(ValueError, match="embedding_size 16 != hidden_size 32"):
        bert_family_from_hf(electra)
    relu = BertForSequenceClassification(BertConfig(**TEXT, hidden_act="relu"))
    with pytest.raises(ValueError, match="GELU"):
        bert_family_from_hf(relu)
    with pytest.raises(ValueError, match="not supported"):
        bert_family_from_hf(ViTForImageClassification(ViTConfig(image_size=16, patch_size=4, hidden_size=32,
                                                                 num_hidden_layers=1, num_attention_heads=4)))
