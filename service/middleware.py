"""Pure ASGI middleware: the request body limit and per-request HTTP metrics (admission control is in
``service.admission``)."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_response
from service.metrics import Metrics

ENDPOINT_KEY = "director.endpoint"  # route template of a request answered before routing (service.admission)


class BodyLimit:
    """413 for a body over ``max_bytes``: from Content-Length at once, or while a chunked body streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"request body larger than {self.max_bytes} bytes"
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await error_response(413, message)(scope, receive, send)
            return
        seen = 0
        started = refused = False

        async def limited_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes and not started:
                    # answer now; the app then sees a disconnected client and whatever it sends is dropped
                    refused = True
                    await error_response(413, message)(scope, receive, send)
                    return {"type": "http.disconnect"}
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
    """``director_requests_total{endpoint,code}`` and latency, labelled by route template (bounded)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

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
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
            self.metrics.request_duration.labels(endpoint).observe(time.perf_counter() - start)
