"""Fuzzing over real HTTP: schemathesis against the running server's own ``/openapi.json`` (every operation,
derandomized, a bounded number of examples each) and hypothesis generators of *valid* image, pixel and text
requests for ``/predict`` and the Open Inference Protocol route. No response may be a 5xx, and every 200 body must
be a consistent prediction. Sizes here keep the file to well under a minute of requests; the long run (>= 20,000
requests) is ``DIRECTOR_FUZZ_EXAMPLES=1500 pytest tests/service/test_fuzz.py`` (docs/operations.md)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import TEXT_MODEL, Running, png_base64

EXAMPLES = int(os.environ.get("DIRECTOR_FUZZ_EXAMPLES", "12"))  # per operation and per generator
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
REPORT = os.environ.get("DIRECTOR_FUZZ_REPORT")  # the long run writes its server-side status counts here


def status_counts(server: Running) -> dict[str, float]:
    """``director_requests_total`` summed by status code, as the server itself counted them."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=30).text):
        if family.name == "director_requests":
            for sample in family.samples:
                if sample.name == "director_requests_total":
                    counts[sample.labels["code"]] = counts.get(sample.labels["code"], 0) + sample.value
    return counts


@pytest.fixture(scope="module", autouse=True)
def server_side_tally(tiny_server: Running, text_server: Running) -> Iterator[None]:
    """The servers' own request counters over this file's traffic: no 5xx may appear there either (a response
    the client never saw, such as one lost to a reset connection, is still counted by the server)."""
    before = {name: status_counts(server) for name, server in (("image", tiny_server), ("text", text_server))}
    yield
    after = {name: status_counts(server) for name, server in (("image", tiny_server), ("text", text_server))}
    delta: dict[str, int] = {}
    for name, counts in after.items():
        for code, value in counts.items():
            delta[code] = delta.get(code, 0) + int(value - before[name].get(code, 0))
    if REPORT:
        Path(REPORT).write_text(json.dumps({"examples_per_test": EXAMPLES, "requests": sum(delta.values()),
                                            "by_status": dict(sorted(delta.items()))}, indent=2) + "\n")
    assert sum(delta.values()) > 0
    assert not {code: n for code, n in delta.items() if code.startswith("5") and n}, delta


def test_no_operation_answers_5xx(tiny_server: Running) -> None:
    """Every operation of the served schema, each with its own derandomized hypothesis run."""
    schema = schemathesis.openapi.from_url(f"{tiny_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15  # the schema really was read: predict, feedback, models, health, metrics, OIP
    for operation in operations:

        @FUZZ
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            case.call_and_validate(base_url=tiny_server.url, checks=[schemathesis.checks.not_a_server_error],
                                   timeout=60)

        call()


# ---- valid requests ----------------------------------------------------------------------------------------------

@st.composite
def images(draw: st.DrawFn) -> dict[str, str]:
    """A PNG of any small size, grey or colour (the server converts size and mode)."""
    height, width = draw(st.integers(1, 48)), draw(st.integers(1, 48))
    shape = (height, width) if draw(st.booleans()) else (height, width, 3)
    seed = draw(st.integers(0, 2**32 - 1))
    return {"image_base64": png_base64(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))}


@st.composite
def pixel_arrays(draw: st.DrawFn) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([0.0, 1.0]))  # all zeros, or uniform in [0, 1]
    extremes = draw(st.booleans())  # exact 0 and 1 at the edges of the range
    values = np.random.default_rng(seed).random((1, 28, 28)) * scale
    return np.round(values) if extremes else values


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=200).filter(
    lambda t: t.strip() != "")
n_samples = st.one_of(st.none(), st.integers(1, 8))
seeds = st.one_of(st.none(), st.integers(0, 2**63 - 1))


def image_inputs() -> st.SearchStrategy[list[dict[str, Any]]]:
    pixels = pixel_arrays().map(lambda a: {"pixels": a.tolist()})
    return st.lists(st.one_of(images(), pixels), min_size=1, max_size=4)


