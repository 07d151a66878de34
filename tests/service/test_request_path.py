"""The request path's cheaper parts keep the old answers: the JSON parser (values and refusals as ``json.loads``),
the buffered random ids (unique, hex, fresh in a forked child) and the batched summaries (as ``summarize`` request by
request)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from models.uncertainty import split_rows, summarize
from service.api.json_body import parse_json
from service.engine.inference import summarize_requests
from service.random_ids import RandomHex, random_hex


@pytest.mark.parametrize("text", [
    '{"inputs": [{"pixels": [[0.25, 1e-3, 1]]}], "n_samples": 4}',
    "[NaN, Infinity, -Infinity, 1e400]",  # what json.loads accepts beyond strict JSON
    "[18446744073709551616, 1" + "0" * 40 + "]",  # integers past 64 bits stay integers
    '{"a": 1, "a": 2}',
    '["\\ud800", "caf\\u00e9 \\ud83d\\ude00"]',  # a lone surrogate escape: the fallback parses it as json.loads does
])
def test_parse_json_gives_what_json_loads_gives(text: str) -> None:
    got, want = parse_json(text.encode()), json.loads(text)
    assert repr(got) == repr(want)  # repr: NaN != NaN, and 1 == 1.0 would hide a float


@pytest.mark.parametrize("raw", [b'{"inputs": [tru', b"", b"\xff\xfe{}", b"[" * 100_000])
def test_parse_json_refuses_with_the_standard_librarys_errors(raw: bytes) -> None:
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError, RecursionError)) as seen:
        json.loads(raw)
    with pytest.raises(seen.type):
        parse_json(raw)


def test_random_ids_are_hex_unique_and_cross_blocks() -> None:
    ids = RandomHex(block_bytes=64)
    drawn = [ids(16) for _ in range(1000)]  # 250 blocks
    assert len(set(drawn)) == len(drawn)
    assert all(len(x) == 32 and int(x, 16) >= 0 for x in drawn)
    assert len(ids(100)) == 200  # more than a block at once


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    random_hex(8)  # the parent holds a block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(random_hex(16) for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    os.waitpid(pid, 0)
    parent = [random_hex(16) for _ in range(4)]
    assert len(child) == 4 and not set(child) & set(parent)


@pytest.mark.parametrize(("sizes", "samples"), [([2, 1, 3, 1], [4, 1, 4, 2]), ([1] * 32, [1] * 32), ([3], [16])])
def test_batched_summaries_equal_summaries_request_by_request(sizes: list[int], samples: list[int]) -> None:
    torch.manual_seed(0)
    repeats = [s for size, s in zip(sizes, samples, strict=True) for _ in range(size)]
    rows = torch.randn(sum(repeats), 10)  # [sum(repeats), C]
    got = summarize_requests(rows, sizes, samples, 1.3)
    blocks, start = split_rows(rows, torch.tensor(repeats)), 0
    assert len(got) == len(sizes)
    for size, summary in zip(sizes, got, strict=True):
        want = summarize(torch.cat(blocks[start:start + size], dim=1), 1.3)  # [S, n, C] -> [n]
        start += size
        for name, value in vars(want).items():
            torch.testing.assert_close(getattr(summary, name), value, rtol=1e-6, atol=1e-6)


def test_batched_summaries_give_each_input_its_own_temperature() -> None:
    """A temperature per input ([n], a score temperature's) follows its input through the grouping by sample count."""
    torch.manual_seed(1)
    sizes, samples = [2, 1, 3], [4, 1, 4]
    repeats = [s for size, s in zip(sizes, samples, strict=True) for _ in range(size)]
    rows = torch.randn(sum(repeats), 10)  # [sum(repeats), C]
    temperatures = torch.tensor([0.5, 1.0, 2.0, 3.0, 0.7, 1.5])  # [n]
    got = summarize_requests(rows, sizes, samples, temperatures)
    blocks = split_rows(rows, torch.tensor(repeats))
    flat = [value for summary in got for value in summary.confidence.tolist()]
    want = [float(summarize(block, t).confidence) for block, t in zip(blocks, temperatures.tolist(), strict=True)]
    assert flat == pytest.approx(want, rel=1e-6)
