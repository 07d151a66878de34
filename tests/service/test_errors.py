"""Every bad-input class gets its status code and the one JSON error shape."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.service.conftest import Running, png_base64, random_pixels

SHAPE = {"error", "status", "type", "details"}


def post(server: Running, body: object = None, content: bytes | None = None, **kwargs: object) -> httpx.Response:
    if content is not None:
        return httpx.post(f"{server.url}/predict", content=content, headers={"content-type": "application/json"},
                          timeout=30, **kwargs)
    return httpx.post(f"{server.url}/predict", json=body, timeout=30, **kwargs)


def assert_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == SHAPE and body["status"] == status and isinstance(body["error"], str)
    assert "Traceback" not in response.text
    return body


def one_pixel_input() -> list[dict]:
    return [{"pixels": random_pixels(np.random.default_rng(0))[0]}]


def big_png(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG")  # compresses to a few kB
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(("body", "status"), [
    ({"inputs": [{"image_base64": "!!!not base64!!!"}]}, 400),
    ({"inputs": [{"image_base64": base64.b64encode(b"GIF89a not a png").decode()}]}, 400),
    ({"inputs": [{"image_base64": base64.b64encode(b"\x89PNG\r\n\x1a\n truncated").decode()}]}, 400),
    ({"model": "no-such-model", "inputs": one_pixel_input()}, 404),
    ({"version": "99", "inputs": one_pixel_input()}, 404),
    ({"inputs": [{"image_base64": big_png(1200, 1000)}]}, 413),
    ({"inputs": one_pixel_input() * 33}, 413),
    ({"inputs": [{"text": "x" * 101}]}, 413),
    ({"inputs": one_pixel_input(), "n_samples": 0}, 422),
    ({"inputs": one_pixel_input(), "n_samples": 9}, 422),  # tiny manifest max_samples = 8
    ({"inputs": one_pixel_input(), "n_samples": "four"}, 422),
    ({"inputs": [{"pixels": [[0.5] * 27] * 28}]}, 422),
    ({"inputs": [{"pixels": [[0.5] * 28] * 27 + [[0.5] * 3]}]}, 422),  # ragged
    ({"inputs": [{"pixels": [[[2.0] * 28] * 28]}]}, 422),  # outside [0, 1]
    ({"inputs": [{"text": "a sentence for an image model"}]}, 422),
    ({"inputs": []}, 422),
    ({"inputs": [{"image_base64": "AAAA", "pixels": [[0]]}]}, 422),
    ({"inputs": one_pixel_input(), "unexpected": 1}, 422),
    ({"inputs": one_pixel_input(), "seed": -1}, 422),
])
def test_bad_inputs_get_their_status(tiny_server: Running, body: dict, status: int) -> None:
    assert_error(post(tiny_server, body), status)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_pixels_are_422(tiny_server: Running, token: str) -> None:
    row = ", ".join(["0.5"] * 27 + [token])
    content = ('{"inputs": [{"pixels": [' + ", ".join([f"[{row}]"] * 28) + "]}]}").encode()
    body = assert_error(post(tiny_server, content=content), 422)
    assert "NaN or Inf" in body["error"]


def test_invalid_json_is_400(tiny_server: Running) -> None:
    assert_error(post(tiny_server, content=b'{"inputs": [tru'), 400)


def test_body_over_the_limit_is_413_before_parsing(tiny_server: Running) -> None:
    content = b'{"inputs": [{"image_base64": "' + b"A" * (3 * 1024 * 1024) + b'"}]}'
    assert_error(post(tiny_server, content=content), 413)

    def chunks():  # no Content-Length: the limit applies while the body streams in
        yield b'{"inputs": [{"image_base64": "'
        for _ in range(48):
            yield b"A" * 65536
        yield b'"}]}'

    assert_error(post(tiny_server, content=chunks()), 413)


def test_image_pixel_limit_is_checked_on_the_header(tiny_server: Running) -> None:
    body = assert_error(post(tiny_server, {"inputs": [{"image_base64": big_png(1001, 1000)}]}), 413)
    assert "1001x1000" in body["error"]
    ok = post(tiny_server, {"inputs": [{"image_base64": big_png(1000, 1000)}], "n_samples": 1})
    assert ok.status_code == 200


def test_unknown_route_and_method_use_the_error_shape(tiny_server: Running) -> None:
    assert_error(httpx.get(f"{tiny_server.url}/nope"), 404)
    assert_error(httpx.get(f"{tiny_server.url}/predict"), 405)


def test_errors_never_leak_model_labels_into_metrics(tiny_server: Running) -> None:
    post(tiny_server, {"model": "attacker-chosen-name", "inputs": one_pixel_input()})
    text = httpx.get(f"{tiny_server.url}/metrics").text
    assert "attacker-chosen-name" not in text
    assert 'director_requests_total{code="404",endpoint="/predict"}' in text


def test_png_upload_ok_control(tiny_server: Running) -> None:
    """The same route accepts a valid PNG, so the 400s above are about the bytes, not the route."""
    response = post(tiny_server, {"inputs": [{"image_base64": png_base64(np.zeros((28, 28), np.uint8))}]})
    assert response.status_code == 200
