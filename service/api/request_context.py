"""Request ids and trace context, for every HTTP request.

- ``X-Request-ID``: taken from the request when it is 1-128 characters of letters, digits and ``._:~@/+=-`` (400
  otherwise: an id is never silently replaced), generated (32 hex digits) when absent, and echoed on the response.
- W3C ``traceparent``: a valid one continues the caller's trace (its trace id, a new span id for this request); an
  absent or malformed one starts a new trace, as the W3C rule asks. The response carries the request's own
  ``traceparent``, so the caller can find this hop.

The gateway (``service.api.gateway``) takes them from the headers here, echoes them and writes them in the access log;
the routes read the request id from the scope (``request_id_of``) to log it with the prediction. With tracing on
(``service.observability.tracing``) the request's span is an OpenTelemetry server span, current while the app
answers, so the prediction's own spans nest under it; its ids are the ones the response carries."""

from __future__ import annotations

import re
from dataclasses import dataclass

from opentelemetry import trace
from starlette.types import Scope

from service.observability.tracing import Tracing
from service.random_ids import random_hex

REQUEST_KEY = "director.request"  # {"request_id", "trace_id", "span_id"} in the scope
BAD_REQUEST_ID = "X-Request-ID must be 1-128 characters of letters, digits and ._:~@/+=-"
REQUEST_ID = re.compile(r"[A-Za-z0-9._:~@/+=-]{1,128}")
# version 00 exactly; a later version (not ff) may carry more fields after the flags, which a version-00 parser reads
# past (W3C Trace Context, "Versioning of traceparent")
TRACEPARENT = re.compile(r"(?:00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})|"
                         r"(?!ff|00)[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?)")
ZERO_TRACE, ZERO_SPAN = "0" * 32, "0" * 16


def caller_of(header: bytes | None) -> tuple[str, str, str] | None:
    """(trace id, the caller's span id, trace flags) of a valid ``traceparent``, else None."""
    if header is not None:
        match = TRACEPARENT.fullmatch(header.decode("latin-1").strip())
        if match:
            trace_id, span_id, flags = match.groups()[:3] if match.group(1) else match.groups()[3:]
            if trace_id != ZERO_TRACE and span_id != ZERO_SPAN:
                return trace_id, span_id, flags
    return None


def trace_of(header: bytes | None) -> tuple[str, str]:
    """(trace id, trace flags) of a valid ``traceparent``, else a new trace (sampled flag off)."""
    caller = caller_of(header)
    return (caller[0], caller[2]) if caller is not None else (random_hex(16), "00")


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


@dataclass(frozen=True)
class RequestIds:
    """A request's ids, and the response headers that carry them back."""

    request_id: str
    trace_id: str
    span_id: str
    headers: list[tuple[bytes, bytes]]  # X-Request-ID and traceparent, for the response
    span: trace.Span | None  # the server span, with tracing on
    valid: bool  # False: the client's X-Request-ID breaks the rule (refused with 400, under a generated id)


def request_ids(scope: Scope, headers: dict[bytes, bytes], tracing: Tracing) -> RequestIds:
    """The request's ids from its headers (``headers``: the scope's, as a dict), also left in the scope for the
    routes (``request_id_of``). With tracing on, the request's server span is started here (the caller ends it)."""
    given = headers.get(b"x-request-id")
    valid = given is None or REQUEST_ID.fullmatch(given.decode("latin-1")) is not None
    request_id = given.decode("latin-1") if given is not None and valid else random_hex(16)
    span: trace.Span | None = None
    if tracing.enabled:
        span = server_span(tracing, scope, caller_of(headers.get(b"traceparent")))
        ids = span.get_span_context()
        trace_id, span_id, flags = f"{ids.trace_id:032x}", f"{ids.span_id:016x}", f"{int(ids.trace_flags):02x}"
    else:
        trace_id, flags = trace_of(headers.get(b"traceparent"))
        span_id = random_hex(8)
    scope[REQUEST_KEY] = {"request_id": request_id, "trace_id": trace_id, "span_id": span_id}
    echoed = [(b"x-request-id", request_id.encode("latin-1")),
              (b"traceparent", f"00-{trace_id}-{span_id}-{flags}".encode())]
    return RequestIds(request_id, trace_id, span_id, echoed, span, valid)


def request_id_of(scope: Scope) -> str | None:
    """The request id the gateway took or gave the request (None outside a request it saw)."""
    context = scope.get(REQUEST_KEY)
    return context.get("request_id") if isinstance(context, dict) else None
