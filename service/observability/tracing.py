"""OpenTelemetry spans, off by default: with ``DIRECTOR_OTLP_ENDPOINT`` set (an OTLP/HTTP collector's base URL, e.g.
``http://otel-collector:4318``) every HTTP request gets a server span (continuing the caller's W3C ``traceparent``,
whose ids the response's ``traceparent`` then carries), and every prediction a ``queue`` span (its wait for a
batch) and an ``inference`` span (its batch's forwards and summaries) under it, exported in batches to
``<endpoint>/v1/traces``. The provider is the app's own, not the process-global one."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from service import __version__

SERVICE_NAME = "director-serving"
# how long one export may take, retries included: a collector that is down or silent must not hold a shutdown (its
# default, 10 s of retries with backoff, made SIGTERM take 30 s)
EXPORT_TIMEOUT_S = 2.0


class Tracing:
    def __init__(self, endpoint: str | None) -> None:
        self.enabled = endpoint is not None
        self._provider: TracerProvider | None = None
        self.tracer: trace.Tracer = trace.NoOpTracer()
        if endpoint is not None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # only when used

            resource = Resource.create({"service.name": SERVICE_NAME, "service.version": __version__})
            self._provider = TracerProvider(resource=resource)
            exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces", timeout=EXPORT_TIMEOUT_S)
            self._provider.add_span_processor(BatchSpanProcessor(exporter,
                                                                 export_timeout_millis=1000 * EXPORT_TIMEOUT_S))
            self.tracer = self._provider.get_tracer("service")

    def span(self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]) -> None:
        """A finished span under the current one, from its measured start and end (wall clock, ns)."""
        if self.enabled:
            span = self.tracer.start_span(name, start_time=start_ns, attributes=attributes)
            span.end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is still buffered, then stop: within about ``EXPORT_TIMEOUT_S`` whatever the collector does."""
        if self._provider is not None:
            self._provider.shutdown()
