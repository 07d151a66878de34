"""OpenTelemetry spans (``service.observability.tracing``) exported over OTLP/HTTP to a real receiver on loopback:
the request's server span continues the caller's traceparent and carries the response's ids, and the prediction's
queue and inference spans nest under it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.service.conftest import random_pixels, serve, settings_for

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP collector that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                message = ExportTraceServiceRequest.FromString(body)
                receiver.spans += [span for resource in message.resource_spans for scope in resource.scope_spans
                                   for span in scope.spans]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_a_prediction_is_traced_under_the_callers_trace(tiny_repository: Path, tmp_path: Path,
                                                        receiver: Receiver) -> None:
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    body = {"inputs": [{"pixels": random_pixels(np.random.default_rng(0), 1)[0]}], "n_samples": 2}
    with serve(settings_for(tiny_repository, tmp_path, otlp_endpoint=endpoint)) as server:
        response = httpx.post(f"{server.url}/predict", json=body,
                              headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        assert response.status_code == 200
        _, trace_id, span_id, flags = response.headers["traceparent"].split("-")
        assert trace_id == CALLER_TRACE and span_id != CALLER_SPAN and flags == "01"
    # the server's shutdown exported what was buffered
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    by_name = {span.name: span for span in receiver.spans}
    request = by_name["POST /predict"]
    assert request.trace_id.hex() == CALLER_TRACE and request.parent_span_id.hex() == CALLER_SPAN
    assert request.span_id.hex() == span_id
    for name in ("queue", "inference"):
        child = by_name[name]
        assert child.trace_id == request.trace_id and child.parent_span_id == request.span_id, name
        assert request.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
    assert by_name["queue"].end_time_unix_nano == by_name["inference"].start_time_unix_nano
    attributes = {a.key: a.value for a in by_name["inference"].attributes}
    assert attributes["model"].string_value == "tiny" and attributes["n_samples"].int_value == 2
    status = {a.key: a.value.int_value for a in request.attributes}["http.response.status_code"]
    assert status == 200


def test_no_endpoint_no_spans_and_the_ids_still_flow(tiny_server: object) -> None:
    """Off by default: the response still continues the caller's trace with a fresh span id, as before."""
    response = httpx.get(f"{tiny_server.url}/health/live",  # type: ignore[attr-defined]
                         headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    _, trace_id, span_id, flags = response.headers["traceparent"].split("-")
    assert trace_id == CALLER_TRACE and span_id != CALLER_SPAN and flags == "01"
    assert not tiny_server.app_state.predictor.tracing.enabled  # type: ignore[attr-defined]


@pytest.mark.parametrize("collector", ["closed", "silent"])
def test_a_dead_collector_cannot_hold_the_shutdown(collector: str) -> None:
    """A collector whose port is closed, or that accepts and never answers: the buffered span's export gives up
    within the export timeout (its default retries made a shutdown take 30 s)."""
    import socket
    import time

    from service.observability.tracing import EXPORT_TIMEOUT_S, Tracing

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if collector == "silent":
            listener.listen(8)  # connections are accepted by the kernel and never read
        else:
            listener.close()
        tracing = Tracing(f"http://127.0.0.1:{port}")
        now = time.time_ns()
        tracing.span("inference", now, now + 1000, {})
        started = time.monotonic()
        tracing.shutdown()
        took = time.monotonic() - started
    assert took < 3 * EXPORT_TIMEOUT_S + 2, took  # 30 s before; a loose bound, not a speed claim
