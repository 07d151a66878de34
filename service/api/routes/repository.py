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

from service.api import inference_protocol
from service.api.deps import AppStateDep, require_api_key
from service.errors import ERROR_RESPONSES, bad_input

router = APIRouter(prefix="/v2/repository", tags=["model repository"], dependencies=[Depends(require_api_key)],
                   responses=ERROR_RESPONSES)


@router.post("/index", summary="Every model version of the repository with its state (Triton's index)")
async def index(request: Request, state: AppStateDep) -> list[dict[str, Any]]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise bad_input(f"the index body must be JSON, e.g. {{\"ready\": true}}: {exc}") from exc
    return inference_protocol.repository_index(state, isinstance(body, dict) and body.get("ready") is True)


@router.post("/models/{name}/load", summary="Load (or reload) a model from the repository now")
async def load(name: str, state: AppStateDep) -> Response:
    await inference_protocol.load_model(state, name)
    return Response(status_code=200)


@router.post("/models/{name}/unload", summary="Stop serving a model until it is loaded again")
async def unload(name: str, state: AppStateDep) -> Response:
    await inference_protocol.unload_model(state, name)
    return Response(status_code=200)
