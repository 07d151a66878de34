"""Inputs that used to answer 500 (issue 13): each class over real HTTP, on /predict, /feedback and the OIP route.

Every answer must be the one JSON error shape with a 4xx code, never a 500 or a traceback, and the keep-alive
connection must stay usable (a 500 used to close it). Where a check has to come before inference, the predictions
counter proves that no forward ran."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest

from tests.service.conftest import TEXT_MODEL, Running, metric_value, random_pixels

SHAPE = {"error", "status", "type", "details"}
HUGE = 10**400  # an integer no float can hold; json.dumps writes all its digits
LONE = "\ud800"  # a lone UTF-16 surrogate; json.dumps escapes it as valid JSON syntax, but it is not Unicode text
OIP = "/v2/models/tiny/infer"


def send(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    """POST ``body`` as json.dumps writes it (ASCII, surrogates escaped), or raw when it is already a string."""
    content = body if isinstance(body, str) else json.dumps(body)
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


def assert_error(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    """The error shape with ``status``; each of ``words`` in the message or in the details."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == SHAPE and body["status"] == status and "Traceback" not in response.text
    for word in words:
        assert word in json.dumps(body, ensure_ascii=False), body
    return body


def pixels_body(last: Any) -> dict[str, Any]:
    """/predict pixels [28][28] whose last value is ``last``."""
    rows = [[0.5] * 28 for _ in range(28)]
    rows[-1][-1] = last
    return {"inputs": [{"pixels": rows}]}


def oip_pixels(data: list[Any], datatype: str = "FP32", **extra: Any) -> dict[str, Any]:
    """An OIP request for one 1x28x28 image; ``extra`` adds top-level members."""
    return {"inputs": [{"name": "pixels", "datatype": datatype, "shape": [1, 1, 28, 28], "data": data}], **extra}


GOOD = [0.5] * 784


def predictions(server: Running, model: str = "tiny") -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return metric_value(text, "director_predictions_total", model=model, version="1") or 0.0


@pytest.fixture
def client(tiny_server: Running) -> httpx.Client:
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        yield client


@pytest.fixture
def text_client(text_server: Running) -> httpx.Client:
    with httpx.Client(base_url=text_server.url, timeout=60) as client:
        yield client


# ---- pixel values too large for a float --------------------------------------------------------------------------

def test_pixel_values_beyond_any_float_are_422(client: httpx.Client) -> None:
    assert_error(send(client, "/predict", pixels_body(HUGE)), 422, "[0, 1]")
    assert_error(send(client, "/predict", pixels_body(-HUGE)), 422, "[0, 1]")
    for datatype in ("FP32", "FP64", "FP16", "UINT8"):
        assert_error(send(client, OIP, oip_pixels([0] * 783 + [HUGE], datatype)), 422)
    assert client.get("/health/live").status_code == 200  # the same keep-alive connection still serves


def test_fp16_values_that_overflow_half_precision_are_422(client: httpx.Client) -> None:
    body = assert_error(send(client, OIP, oip_pixels([0] * 783 + [70000], "FP16")), 422)
    assert "[0, 1]" in body["error"]


# ---- OIP UINT8 data outside 0..255 -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [256, -1, 300, 1.5])
def test_oip_uint8_data_must_be_whole_numbers_in_0_255(client: httpx.Client, value: float) -> None:
    body = assert_error(send(client, OIP, oip_pixels([0] * 783 + [value], "UINT8")), 422)
    assert "UINT8" in body["error"] and "0..255" in body["error"]


def test_oip_uint8_in_range_is_scaled_and_served(client: httpx.Client) -> None:
    response = send(client, OIP, oip_pixels([255] * 392 + [0] * 392, "UINT8"))
    assert response.status_code == 200, response.text


# ---- lone UTF-16 surrogates --------------------------------------------------------------------------------------

def test_lone_surrogate_in_text_is_422_on_predict(text_client: httpx.Client) -> None:
    body = assert_error(send(text_client, "/predict", {"inputs": [{"text": "fine"}, {"text": f"bad {LONE} here"}]}),
                        422, "surrogate")
    assert body["details"][0]["loc"][:4] == ["body", "inputs", 1, "text"]
    ok = text_client.post("/predict", json={"inputs": [{"text": "fine 😀 ✓"}], "n_samples": 1})  # real non-BMP
    assert ok.status_code == 200, ok.text


def test_lone_surrogate_in_text_is_422_on_oip(text_client: httpx.Client, text_server: Running) -> None:
    before = predictions(text_server, TEXT_MODEL)
    content = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["ok", "x\udfffy"]}]}
    body = assert_error(send(text_client, f"/v2/models/{TEXT_MODEL}/infer", content), 422, "surrogate")
    assert body["details"][0]["loc"] == ["body", "inputs", 0, "data", 1]
    assert predictions(text_server, TEXT_MODEL) == before


@pytest.mark.parametrize("content", [{"model": f"m{LONE}", "inputs": [{"pixels": [[0.5]]}]},
                                     {"version": LONE, "inputs": [{"pixels": [[0.5]]}]}])
