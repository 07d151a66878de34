"""The one middleware in front of the routes (pure ASGI): what the server decides about an HTTP request from its
headers, from the arrival of its body and from its response, in one receive wrapper and one send wrapper.

In order:

1. Ids and trace context (``service.api.request_context``), on every answer, refusals included; a malformed
   ``X-Request-ID`` is refused with 400.
2. The API key (``service.api.auth``), from the headers alone: 401 before anything reads the body (a good key is
   marked in the scope, so the routes' own check does not compare it again).
3. The body's announced size: 413 at once.
4. Admission (``service.api.admission``): a prediction for an overloaded model gets 503 before its body is read; an
   admitted one reserves its queue slot once its body is in.
5. While the route reads the body: 413 past ``max_body_bytes`` (a body streamed without a length), 408 when it has not
   arrived in full ``body_timeout_s`` after the headers.
6. On the response: the ids, and ``Connection: close`` while the server drains; after it, the request's count,
   latency and access-log line, labelled by route template.

Why one layer and not a stack of them: every pure ASGI layer wraps ``receive`` and ``send`` again, so each message of
a request (every body chunk, the response's start and body) was handed through each layer in turn, and each time the
request's task resumed it passed through all of them again. Here each message is handled once, and the checks sit in
one place in the order that matters (the key before the body limit: a client without it learns nothing, not even the
limit; admission after both: a refusal for load is never an answer to an unauthenticated client)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from starlette.datastructures import State
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.admission import TICKET_KEY, Refusal, decide, match, refusal_response
from service.api.auth import (
    CHALLENGE,
    FEEDBACK_CLIENT,
    FEEDBACK_PATH,
    KEY_CHECKED,
    MESSAGE,
    authorized,
    feedback_key_name,
)
from service.api.request_context import BAD_REQUEST_ID, RequestIds, request_ids
from service.config import Settings
from service.engine.batching import BatchWorker
from service.errors import error_response
from service.observability.metrics import Metrics
from service.observability.tracing import Tracing
from service.state import Lifecycle

access_log = logging.getLogger("service.access")
DISCONNECT: Message = {"type": "http.disconnect"}
REPLACED = (b"x-request-id", b"traceparent")  # response headers the gateway sets itself


class RouteTemplates:
    """The route template a path matches (``/models/{name}``), to label requests answered before routing as routed
    ones are labelled; other paths are ``unmatched``, so the label stays bounded whatever a client sends. The
    templates are read at the first use (the app's routes are all there by then)."""

    def __init__(self, templates: Callable[[], Iterable[str]]) -> None:
        self.templates = templates
        self._patterns: list[tuple[re.Pattern[str], str]] | None = None

    def of(self, path: str) -> str:
        if self._patterns is None:
            self._patterns = [(compile_path(template)[0], template) for template in self.templates()]
        return next((template for pattern, template in self._patterns if pattern.match(path)), "unmatched")


class Exchange:
    """One HTTP request as the gateway follows it: its ids, its body's bounds, the worker that admitted it and the
    status it was answered with. ``receive`` and ``send`` are what the app is given."""

    ids: RequestIds  # set first thing by ``Gateway.screen``

    def __init__(self, scope: Scope, receive: Receive, send: Send, settings: Settings, lifecycle: Lifecycle) -> None:
        self.scope, self.lifecycle = scope, lifecycle
        self.headers = dict(scope.get("headers", []))
        self._receive, self._send = receive, send
        self.max_bytes = settings.max_body_bytes
        self.timeout_s = settings.body_timeout_s
        self.deadline = asyncio.get_running_loop().time() + settings.body_timeout_s
        self.started = time.perf_counter()
        self.seen = 0
        self.complete = self.refused = self.responding = False
        self.status = 500  # unless a response starts
        self.endpoint: str | None = None  # the label of a request answered before routing
        self.worker: BatchWorker | None = None  # admission's: a slot is reserved there once the body is in

    def too_large(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"

    def receive(self) -> Awaitable[Message]:
        """The next body message within the body's bounds (and once the body is in, a slot on the admitting worker).
        Later reads only wait for the client to leave: they go straight to the server's ``receive``, with no
        deadline and nothing of the gateway's in between."""
        if self.complete and not self.refused:
            return self._receive()
        return self.body_message()

    async def body_message(self) -> Message:
        if self.refused:
            return DISCONNECT
        try:
            async with asyncio.timeout_at(self.deadline):
                message = await self._receive()
        except TimeoutError:
            return await self.refuse(408, f"request body not received in full within {self.timeout_s:g} s",
                                     {"Connection": "close"})
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.seen > self.max_bytes and not self.responding:
                return await self.refuse(413, self.too_large())
            if self.complete and self.worker is not None:
                ticket = self.worker.reserve()  # None when the queue filled meanwhile: the route refuses at enqueue
                if ticket is not None:
                    self.scope[TICKET_KEY] = ticket
        return message

    async def refuse(self, status: int, text: str, headers: dict[str, str] | None = None) -> Message:
        """Answer now (unless the app already answers); the app then sees a disconnected client and whatever it
        sends is dropped. A 408 asks uvicorn to close the connection: what the client still sends is never read."""
        if not self.responding:
            self.refused = True
            await self.answer(error_response(status, text, headers=headers))
        return DISCONNECT

    async def answer(self, response: Response) -> None:
        await response(self.scope, self._receive, self.forward)

    async def send(self, message: Message) -> None:
        if not self.refused:
            self.responding = self.responding or message["type"] == "http.response.start"
            await self.forward(message)

    async def forward(self, message: Message) -> None:
        """The response's start gets the ids (and ``Connection: close`` while draining) and gives its status."""
        if message["type"] == "http.response.start":
            self.status = message["status"]
            draining = self.lifecycle.draining
            dropped = (*REPLACED, b"connection") if draining else REPLACED
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in dropped]
            headers += self.ids.headers
            if draining:  # uvicorn closes the connection after this response (Lifecycle says why)
                headers.append((b"connection", b"close"))
            message = {**message, "headers": headers}
            if self.ids.span is not None:
                self.ids.span.set_attribute("http.response.status_code", int(message["status"]))
        await self._send(message)


class Gateway:
    """The ASGI middleware (see the module's docstring). ``app_state`` is the app's state, whose ``director`` the
    lifespan sets (before that, nothing is admitted early: the routes explain); ``open_paths`` need no key."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics, lifecycle: Lifecycle, tracing: Tracing,
                 app_state: State, open_paths: frozenset[str], templates: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.lifecycle = lifecycle
        self.tracing = tracing
        self.app_state = app_state
        self.open_paths = open_paths
        self.templates = RouteTemplates(templates)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(scope, receive, send, self.settings, self.lifecycle)
        refusal = self.screen(exchange)
        span = exchange.ids.span
        token = None if span is None else otel_context.attach(trace.set_span_in_context(span))
        try:
            if refusal is not None:
                await exchange.answer(refusal)
            else:
                await self.app(scope, exchange.receive, exchange.send)
        except Exception:
            if not exchange.refused:  # after a refusal the app only saw its client leave
                raise
        finally:
            self.finish(exchange)
            if token is not None:
                otel_context.detach(token)
            if span is not None:
                span.end()

    def screen(self, exchange: Exchange) -> Response | None:
        """The request's ids, then the refusal it gets from its headers alone (nothing of its body read), or None."""
        scope = exchange.scope
        path = scope["path"]
        exchange.ids = request_ids(scope, exchange.headers, self.tracing)
        if not exchange.ids.valid:
            exchange.endpoint = self.templates.of(path)
            return error_response(400, BAD_REQUEST_ID)
        if path not in self.open_paths:
            if path == FEEDBACK_PATH and self.settings.feedback_keys:
                scope[FEEDBACK_CLIENT] = feedback_key_name(self.settings.feedback_keys, scope)
                allowed = scope[FEEDBACK_CLIENT] is not None
            else:
                allowed = authorized(self.settings.api_key, scope)
            if not allowed:
                exchange.endpoint = self.templates.of(path)
                return error_response(401, MESSAGE, headers=CHALLENGE)
            scope[KEY_CHECKED] = True  # the routes' own check (service.api.deps) need not compare it again
        length = exchange.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > exchange.max_bytes:
            return error_response(413, exchange.too_large())
        target = match(scope["method"], path)
        state = getattr(self.app_state, "director", None) if target is not None else None
        if target is None or state is None:
            return None
        decision = decide(state, target)
        if isinstance(decision, Refusal):
            exchange.endpoint = target.endpoint
            return refusal_response(state, decision)
        exchange.worker = decision
        return None

    def finish(self, exchange: Exchange) -> None:
        """Gives back a slot the request reserved but never queued; counts it, and writes its access-log line."""
        scope = exchange.scope
        ticket = scope.get(TICKET_KEY)
        if ticket is not None:
            ticket.release()  # a no-op once the request was queued
        route: Any = scope.get("route")
        endpoint = getattr(route, "path", None) or exchange.endpoint or "unmatched"
        seconds = time.perf_counter() - exchange.started
        self.metrics.requests.labels(endpoint, str(exchange.status)).inc()
        self.metrics.request_duration.labels(endpoint).observe(seconds)
        if self.settings.access_log:
            log_access(scope, exchange.ids, endpoint, exchange.status, seconds)


def log_access(scope: Scope, ids: RequestIds, endpoint: str, status: int, seconds: float) -> None:
    """One line on ``service.access``: method, route, status, duration, client, request id and trace id as the
    record's ``fields`` (top-level keys in JSON logs: ``service.observability.logs``)."""
    client = scope.get("client")
    fields = {"method": scope.get("method"), "path": endpoint, "status": status,
              "duration_ms": round(seconds * 1000, 2), "client": client[0] if client else None,
              "request_id": ids.request_id, "trace_id": ids.trace_id}
    access_log.info("%s %s %d %.1f ms id=%s", fields["method"], endpoint, status, fields["duration_ms"],
                    fields["request_id"], extra={"fields": fields})
