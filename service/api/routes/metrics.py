"""GET /metrics in the Prometheus text format (no API key). A scrape reads gauges only: the live ones are set on a
schedule (``service.feedback.live_refresh``), never per scrape, so scrapers cannot reach the feedback store."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import AppStateDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (prefix director_)",
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(state: AppStateDep) -> Response:
    state.metrics.observe_device_memory(state.device.memory_stats())
    state.metrics.prediction_log_pending.set(state.feedback.pending)
    state.metrics.feedback_store_up.set(0 if state.store_calls.failing else 1)
    return Response(state.metrics.expose(), media_type=CONTENT_TYPE_LATEST)
