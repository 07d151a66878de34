"""KEP-SVGP attention in a text classifier: the deterministic part is the encoder's own, padding changes nothing, the
kernel and the KSVD loss read each text's real tokens alone, and the sampled rows follow the text contract."""

from __future__ import annotations

import torch

from models.text_backbones import TextClassifier, build_tiny_bert
from models.text_kep_svgp import TextKepSvgpClassifier


def tiny_classifier(layers: int = 3) -> TextClassifier:
    torch.manual_seed(0)
    return TextClassifier(build_tiny_bert(num_layers=layers), num_classes=3).eval()


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """Two right-padded texts of 5 and 8 tokens: ids and mask [2, 8]."""
    ids = torch.randint(5, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    ids[0, 5:] = 0
    return ids, mask


def test_the_layers_before_are_the_encoders_own() -> None:
    classifier = tiny_classifier()
    model = TextKepSvgpClassifier(classifier, layers=1, rank=4, rank_multi=2, num_tokens=8).eval()
    ids, mask = texts()
    with torch.no_grad():
        hidden = classifier.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        start = model.start(ids, mask)  # [2, 8, D]
    real = mask.bool()
    torch.testing.assert_close(start[real], hidden[2][real], rtol=1e-5, atol=1e-5)  # layer 2's output, real tokens
    assert model.replaced == [2]


def test_padding_changes_no_sample() -> None:
    model = TextKepSvgpClassifier(tiny_classifier(), layers=2, rank=4, rank_multi=2, num_tokens=12).eval()
    ids, mask = texts()
    wide_ids = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], dim=1)  # [2, 12] four more pads
    wide_mask = torch.cat([mask, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.manual_seed(5)
        narrow = model(ids, mask, 3)  # [3, 2, C]
        torch.manual_seed(5)
        wide = model(wide_ids, wide_mask, 3)
        torch.manual_seed(5)
        _, ksvd_narrow = model.finish(model.start(ids, mask), mask)
        torch.manual_seed(5)
        _, ksvd_wide = model.finish(model.start(wide_ids, wide_mask), wide_mask)
    torch.testing.assert_close(narrow, wide, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ksvd_narrow, ksvd_wide, rtol=1e-5, atol=1e-6)


def test_samples_differ_and_follow_the_text_contract() -> None:
    model = TextKepSvgpClassifier(tiny_classifier(), layers=1, rank=4, rank_multi=2, num_tokens=8).eval()
    ids, mask = texts()
    with torch.no_grad():
        logits = model(ids, mask, 4)  # [4, 2, C]
        rows = model.sample_rows(ids, mask, torch.tensor([1, 3]))  # [4, C]
    assert logits.shape == (4, 2, 3) and rows.shape == (4, 3)
    assert not torch.allclose(logits[0], logits[1])  # one draw of the GP functions per sample row
    logits_train, ksvd = model.forward_terms(ids, mask)
    assert logits_train.shape == (2, 3) and ksvd.ndim == 0 and float(model.kl().detach()) > 0