def test_lone_surrogate_in_names_is_422(client: httpx.Client, content: dict[str, Any]) -> None:
    assert_error(send(client, "/predict", content), 422, "surrogate")


def test_oip_id_must_be_a_unicode_string_checked_before_inference(client: httpx.Client, tiny_server: Running
                                                                   ) -> None:
    before = predictions(tiny_server)
    assert_error(send(client, OIP, oip_pixels(GOOD, id=f"req-{LONE}")), 422, "surrogate")
    assert_error(send(client, OIP, oip_pixels(GOOD, id=[1, 2])), 422, "id")
    assert predictions(tiny_server) == before
    ok = send(client, OIP, oip_pixels(GOOD, id="café 😀"))  # json.dumps escapes 😀 as a surrogate pair: fine
    assert ok.status_code == 200 and ok.json()["id"] == "café 😀"


# ---- /feedback index beyond SQLite's integers --------------------------------------------------------------------

@pytest.mark.parametrize("index", [2**63, 2**64, 10**30])
def test_feedback_index_beyond_64_bits_is_422(client: httpx.Client, index: int) -> None:
    body = assert_error(client.post("/feedback", json={"id": "abc", "index": index, "label": 1}), 422)
    assert body["details"][0]["loc"] == ["body", "index"]


def test_feedback_at_the_bounds_is_a_plain_lookup(client: httpx.Client) -> None:
    assert_error(client.post("/feedback", json={"id": "abc", "index": 2**63 - 1, "label": 1}), 404)
    body = assert_error(send(client, "/feedback", {"id": f"a{LONE}", "index": 0, "label": 1}), 422, "unicode")
    assert body["details"][0]["loc"] == ["body", "id"]
    assert_error(send(client, "/feedback", {"id": "abc", "index": 0, "label": LONE}), 422, "surrogate")


# ---- OIP parameters, seed and outputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("parameters", [[1], "n_samples=2", 3, True])
def test_oip_request_parameters_must_be_an_object(client: httpx.Client, parameters: Any) -> None:
    body = assert_error(send(client, OIP, oip_pixels(GOOD, parameters=parameters)), 422,
                        "parameters")
    assert body["details"][0]["loc"] == ["body", "parameters"]


@pytest.mark.parametrize("parameters", [[1], "binary", 7])
def test_oip_input_parameters_must_be_an_object(client: httpx.Client, parameters: Any) -> None:
    content = oip_pixels(GOOD)
    content["inputs"][0]["parameters"] = parameters
    body = assert_error(send(client, OIP, content), 422, "parameters")
    assert body["details"][0]["loc"] == ["body", "inputs", 0, "parameters"]


@pytest.mark.parametrize("seed", [2**63, 2**64, 10**40])
def test_oip_seed_beyond_the_range_is_422(client: httpx.Client, tiny_server: Running, seed: int) -> None:
    before = predictions(tiny_server)
    body = assert_error(send(client, OIP, oip_pixels(GOOD, parameters={"seed": seed})), 422,
                        "seed")
    assert str(2**63 - 1) in body["error"]
    assert predictions(tiny_server) == before


def test_oip_largest_seed_is_served(client: httpx.Client) -> None:
    response = send(client, OIP, oip_pixels(GOOD, parameters={"seed": 2**63 - 1}))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("outputs", [{"name": "label"}, "label", [1], ["label"], [{"name": 3}],
                                     [{"name": "no-such-output"}], [{}], [{"name": "tokens"}]])
def test_oip_outputs_are_checked_before_inference(client: httpx.Client, tiny_server: Running, outputs: Any) -> None:
    before = predictions(tiny_server)
    body = assert_error(send(client, OIP, oip_pixels(GOOD, outputs=outputs)), 422, "outputs")
    assert body["details"][0]["loc"][:2] == ["body", "outputs"]
    assert predictions(tiny_server) == before


def test_oip_named_outputs_still_work(client: httpx.Client) -> None:
    response = send(client, OIP, oip_pixels(GOOD, outputs=[{"name": "label"}, {"name": "is_ood"}]))
    assert response.status_code == 200, response.text
    assert [o["name"] for o in response.json()["outputs"]] == ["label", "is_ood"]


# ---- deeply nested JSON ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/predict", OIP, "/feedback"])
@pytest.mark.parametrize("depth", [100_000, 1_000_000])
def test_deeply_nested_json_is_400_everywhere(client: httpx.Client, path: str, depth: int) -> None:
    assert_error(send(client, path, "[" * depth + "]" * depth), 400)
    assert_error(send(client, path, '{"inputs": ' + "[" * depth + "]" * depth + "}"), 400)
    assert client.get("/health/live").status_code == 200


def test_a_nested_body_within_the_limit_is_not_refused_for_depth(client: httpx.Client) -> None:
    """A legitimately nested body (pixels [C][H][W] inside inputs) parses as before."""
    body = json.dumps({"inputs": [{"pixels": random_pixels(np.random.default_rng(0))[0]}], "n_samples": 1})
    assert send(client, "/predict", body).status_code == 200
