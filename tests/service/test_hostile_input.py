"""Inputs that used to answer 500 or the wrong code: each class over real HTTP, on /predict, /feedback and
the OIP route, plus images over Pillow's bomb limit (413) and malformed requests.

Every answer the app gives must be the one JSON error shape with a 4xx code, never a 500 or a traceback, and the
keep-alive connection must stay usable (a 500 used to close it). Where a check has to come before inference, the
predictions counter proves that no forward ran."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import zlib
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from PIL import Image

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
    body = assert_error(send(client, "/feedback", {"id": f"a{LONE}", "index": 0, "label": 1}), 422, "surrogate")
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


# ---- images over Pillow's own decompression-bomb limit -------------------------------------------------------------

def png_header_only(width: int, height: int) -> str:
    """A PNG whose header claims ``width`` x ``height`` (a few dozen bytes: the pixels are never there), base64."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


@pytest.mark.parametrize(("width", "height"), [(10_000, 10_000), (20_000, 10_000), (2**31 - 1, 2**31 - 1)])
def test_images_over_pillows_bomb_limit_are_413(client: httpx.Client, width: int, height: int) -> None:
    """From twice its own limit (2 x 89 M pixels) Pillow refuses an image inside open(), before the server's header
    check: 413 like every image over the pixel limit, not 400."""
    body = assert_error(send(client, "/predict", {"inputs": [{"image_base64": png_header_only(width, height)}]}), 413,
                        "inputs.0.image_base64", "the limit is 1000000")
    assert body["type"] == "too_large"
    files = {"file": ("bomb.png", base64.b64decode(png_header_only(width, height)), "image/png")}
    assert_error(client.post("/predict/image", files=files), 413)


def test_a_header_just_over_the_servers_limit_names_its_size(client: httpx.Client) -> None:
    body = assert_error(send(client, "/predict", {"inputs": [{"image_base64": png_header_only(1001, 1000)}]}), 413)
    assert "1001x1000" in body["error"]


# ---- protocol-level errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "kwargs", "status"), [
    ("/predict/image", {"content": b"--x\r\nbroken", "headers": {"Content-Type": "multipart/form-data"}}, 400),
    ("/predict/image", {"content": b"--x\r\nbroken", "headers": {"Content-Type": "multipart/form-data; boundary=x"}},
     422),
    ("/predict/image", {"content": b"not a form", "headers": {"Content-Type": "text/plain"}}, 422),
    ("/predict", {"content": b'{"inputs": []}', "headers": {"Content-Type": "text/plain"}}, 422),
    ("/predict", {"content": b"\xff\xfe\x00garbage", "headers": {"Content-Type": "application/json"}}, 400),
    ("/feedback", {"content": b"", "headers": {"Content-Type": "application/json"}}, 422),
])
def test_malformed_bodies_the_app_sees_get_the_error_shape(client: httpx.Client, path: str, kwargs: dict[str, Any],
                                                           status: int) -> None:
    response = client.post(path, **kwargs)
    assert response.headers["content-type"] == "application/json"
    assert_error(response, status)


@pytest.mark.parametrize(("method", "path", "status"), [("PUT", "/predict", 405), ("DELETE", "/models", 405),
                                                        ("GET", "/v2/models/tiny/infer", 405),
                                                        ("GET", "/%ff%fe", 404), ("GET", "/predict/x", 404)])
def test_routing_errors_get_the_error_shape(client: httpx.Client, method: str, path: str, status: int) -> None:
    assert_error(client.request(method, path), status)


def test_malformed_http_is_answered_by_uvicorn_in_plain_text(tiny_server: Running) -> None:
    """Below the app: a request uvicorn cannot parse never reaches it, so the answer is uvicorn's own plain-text 400
    and the connection closes (docs/api.md, Errors). Pinned here so that the documentation stays true."""
    parts = urlsplit(tiny_server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"text/plain" in head.lower() and b"Invalid HTTP request" in body


# ---- loose numbers, repeated names, long names, damaged PNG chunks -----------------------------------------------
@pytest.mark.parametrize("field,value", [("n_samples", True), ("n_samples", "8"), ("n_samples", 4.0),
                                         ("seed", True), ("seed", 1e18), ("seed", "7")])
def test_sample_counts_and_seeds_must_be_json_integers(client: httpx.Client, tiny_server: Running, field: str,
                                                       value: Any) -> None:
    before = predictions(tiny_server)
    body = assert_error(send(client, "/predict", {**pixels_body(0.5), field: value}), 422, field)
    assert any(d["loc"][-1] == field for d in body["details"])
    assert predictions(tiny_server) == before


@pytest.mark.parametrize("label", [True, 1.0])
def test_feedback_labels_are_names_or_integers(client: httpx.Client, label: Any) -> None:
    assert_error(send(client, "/feedback", {"id": "x", "index": 0, "label": label}), 422, "label")


def test_feedback_index_must_be_an_integer(client: httpx.Client) -> None:
    assert_error(send(client, "/feedback", {"id": "x", "index": "0", "label": 1}), 422, "index")


def test_oip_inputs_named_twice_are_422(client: httpx.Client, tiny_server: Running) -> None:
    before = predictions(tiny_server)
    twice = {"inputs": [*oip_pixels(GOOD)["inputs"], *oip_pixels(GOOD)["inputs"]]}
    assert_error(send(client, OIP, twice), 422, "given twice")
    assert predictions(tiny_server) == before


def test_long_names_are_not_echoed_back(client: httpx.Client) -> None:
    name = "m" * 1_000_000  # within the body limit
    response = send(client, "/predict", {**pixels_body(0.5), "model": name})
    assert_error(response, 422, "model")
    assert len(response.content) < 2_000
    response = client.get(f"/models/{'m' * 5_000}")
    assert_error(response, 404, "5,000 characters")
    assert len(response.content) < 2_000


def test_a_png_whose_image_data_fails_its_crc_is_400(client: httpx.Client, tiny_server: Running) -> None:
    """Pillow would decode the damaged pixels; the server refuses the file (docs/api.md)."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((28, 28), 120, dtype=np.uint8), "L").save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    at = data.index(b"IDAT")
    data[at + 8] ^= 0x01  # the first byte of the compressed data: its CRC no longer matches
    before = predictions(tiny_server)
    encoded = base64.b64encode(bytes(data)).decode()
    assert_error(send(client, "/predict", {"inputs": [{"image_base64": encoded}]}), 400, "'IDAT'", "CRC")
    assert predictions(tiny_server) == before
    good = base64.b64encode(buffer.getvalue()).decode()
    assert send(client, "/predict", {"inputs": [{"image_base64": good}]}).status_code == 200


def test_too_many_inputs_are_counted_before_the_body_is_validated(client: httpx.Client) -> None:
    """33 inputs that would each fail validation, one over the shared server's limit of 32: the count refuses them
    first (413, not 422), so a body of a million small inputs never reaches the per-input validation on the event
    loop."""
    response = client.post("/predict", json={"inputs": [{"not an input": 1}] * 33})
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "33 inputs in one request, the limit is 32"
    assert client.post("/predict", json={"inputs": [{"not an input": 1}] * 2}).status_code == 422
