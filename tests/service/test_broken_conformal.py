"""A broken conformal part is refused at load, with the reason, instead of loading READY and answering wrongly: each
variant an operator's faulty tool could write (its sha256 updated, so only the contents are wrong) leaves its version
unavailable on ``GET /models`` while an intact copy beside it serves; the contract's checks refuse the same variants
of a multi-label version's label-recall file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from artifact.conformal import CONFORMAL_FILE
from artifact.contract import MANIFEST
from artifact.multi_label import LabelRecall, read_label_recall_file
from tests.service.conftest import Running, copy_version, rehash, serve, settings_for

Edit = Callable[[dict[str, Any], dict[str, Any]], None]  # (manifest, conformal document) changed in place


def first_score(document: dict[str, Any]) -> list[float]:
    return document["scores"][next(iter(document["scores"]))]


def set_first(document: dict[str, Any], value: Any) -> None:
    first_score(document)[0] = value


BROKEN: dict[str, Edit] = {
    "inverted coverage range": lambda m, d: m["conformal"].update(coverage_range=[0.9, 0.5]),
    "coverage range reaching 1": lambda m, d: m["conformal"].update(coverage_range=[0.5, 1.0]),
    "a risk level of 2": lambda m, d: m["conformal"].update(risk_levels=[*m["conformal"]["risk_levels"][:-1], 2.0]),
    "string thresholds": lambda m, d: d["selective"]["thresholds"].update(
        {k: "0.5" for k in d["selective"]["thresholds"]}),
    "thresholds of 5": lambda m, d: d["selective"]["thresholds"].update({k: 5.0 for k in d["selective"]["thresholds"]}),
    "a NaN score": lambda m, d: set_first(d, float("nan")),
    "a negative score": lambda m, d: set_first(d, -3.0),
    "a boolean score": lambda m, d: set_first(d, True),
    "scores out of order": lambda m, d: first_score(d).reverse(),
    "no selective part": lambda m, d: d.pop("selective"),
}


def broken_copy(source: Path, target: Path, edit: Edit) -> Path:
    shutil.copytree(source, target)
    manifest = json.loads((target / MANIFEST).read_text())
    document = json.loads((target / CONFORMAL_FILE).read_text())
    edit(manifest, document)
    (target / CONFORMAL_FILE).write_text(json.dumps(document))  # NaN written as JSON's NaN, as a faulty tool would
    rehash(target, manifest)
    return target


@pytest.fixture(scope="module")
def server(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, list[str]]]:
    tmp = tmp_path_factory.mktemp("broken-conformal")
    repository = tmp / "repository"
    copy_version(tiny_artifact, repository, "tiny", "1")
    names = []
    for i, (name, edit) in enumerate(BROKEN.items()):
        copy_version(broken_copy(tiny_artifact, tmp / f"broken-{i}", edit), repository, f"broken-{i}", "1")
        names.append(name)
    with serve(settings_for(repository, tmp, default_model="tiny")) as running:
        yield running, names


def test_every_broken_conformal_part_leaves_its_version_unavailable(server: tuple[Running, list[str]]) -> None:
    running, names = server
    models = {m["name"]: m for m in httpx.get(f"{running.url}/models", timeout=10).json()["models"]}
    assert models["tiny"]["versions"][0]["state"] == "ready"
    for i, name in enumerate(names):
        (version,) = models[f"broken-{i}"]["versions"]
        assert version["state"] == "unavailable", name
        assert "conformal" in version["reason"] and "Traceback" not in version["reason"], (name, version["reason"])
        response = httpx.post(f"{running.url}/predict", timeout=30,
                              json={"model": f"broken-{i}", "inputs": [{"pixels": [[[0.5] * 28] * 28]}],
                                    "coverage": 0.9})
        assert response.status_code == 503 and "conformal" in response.json()["error"], (name, response.text)


@pytest.mark.parametrize(("change", "message"), [
    ({"coverage_range": (0.9, 0.5)}, "coverage_range"),
    ({"n": 10**9}, "does not fit"),
])
def test_a_broken_label_recall_part_is_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    (tmp_path / "label_recall.json").write_text(json.dumps({"probabilities": [0.2, 0.5, 0.9],
                                                             "weights": [1.0, 0.5, 0.5]}))
    fields = {"n": 3, "entries": 3, "split": "a tenth of validation", **change}
    with pytest.raises(ValueError, match=message):
        read_label_recall_file(tmp_path, LabelRecall.model_validate(fields))
    intact = LabelRecall.model_validate({"n": 3, "entries": 3, "split": "a tenth of validation"})
    assert read_label_recall_file(tmp_path, intact)["weights"] == [1.0, 0.5, 0.5]