def check_prediction(prediction: dict[str, Any], labels: list[str] | None) -> None:
    numbers = [prediction[k] for k in ("confidence", "predictive_entropy", "expected_entropy", "mutual_information",
                                       "ood_score")]
    assert all(isinstance(x, float | int) and math.isfinite(x) for x in numbers), prediction
    probabilities = prediction["probabilities"]
    assert all(math.isfinite(p) and 0 <= p <= 1 for p in probabilities.values())
    assert abs(sum(probabilities.values()) - 1) < 1e-4
    assert prediction["label"] == max(probabilities, key=probabilities.get)
    assert abs(prediction["confidence"] - probabilities[prediction["label"]]) < 1e-6
    if labels is not None:
        assert list(probabilities) == labels and labels[prediction["class_index"]] == prediction["label"]
    assert prediction["predictive_entropy"] >= -1e-6 and prediction["mutual_information"] >= -1e-5


def check_predict(response: httpx.Response, body: dict[str, Any], model: str) -> None:
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["model"] == model
    if body.get("n_samples") is not None:
        assert result["n_samples"] == body["n_samples"]
    assert [p["index"] for p in result["predictions"]] == list(range(len(body["inputs"])))
    labels = list(result["predictions"][0]["probabilities"])
    for prediction in result["predictions"]:
        check_prediction(prediction, labels)


def check_oip(response: httpx.Response, count: int) -> None:
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    probabilities = np.asarray(outputs["probabilities"]["data"], dtype=float).reshape(outputs["probabilities"]["shape"])
    assert probabilities.shape[0] == count and np.isfinite(probabilities).all()
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-4)
    assert np.allclose(outputs["confidence"]["data"], probabilities.max(axis=1), atol=1e-6)
    assert len(outputs["label"]["data"]) == count and outputs["is_ood"]["shape"] == [count]
    for name in ("predictive_entropy", "expected_entropy", "mutual_information", "ood_score"):
        assert outputs[name]["shape"] == [count] and all(math.isfinite(x) for x in outputs[name]["data"])


@pytest.fixture(scope="module")
def client(tiny_server: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def text_client(text_server: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=text_server.url, timeout=60) as c:
        yield c


@FUZZ
@given(inputs=image_inputs(), n=n_samples, seed=seeds)
def test_valid_image_and_pixel_requests_are_answered_consistently(client: httpx.Client, inputs: list[dict[str, Any]],
                                                                  n: int | None, seed: int | None) -> None:
    body = {"inputs": inputs, "n_samples": n, "seed": seed}
    check_predict(client.post("/predict", json=body), body, "tiny")


@FUZZ
@given(inputs=st.lists(texts.map(lambda t: {"text": t}), min_size=1, max_size=4), n=n_samples, seed=seeds)
def test_valid_text_requests_are_answered_consistently(text_client: httpx.Client, inputs: list[dict[str, Any]],
                                                       n: int | None, seed: int | None) -> None:
    body = {"inputs": inputs, "n_samples": n, "seed": seed}
    check_predict(text_client.post("/predict", json=body), body, TEXT_MODEL)


@FUZZ
@given(arrays=st.lists(pixel_arrays(), min_size=1, max_size=4), n=n_samples)
def test_valid_oip_pixel_requests_are_answered_consistently(client: httpx.Client, arrays: list[np.ndarray],
                                                            n: int | None) -> None:
    batch = np.stack(arrays)
    body: dict[str, Any] = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(batch.shape),
                                        "data": batch.ravel().tolist()}]}
    if n is not None:
        body["parameters"] = {"n_samples": n}
    check_oip(client.post("/v2/models/tiny/infer", json=body), len(arrays))


@FUZZ
@given(items=st.lists(texts, min_size=1, max_size=4), n=n_samples)
def test_valid_oip_text_requests_are_answered_consistently(text_client: httpx.Client, items: list[str],
                                                           n: int | None) -> None:
    body: dict[str, Any] = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(items)], "data": items}]}
    if n is not None:
        body["parameters"] = {"n_samples": n}
    check_oip(text_client.post(f"/v2/models/{TEXT_MODEL}/infer", json=body), len(items))
