"""Pure ASGI middleware: the request body's bounds (size and arrival time), per-request HTTP metrics and the access
log, and ``Connection: close`` while draining (admission control is in ``service.api.admission``, request ids in
``service.api.request_context``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_response
from service.observability.metrics import Metrics

ENDPOINT_KEY = "director.endpoint"  # route template of a request answered before routing (service.api.admission)
REQUEST_KEY = "director.request"  # {"request_id", "trace_id", "span_id"}, set by service.api.request_context
access_log = logging.getLogger("service.access")


class BodyLimit:
    """413 for a body over ``max_bytes`` (from Content-Length at once, or while a chunked body streams in); 408 for a
    body that has not arrived in full ``timeout_s`` after the request's headers.

    Why a deadline on the whole body and not per read: a client that trickles one byte every few seconds would pass
    any per-read timeout and hold its connection (and what the request holds) for as long as it likes. The 408 asks
    uvicorn to close the connection: whatever the client still sends is never read."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"request body larger than {self.max_bytes} bytes"
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await error_response(413, message)(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        seen = 0
        started = refused = complete = False

        async def refuse(status: int, text: str, headers: dict[str, str] | None = None) -> Message:
            nonlocal refused
            # answer now (unless the app already answers); the app then sees a disconnected client and whatever it
            # sends is dropped
            if not started:
                refused = True
                await error_response(status, text, headers=headers)(scope, receive, send)
            return {"type": "http.disconnect"}

        async def limited_receive() -> Message:
            nonlocal seen, complete
            if refused:
                return {"type": "http.disconnect"}
            if complete:  # the body is in: later reads only wait for a disconnect, with no deadline
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    msg = await receive()
            except TimeoutError:
                return await refuse(408, f"request body not received in full within {self.timeout_s:g} s",
                                    {"Connection": "close"})
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                complete = not msg.get("more_body", False)
                if seen > self.max_bytes and not started:
                    return await refuse(413, message)
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise


class HttpMetrics:
    """``director_requests_total{endpoint,code}`` and latency, labelled by route template (bounded); with ``access``,
    one access-log line per request on ``service.access`` (method, route, status, duration, client, request id and
    trace id as the record's ``fields``, top-level keys in JSON logs: ``service.observability.logs``)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, access: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def tracking_send(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route: Any = scope.get("route")
            endpoint = getattr(route, "path", None) or scope.get(ENDPOINT_KEY) or "unmatched"
            seconds = time.perf_counter() - start
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
            self.metrics.request_duration.labels(endpoint).observe(seconds)
            if self.access:
                log_access(scope, endpoint, status["code"], seconds)


def log_access(scope: Scope, endpoint: str, status: int, seconds: float) -> None:
    client = scope.get("client")
    context = scope.get(REQUEST_KEY, {})
    fields = {"method": scope.get("method"), "path": endpoint, "status": status,
              "duration_ms": round(seconds * 1000, 2), "client": client[0] if client else None,
              "request_id": context.get("request_id"), "trace_id": context.get("trace_id")}
    access_log.info("%s %s %d %.1f ms id=%s", fields["method"], endpoint, status, fields["duration_ms"],
                    fields["request_id"], extra={"fields": fields})


class CloseWhileDraining:
    """While the server drains, every response carries ``Connection: close``: uvicorn closes the connection after it,
    so the client opens its next request elsewhere (the load balancer sees the replica not ready) instead of sending
    it on a keep-alive connection that the listener's shutdown is about to close."""

    def __init__(self, app: ASGIApp, is_draining: Callable[[], bool]) -> None:
        self.app = app
        self.is_draining = is_draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing_send(msg: Message) -> None:
            if msg["type"] == "http.response.start" and self.is_draining():
                headers = [(k, v) for k, v in msg.get("headers", []) if k.lower() != b"connection"]
                msg = {**msg, "headers": [*headers, (b"connection", b"close")]}
            await send(msg)

        await self.app(scope, receive, closing_send)
