"""Train, val and test from the splits a user gave: those not given are carved out of train, seeded and stratified
by class, and every split comes out in a seeded random order, so that ``head(n)`` is a fair sample of every class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training.data.sources.errors import DataError

SPLITS = ("train", "val", "test")
SPLIT_ALIASES = {"train": "train", "val": "val", "validation": "val", "dev": "val", "test": "test"}


def carved_count(n: int, fraction: float) -> int:
    """Examples of a class of ``n`` that go to a carved split: ``fraction`` of them rounded, at least 1 from 3 on."""
    k = int(n * fraction + 0.5)
    return max(k, 1) if n >= 3 and fraction > 0 else k


def carve_splits(labels: torch.Tensor, num_classes: int, fractions: dict[str, float], seed: int
                 ) -> dict[str, torch.Tensor]:
    """Rows [k] int64 of ``labels`` [N] for "train" and each carved split of ``fractions`` (name -> fraction):
    per class a seeded shuffle cut into parts of ``carved_count`` rows, so every split holds every class in
    proportion, and train keeps at least one example of each class. Rows are sorted within each part."""
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in ("train", *fractions)}
    by_class = torch.argsort(labels, stable=True)  # each class's rows in order: one sort, however many classes
    sizes = torch.bincount(labels, minlength=num_classes)[:num_classes].tolist()
    for members in torch.split(by_class, sizes):
        members = members[torch.randperm(len(members), generator=generator)]
        takes = {name: carved_count(len(members), f) for name, f in fractions.items()}
        while takes and sum(takes.values()) > max(len(members) - 1, 0):
            largest = max(reversed(takes), key=lambda name: takes[name])  # test gives way first on a tie
            takes[largest] -= 1
        start = 0
        for name, k in takes.items():
            parts[name].append(members[start : start + k])
            start += k
        parts["train"].append(members[start:])
    empty = torch.zeros(0, dtype=torch.long)
    return {name: torch.sort(torch.cat([empty, *rows])).values for name, rows in parts.items()}


def _check_fractions(fractions: dict[str, float]) -> None:
    for name, f in fractions.items():
        if not 0.0 < f < 1.0:
            raise DataError(f"{name}_fraction must lie strictly between 0 and 1 to carve a {name} split out of train, "
                            f"got {f}; or give a {name} split")
    if sum(fractions.values()) >= 1.0:
        raise DataError(f"val_fraction + test_fraction must leave training data, got {sum(fractions.values()):g}")


def check_classes(train: torch.Tensor, labels: list[str], source: str, fix: str) -> None:
    """Every class in train (``fix`` says how to add one): a class never trained on is a head output never learnt."""
    counts = torch.bincount(train, minlength=len(labels))
    empty = [f"{i} {labels[i]!r}" for i in range(len(labels)) if counts[i] == 0]
    if empty:
        shown = ", ".join(empty[:10]) + (f", ... ({len(empty)} classes)" if len(empty) > 10 else "")
        raise DataError(f"empty class: no training example of class {shown} in {source}. Every class needs examples "
                        f"in train (3 or more when val and test are carved from it): {fix}")


@dataclass
class Plan:
    """Each final split as rows of a given split, and where it came from."""

    rows: dict[str, tuple[str, torch.Tensor]]  # split -> (given split, rows [k] in a seeded random order)
    origins: dict[str, str]


def _class_sizes(train: torch.Tensor, num_classes: int) -> str:
    """The training examples per class in a few words, however many classes there are."""
    counts = torch.bincount(train, minlength=num_classes)
    if num_classes <= 10:
        return f"the classes have {counts.tolist()} training examples"
    few = int((counts < 3).sum())
    return (f"its {num_classes} classes have {int(counts.min())} to {int(counts.max())} training examples each, "
            f"{few} of them fewer than 3")


def plan_splits(labels: dict[str, torch.Tensor], num_classes: int, val_fraction: float, test_fraction: float,
                seed: int, sources: dict[str, str]) -> Plan:
    """Train, val and test from the given splits: those not given are carved out of train (seeded, stratified)."""
    fractions = {name: f for name, f in (("val", val_fraction), ("test", test_fraction)) if name not in labels}
    _check_fractions(fractions)
    carved = carve_splits(labels["train"], num_classes, fractions, seed) if fractions \
        else {"train": torch.arange(len(labels["train"]))}
    generator = torch.Generator().manual_seed(seed)
    rows, origins = {}, {}
    for name in SPLITS:
        if name != "train" and name in labels:
            rows[name] = (name, torch.arange(len(labels[name])))
            origins[name] = f"given: {sources[name]}"
        elif name == "train":
            rows[name] = ("train", carved["train"])
            less = f", less the carved {' and '.join(fractions)}" if fractions else ""
            origins[name] = f"given: {sources['train']}{less}"
        else:
            rows[name] = ("train", carved[name])
            origins[name] = f"carved from train: seed {seed}, fraction {fractions[name]:g}, stratified by class"
        if name in fractions and len(rows[name][1]) == 0:
            raise DataError(
                f"the {name} split would be empty: it is carved from train ({name}_fraction {fractions[name]:g}) and "
                f"{_class_sizes(labels['train'], num_classes)}. Give more data (3 or more examples per class leave "
                f"one for each of val and test), a larger {name}_fraction, or a {name} split of your own")
        source, index = rows[name]
        rows[name] = (source, index[torch.randperm(len(index), generator=generator)])
    return Plan(rows, origins)


def overlap_warnings(keys: dict[str, list[Any]], labels: dict[str, torch.Tensor], what: str) -> list[str]:
    """Identical inputs in two splits (an optimistic test score) or under two labels (a contradiction)."""
    warnings = []
    seen = {split: set(keys[split]) for split in SPLITS}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = seen[a] & seen[b]
        if both:
            warnings.append(f"{len(both)} {what} of {b} also appear in {a} (identical): {b} scores will be optimistic")
    classes: dict[Any, set[int]] = {}
    for split in SPLITS:
        for key, label in zip(keys[split], labels[split].tolist(), strict=True):
            classes.setdefault(key, set()).add(label)
    conflicting = sum(len(c) > 1 for c in classes.values())
    if conflicting:
        warnings.append(f"{conflicting} {what} appear under more than one label")
    return warnings
