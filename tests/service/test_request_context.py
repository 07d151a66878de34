"""Request ids, W3C trace context, the access log and JSON log lines (``service.api.request_context``,
``service.observability.logs``), over a real server."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import httpx
import pytest

from service.observability.logs import JsonFormatter
from tests.service.conftest import Running, serve, settings_for

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_request_id_is_echoed_or_generated_and_a_bad_one_refused(tiny_server: Running) -> None:
    given = httpx.get(f"{tiny_server.url}/models", headers={"X-Request-ID": "client-42:retry.1"}, timeout=30)
    assert given.headers["x-request-id"] == "client-42:retry.1"
    made = httpx.get(f"{tiny_server.url}/models", timeout=30).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    assert made != httpx.get(f"{tiny_server.url}/models", timeout=30).headers["x-request-id"]
    for bad in ("x" * 129, "with space", "semi;colon"):
        refused = httpx.get(f"{tiny_server.url}/models", headers={"X-Request-ID": bad}, timeout=30)
        assert refused.status_code == 400 and "X-Request-ID" in refused.json()["error"]
    unauthenticated = httpx.get(f"{tiny_server.url}/nope", timeout=30)  # every answer carries one, errors too
    assert unauthenticated.status_code == 404 and "x-request-id" in unauthenticated.headers


def test_traceparent_continues_a_valid_trace_and_starts_one_otherwise(tiny_server: Running) -> None:
    valid = f"00-{TRACE}-00f067aa0ba902b7-01"
    answered = httpx.get(f"{tiny_server.url}/models", headers={"traceparent": valid}, timeout=30)
    version, trace, span, flags = answered.headers["traceparent"].split("-")
    assert (version, trace, flags) == ("00", TRACE, "01") and span != "00f067aa0ba902b7"  # this hop's own span
    # a later version with a field more is read as version 00 (W3C); it started a new trace
    later = f"01-{TRACE}-00f067aa0ba902b7-01-what-comes-next"
    continued = httpx.get(f"{tiny_server.url}/models", headers={"traceparent": later}, timeout=30)
    assert continued.headers["traceparent"].split("-")[1] == TRACE
    for broken in ("00-zz-00f067aa0ba902b7-01", f"00-{'0' * 32}-00f067aa0ba902b7-01", "garbage",
                   f"00-{TRACE}-00f067aa0ba902b7-01-extra", f"ff-{TRACE}-00f067aa0ba902b7-01"):
        fresh = httpx.get(f"{tiny_server.url}/models", headers={"traceparent": broken}, timeout=30)
        assert fresh.status_code == 200
        assert fresh.headers["traceparent"].split("-")[1] not in (TRACE, "0" * 32)


def test_access_log_lines_carry_the_request_fields(tiny_repository: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with serve(settings_for(tiny_repository, tmp_path, access_log=True)) as running, \
            caplog.at_level(logging.INFO, logger="service.access"):
        body = {"inputs": [{"pixels": [[[0.0] * 28] * 28]}], "n_samples": 2}
        httpx.post(f"{running.url}/predict", json=body, headers={"X-Request-ID": "abc-1",
                                                                 "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
                   timeout=30)
        httpx.get(f"{running.url}/models/nope", timeout=30)
    records = [r for r in caplog.records if r.name == "service.access"]
    predict = next(r for r in records if r.fields["request_id"] == "abc-1")
    assert predict.fields | {"duration_ms": 0, "client": None} == {
        "method": "POST", "path": "/predict", "status": 200, "duration_ms": 0, "client": None,
        "request_id": "abc-1", "trace_id": TRACE}
    assert any(r.fields["path"] == "/models/{name}" and r.fields["status"] == 404 for r in records)  # templates
    line = json.loads(JsonFormatter().format(predict))
    assert line["logger"] == "service.access" and line["request_id"] == "abc-1" and line["status"] == 200
    assert line["level"] == "info" and line["time"].endswith("+00:00")
