"""The cached start states X_{T-K}: in memory, or past the budget in a half-precision file read back per batch, with
the same rows either way; several splits of different widths in one set."""

from __future__ import annotations

from pathlib import Path

import torch

from models.bert_view import BertTransitionView
from models.text_backbones import TextClassifier, build_tiny_bert
from training.data.tokens import TokenSplit
from training.distil.start_states import STATES_FILE, start_states


def token_split(n: int, width: int, seed: int) -> TokenSplit:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (n,), generator=gen)
    lengths[0] = width  # the split is padded to its longest text
    mask = (torch.arange(width)[None] < lengths[:, None]).long()  # [n, width]
    ids = torch.randint(5, 100, (n, width), generator=gen) * mask
    return TokenSplit(ids, mask, torch.arange(n) % 2, [f"t{i}" for i in range(n)])


def test_spilled_states_equal_the_in_memory_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    view = BertTransitionView(TextClassifier(build_tiny_bert(), 2).eval()).requires_grad_(False)
    prefix = view.prefix(1).eval()
    splits = [token_split(70, 12, 0), token_split(30, 7, 1)]
    kept = start_states(view, prefix, splits, torch.device("cpu"))
    spilled = start_states(view, prefix, splits, torch.device("cpu"), memory_bytes=1024, spill_dir=tmp_path)
    assert not kept.spilled and spilled.spilled and (tmp_path / STATES_FILE).stat().st_size == 100 * 12 * 32 * 2
    assert len(spilled) == 100 and torch.equal(kept.mask, spilled.mask) and torch.equal(kept.labels, spilled.labels)
    assert torch.equal(kept.lengths, spilled.lengths) and int(kept.lengths[70:].max()) <= 7
    index = torch.tensor([3, 71, 0, 99])
    (a, mask_a), (b, mask_b) = kept.rows(index), spilled.rows(index)
    assert torch.equal(mask_a, mask_b) and a.shape == b.shape == (4, 12, 32)
    assert torch.allclose(a, b, atol=1e-2 * float(a.abs().max()))  # float16 storage
    assert torch.equal(b, b.half().float())  # rows come back exactly as stored
    direct = prefix(view.embed(splits[1].ids[:1]), splits[1].mask[:1].bool())  # row 70 is the second split's first
    assert torch.allclose(kept.rows(torch.tensor([70]))[0][0, :7], direct[0, :7], atol=1e-5)
