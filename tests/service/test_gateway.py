"""The gateway (``service.api.gateway``) on its own, around a small ASGI app: what it adds to every answer, refusals
included, and that once a body is in it leaves the request's later reads alone. The full behaviour over real
servers is in test_admission, test_overload_auth, test_slow_clients, test_request_context and test_drain."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest
from starlette.datastructures import State
from starlette.types import Message, Receive, Scope, Send

from service.api.gateway import Gateway
from service.app import create_app
from service.config import Settings
from service.observability.metrics import Metrics
from service.observability.tracing import Tracing
from service.state import Lifecycle
from tests.service.conftest import metric_value

KEY = "s3cret"


async def echo_body(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, then answers 200 with it."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def gateway(tmp_path: Path, app: Any = echo_body, **settings: Any) -> tuple[Gateway, Metrics, Lifecycle]:
    metrics, lifecycle = Metrics(), Lifecycle()
    values: dict[str, Any] = {"model_repository": tmp_path, "feedback_db": tmp_path / "f.sqlite3", **settings}
    return Gateway(app, Settings(**values), metrics, lifecycle, Tracing(None), State(), frozenset({"/open"}),
                   lambda: ["/models/{name}"]), metrics, lifecycle


def call(app: Gateway, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def requests_counted(metrics: Metrics, endpoint: str, code: int) -> float | None:
    return metric_value(generate_latest(metrics.registry).decode(), "director_requests_total", endpoint=endpoint,
                        code=str(code))


def test_the_app_has_one_layer_in_front_of_its_routes(tmp_path: Path) -> None:
    app = create_app(Settings(model_repository=tmp_path, feedback_db=tmp_path / "f.sqlite3"))
    assert [layer.cls for layer in app.user_middleware] == [Gateway]


def test_a_malformed_request_id_is_refused_with_an_id_of_its_own_and_counted(tmp_path: Path) -> None:
    app, metrics, _ = gateway(tmp_path)
    refused = call(app, "GET", "/models/m", headers={"X-Request-ID": "with space"})
    assert refused.status_code == 400 and "X-Request-ID" in refused.json()["error"]
    assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"]) and "traceparent" in refused.headers
    assert requests_counted(metrics, "/models/{name}", 400) == 1.0


def test_while_draining_every_answer_closes_its_connection_refusals_included(tmp_path: Path) -> None:
    app, metrics, lifecycle = gateway(tmp_path, api_key=KEY)
    assert "connection" not in call(app, "GET", "/open").headers
    lifecycle.draining = True
    refused = call(app, "GET", "/models/m")
    assert refused.status_code == 401 and refused.headers["connection"] == "close"
    answered = call(app, "POST", "/echo", content=b"hello", headers={"Authorization": f"Bearer {KEY}"})
    assert answered.text == "hello" and answered.headers["connection"] == "close"
    assert requests_counted(metrics, "/models/{name}", 401) == 1.0
    assert requests_counted(metrics, "unmatched", 200) == 2.0  # no route here: every path is unmatched


def test_once_the_body_is_in_later_reads_have_no_deadline(tmp_path: Path) -> None:
    """The body's deadline bounds the body only: a read after it (a route waiting for its client to leave) waits as
    long as the client stays, and is the server's own."""
    read_after: list[Message] = []

    async def reads_again(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body", False):
            pass
        await asyncio.sleep(0.2)  # past the body's deadline
        read_after.append(await receive())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app, _, _ = gateway(tmp_path, app=reads_again, body_timeout_s=0.1)
    messages = [{"type": "http.request", "body": b"x", "more_body": False}, {"type": "http.disconnect"}]
    sent: list[Message] = []

    async def receive() -> Message:
        await asyncio.sleep(0.15 if len(messages) == 1 else 0)  # the client leaves after the deadline
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/echo", "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    assert read_after == [{"type": "http.disconnect"}] and sent[0]["status"] == 204
