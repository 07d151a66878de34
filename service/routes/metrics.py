"""GET /metrics in the Prometheus text format (no API key)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.deps import AppStateDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (prefix director_)",
            responses={200: {"content": {"text/plain": {}}}})
async def metrics(state: AppStateDep) -> Response:
    await asyncio.to_thread(state.refresh_live_gauges)  # replicas sharing a feedback store report the same values
    state.metrics.observe_device_memory(state.device.memory_stats())
    return Response(state.metrics.expose(), media_type=CONTENT_TYPE_LATEST)
