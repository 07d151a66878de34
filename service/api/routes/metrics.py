"""GET /metrics in the Prometheus text format (no API key). A scrape reads gauges only: the live ones are set on a
schedule (``service.feedback.live_refresh``), never per scrape, so scrapers cannot reach the feedback store; and the
body is made at most once per ``DIRECTOR_METRICS_MAX_AGE_S``, in a thread (``service.observability.exposition``), so
a flood of scrapes cannot hold the event loop."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import AppStateDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (prefix director_)",
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(state: AppStateDep) -> Response:
    return Response(await state.exposition.body(), media_type=CONTENT_TYPE_LATEST)
