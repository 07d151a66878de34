"""GET /health/live and /health/ready (no API key; the ready body's details can be turned off)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import AppStateDep
from service.api.protocol import Health

router = APIRouter(tags=["health"])


@router.get("/health/live", response_model=Health, summary="The process is up")
async def live(state: AppStateDep) -> Health:
    return Health(status="alive", draining=state.lifecycle.draining)


@router.get("/health/ready", response_model=Health, responses={503: {"model": Health, "description": "not ready"}},
            summary="Ready to serve",
            description="200 when the repository has been scanned, no version is still loading, at least one "
                        "version is ready, every model in DIRECTOR_REQUIRED_MODELS has a ready version, neither the "
                        "default model nor a required one has a full queue, and the server is not draining; 503 "
                        "otherwise (a broken artifact that is not required does not make the server unready).")
async def ready(state: AppStateDep) -> JSONResponse:
    readiness = state.readiness()
    status = "ready" if readiness.ready else "not_ready"
    if state.settings.health_details:
        body = Health(status=status, draining=state.lifecycle.draining, models=readiness.models,
                      missing_required=readiness.missing, saturated=readiness.saturated)
    else:  # DIRECTOR_HEALTH_DETAILS=false: the repository's inventory is not shown to whoever reaches the port
        body = Health(status=status, draining=state.lifecycle.draining)
    return JSONResponse(body.model_dump(), status_code=200 if readiness.ready else 503)
