"""Request ids and trace context, for every HTTP request.

- ``X-Request-ID``: taken from the request when it is 1-128 characters of letters, digits and ``._:~@/+=-`` (400
  otherwise: an id is never silently replaced), generated (32 hex digits) when absent, and echoed on the response.
- W3C ``traceparent``: a valid one continues the caller's trace (its trace id, a new span id for this request); an
  absent or malformed one starts a new trace, as the W3C rule asks. The response carries the request's own
  ``traceparent``, so the caller can find this hop.

Both ids go into the scope (``service.api.middleware.REQUEST_KEY``) for the access log that ``HttpMetrics`` writes.
With tracing on (``service.observability.tracing``) the request's span is an OpenTelemetry server span, current
while the app answers, so the prediction's own spans nest under it; its ids are the ones the response carries."""

from __future__ import annotations

import re
import secrets

from opentelemetry import context as otel_context
from opentelemetry import trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.middleware import REQUEST_KEY
from service.errors import error_response
from service.observability.tracing import Tracing

REQUEST_ID = re.compile(r"[A-Za-z0-9._:~@/+=-]{1,128}")
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
ZERO_TRACE, ZERO_SPAN = "0" * 32, "0" * 16


def caller_of(header: bytes | None) -> tuple[str, str, str] | None:
    """(trace id, the caller's span id, trace flags) of a valid ``traceparent``, else None."""
    if header is not None:
        match = TRACEPARENT.fullmatch(header.decode("latin-1").strip())
        if match and match.group(1) != ZERO_TRACE and match.group(2) != ZERO_SPAN:
            return match.group(1), match.group(2), match.group(3)
    return None


def trace_of(header: bytes | None) -> tuple[str, str]:
    """(trace id, trace flags) of a valid ``traceparent``, else a new trace (sampled flag off)."""
    caller = caller_of(header)
    return (caller[0], caller[2]) if caller is not None else (secrets.token_hex(16), "00")


def server_span(tracing: Tracing, scope: Scope, caller: tuple[str, str, str] | None) -> trace.Span:
    """The request's OpenTelemetry span, a child of the caller's when it sent a valid ``traceparent``."""
    parent = None
    if caller is not None:
        remote = trace.SpanContext(int(caller[0], 16), int(caller[1], 16), is_remote=True,
                                   trace_flags=trace.TraceFlags(int(caller[2], 16)))
        parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    return tracing.tracer.start_span(f"{scope.get('method', 'HTTP')} {scope.get('path', '')}", context=parent,
                                     kind=trace.SpanKind.SERVER,
                                     attributes={"http.request.method": str(scope.get("method", "")),
                                                 "url.path": str(scope.get("path", ""))})


class RequestContext:
    def __init__(self, app: ASGIApp, tracing: Tracing | None = None) -> None:
        self.app = app
        self.tracing = tracing if tracing is not None else Tracing(None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        given = headers.get(b"x-request-id")
        if given is not None and not REQUEST_ID.fullmatch(given.decode("latin-1")):
            await error_response(400, "X-Request-ID must be 1-128 characters of letters, digits and ._:~@/+=-")(
                scope, receive, send)
            return
        request_id = given.decode("latin-1") if given is not None else secrets.token_hex(16)
        span: trace.Span | None = None
        if self.tracing.enabled:
            span = server_span(self.tracing, scope, caller_of(headers.get(b"traceparent")))
            ids = span.get_span_context()
            trace_id, span_id, flags = f"{ids.trace_id:032x}", f"{ids.span_id:016x}", f"{int(ids.trace_flags):02x}"
        else:
            trace_id, flags = trace_of(headers.get(b"traceparent"))
            span_id = secrets.token_hex(8)
        scope[REQUEST_KEY] = {"request_id": request_id, "trace_id": trace_id, "span_id": span_id}
        echoed = [(b"x-request-id", request_id.encode("latin-1")),
                  (b"traceparent", f"00-{trace_id}-{span_id}-{flags}".encode())]

        async def tagging_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in (b"x-request-id",
                                                                                          b"traceparent")]
                message = {**message, "headers": [*kept, *echoed]}
                if span is not None:
                    span.set_attribute("http.response.status_code", int(message["status"]))
            await send(message)

        if span is None:
            await self.app(scope, receive, tagging_send)
            return
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            await self.app(scope, receive, tagging_send)
        finally:
            otel_context.detach(token)
            span.end()


def request_id_of(scope: Scope) -> str | None:
    """The request id this middleware took or gave the request (None outside a request it saw)."""
    context = scope.get(REQUEST_KEY)
    return context.get("request_id") if isinstance(context, dict) else None
