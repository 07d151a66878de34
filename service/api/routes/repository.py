"""Triton's model repository extension (explicit model control) beside repository polling, which stays the default:
``POST /v2/repository/index`` lists every model version with its state, ``.../models/{m}/load`` scans the model's
folder now (serving it again after an unload) and ``.../models/{m}/unload`` stops serving it until the next load;
scans then leave its folder alone. A load runs the same checks as a poll (the digest allowlist, every file inside
its version folder, the manifest). Changing what is served needs the API key, so these routes refuse (403) on a
server that has none, and they act on one process: with ``--workers`` > 1 they refuse (409), and the repository
folder is the way to change what every worker serves."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from service.api.deps import AppStateDep, require_api_key
from service.engine.repository import VersionState
from service.errors import ERROR_RESPONSES, ApiError, bad_input, not_found, shown
from service.state import AppState

router = APIRouter(prefix="/v2/repository", tags=["model repository"], dependencies=[Depends(require_api_key)],
                   responses=ERROR_RESPONSES)
TRITON_STATES = {VersionState.READY: "READY", VersionState.LOADING: "LOADING",
                 VersionState.UNAVAILABLE: "UNAVAILABLE"}


def _controllable(state: AppState) -> None:
    if state.settings.api_key is None:
        raise ApiError(403, "model control needs an API key (DIRECTOR_API_KEY): without one, anybody could unload "
                            "the models; add or remove version folders instead (the repository is polled)")
    if state.settings.workers > 1:
        raise ApiError(409, "model control acts on one process and this server runs several workers: add or remove "
                            "version folders instead (every worker polls the repository)")


@router.post("/index", summary="Every model version of the repository with its state (Triton's index)")
async def index(request: Request, state: AppStateDep) -> list[dict[str, Any]]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise bad_input(f"the index body must be JSON, e.g. {{\"ready\": true}}: {exc}") from exc
    ready_only = isinstance(body, dict) and body.get("ready") is True
    rows: list[dict[str, Any]] = []
    for entry in state.repository.all_versions():
        if ready_only and entry.state is not VersionState.READY:
            continue
        row = {"name": entry.name, "version": entry.version, "state": TRITON_STATES[entry.state]}
        if entry.reason:
            row["reason"] = entry.reason
        rows.append(row)
    if not ready_only:  # unloaded models are listed as Triton lists them: by name, with no version
        rows += [{"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
                 for name in sorted(state.repository.unloaded)]
    return rows


@router.post("/models/{name}/load", summary="Load (or reload) a model from the repository now")
async def load(name: str, state: AppStateDep) -> Response:
    _controllable(state)
    if not await state.repository.load(name):
        raise not_found(f"no model folder {shown(name)} in the repository")
    if state.repository.default_version(name) is None:
        reasons = "; ".join(f"version {v.version}: {v.reason}" for v in state.repository.versions(name) if v.reason)
        raise ApiError(400, f"model {shown(name)} has no version that loaded" + (f" ({reasons})" if reasons else ""))
    return Response(status_code=200)


@router.post("/models/{name}/unload", summary="Stop serving a model until it is loaded again")
async def unload(name: str, state: AppStateDep) -> Response:
    _controllable(state)
    if not await state.repository.unload(name):
        raise not_found(f"unknown model {shown(name)}")
    return Response(status_code=200)
