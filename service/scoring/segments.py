"""A source cut into segments that engines read in parallel, each holding whole chunks of the inputs still to score,
so that every chunk is the one the in-process scorer would score as one request (the same inputs under the same
seed give the same answers). One pass over the source reads every key: a key that names two inputs is refused before
anything is scored, and the keys already scored (a resumed run) are left out of the chunks."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from service.errors import shown
from service.scoring.batches import Item
from service.scoring.inputs import Source, records

MAX_CHUNKS_PER_SEGMENT = 64


class DuplicateKey(ValueError):
    """Two inputs under one key: a resumed run would take the second for done."""


def duplicate_message(key: str) -> str:
    return (f"key {shown(key)} names two inputs (an id, or the line number of an input without one): give each "
            "input an id of its own")


@dataclass(frozen=True)
class Segment:
    start: int  # where its first record starts (a byte offset, a row or a file index)
    number: int  # its first record's number (the key of a line or row without an id)
    records: int  # the records it spans, those skipped and blank lines included
    skip: frozenset[str] = field(default_factory=frozenset)  # keys in it already scored


@dataclass(frozen=True)
class Survey:
    inputs: int  # every input of the source
    todo: int  # those still to score
    segments: list[Segment]


@dataclass
class _Chunk:
    start: int
    number: int
    index: int  # its first record's index
    skip: set[str] = field(default_factory=set)


def survey(source: Source, done: set[str], chunk: int, workers: int) -> Survey:
    """The source's segments: chunks of ``chunk`` inputs not in ``done``, grouped so that there are several per
    worker (at most ``MAX_CHUNKS_PER_SEGMENT`` chunks each). ``DuplicateKey`` when a key names two inputs."""
    seen: set[str] = set()
    chunks: list[_Chunk] = []
    todo = total = 0
    for index, (position, item) in enumerate(records(source)):
        total = index + 1
        if item is None:
            continue
        key = item[0]
        if key in seen:
            raise DuplicateKey(duplicate_message(key))
        seen.add(key)
        if key in done:
            if chunks:
                chunks[-1].skip.add(key)
            continue
        if todo % chunk == 0:
            chunks.append(_Chunk(position, index + 1, index))
        todo += 1
    return Survey(len(seen), todo, grouped(chunks, total, workers))


def grouped(chunks: list[_Chunk], records_total: int, workers: int) -> list[Segment]:
    per = max(1, min(MAX_CHUNKS_PER_SEGMENT, math.ceil(len(chunks) / max(8 * workers, 1))))
    segments = []
    for i in range(0, len(chunks), per):
        group = chunks[i:i + per]
        end = chunks[i + per].index if i + per < len(chunks) else records_total
        skip = frozenset(key for part in group for key in part.skip)
        segments.append(Segment(group[0].start, group[0].number, end - group[0].index, skip))
    return segments


def segment_chunks(source: Source, segment: Segment, chunk: int) -> Iterator[list[Item]]:
    """The segment's inputs still to score, ``chunk`` at a time."""
    part: list[Item] = []
    for _, item in records(source, segment.start, segment.number, segment.records):
        if item is None or item[0] in segment.skip:
            continue
        part.append(item)
        if len(part) == chunk:
            yield part
            part = []
    if part:
        yield part
