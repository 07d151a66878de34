"""Request ids and trace context, for every HTTP request.

- ``X-Request-ID``: taken from the request when it is 1-128 characters of letters, digits and ``._:~@/+=-`` (400
  otherwise: an id is never silently replaced), generated (32 hex digits) when absent, and echoed on the response.
- W3C ``traceparent``: a valid one continues the caller's trace (its trace id, a new span id for this request); an
  absent or malformed one starts a new trace, as the W3C rule asks. The response carries the request's own
  ``traceparent``, so the caller can find this hop.

Both ids go into the scope (``service.api.middleware.REQUEST_KEY``) for the access log that ``HttpMetrics`` writes."""

from __future__ import annotations

import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.middleware import REQUEST_KEY
from service.errors import error_response

REQUEST_ID = re.compile(r"[A-Za-z0-9._:~@/+=-]{1,128}")
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
ZERO_TRACE, ZERO_SPAN = "0" * 32, "0" * 16


def trace_of(header: bytes | None) -> tuple[str, str]:
    """(trace id, trace flags) of a valid ``traceparent``, else a new trace (sampled flag off)."""
    if header is not None:
        match = TRACEPARENT.fullmatch(header.decode("latin-1").strip())
        if match and match.group(1) != ZERO_TRACE and match.group(2) != ZERO_SPAN:
            return match.group(1), match.group(3)
    return secrets.token_hex(16), "00"


class RequestContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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
            await send(message)

        await self.app(scope, receive, tagging_send)


def request_id_of(scope: Scope) -> str | None:
    """The request id this middleware took or gave the request (None outside a request it saw)."""
    context = scope.get(REQUEST_KEY)
    return context.get("request_id") if isinstance(context, dict) else None
