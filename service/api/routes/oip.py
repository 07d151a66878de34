"""Open Inference Protocol v2 routes (/v2 ...); tensors are mapped in ``service.api.oip``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from service.api import inference_protocol, oip
from service.api.admission import ticket_of
from service.api.deps import AppStateDep, require_api_key
from service.api.oip_binary import binary_outputs, infer_response
from service.api.request_context import request_id_of
from service.api.routes.client_gone import unless_client_leaves
from service.errors import ERROR_RESPONSES
from service.state import AppState

health = APIRouter(prefix="/v2", tags=["open inference protocol"])
guarded = APIRouter(prefix="/v2", tags=["open inference protocol"], dependencies=[Depends(require_api_key)],
                    responses=ERROR_RESPONSES)
# the body is read raw (it may carry binary tensors), so its schema is documented here
INFER_BODY = {"requestBody": {"required": True, "description": (
    "OIP inference request: inputs [{name: pixels, datatype: FP32, shape: [N, C, H, W], data}] (image models) or "
    "[{name: text, datatype: BYTES, shape: [N], data: [UTF-8 strings]}] (text models), parameters {n_samples, seed, "
    "coverage, conformal_score, class_conditional, max_risk, abstain_if_ood}, outputs [{name}]; the binary tensor "
    "extension (Inference-Header-Content-Length) is accepted"),
    "content": {"application/json": {"schema": {"type": "object", "required": ["inputs"]}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


@health.get("/health/live", summary="OIP liveness")
async def v2_live() -> dict[str, bool]:
    return {"live": True}


@health.get("/health/ready", summary="OIP readiness (same rule as /health/ready)",
            responses={503: {"description": "not ready"}})
async def v2_ready(state: AppStateDep) -> JSONResponse:
    ready = state.readiness().ready
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


@guarded.get("", summary="OIP server metadata")
async def v2_server() -> dict[str, Any]:
    return inference_protocol.server_metadata()


async def _infer(request: Request, state: AppState, name: str, version: str | None) -> Response:
    raw = await request.body()
    body, tail = await state.decoder.run(oip.parse_body, raw, request.headers.get(oip.HEADER_LENGTH))
    binary: set[str] = set()

    def choose_binary(names: list[str]) -> None:
        binary.update(binary_outputs(body, names))

    answer = await unless_client_leaves(request, inference_protocol.infer(
        state, name, version, body, tail, ticket_of(request.scope), choose_binary, request_id_of(request.scope)))
    return infer_response(answer.response(), binary)


def _ready(state: AppState, name: str, version: str | None) -> JSONResponse:
    ready = inference_protocol.model_ready(state, name, version)
    return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)


# before /models/{name}: a model named "stats" is shadowed here, as in Triton
@guarded.get("/models/stats", summary="Triton statistics of every model version")
async def v2_all_stats(state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.statistics(state, None, None)


@guarded.get("/models/{name}/stats", summary="Triton statistics of every version of a model")
async def v2_model_stats(name: str, state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.statistics(state, name, None)


@guarded.get("/models/{name}/versions/{version}/stats", summary="Triton statistics of one model version")
async def v2_model_version_stats(name: str, version: str, state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.statistics(state, name, version)


@guarded.get("/models/{name}", summary="OIP model metadata (default version)")
async def v2_model(name: str, state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.model_metadata(state, name, None)


@guarded.get("/models/{name}/versions/{version}", summary="OIP model metadata (one version)")
async def v2_model_version(name: str, version: str, state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.model_metadata(state, name, version)


@guarded.get("/models/{name}/ready", summary="OIP model readiness", responses={503: {"description": "not ready"}})
async def v2_model_ready(name: str, state: AppStateDep) -> JSONResponse:
    return _ready(state, name, None)


@guarded.get("/models/{name}/versions/{version}/ready", summary="OIP model version readiness",
             responses={503: {"description": "not ready"}})
async def v2_model_version_ready(name: str, version: str, state: AppStateDep) -> JSONResponse:
    return _ready(state, name, version)


@guarded.get("/models/{name}/config", summary="Triton model configuration (default version)")
async def v2_model_config(name: str, state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.configuration(state, name, None)


@guarded.get("/models/{name}/versions/{version}/config", summary="Triton model configuration (one version)")
async def v2_model_version_config(name: str, version: str, state: AppStateDep) -> dict[str, Any]:
    return inference_protocol.configuration(state, name, version)


@guarded.post("/models/{name}/infer", summary="OIP inference (default version)", openapi_extra=INFER_BODY)
async def v2_infer(name: str, request: Request, state: AppStateDep) -> Response:
    return await _infer(request, state, name, None)


@guarded.post("/models/{name}/versions/{version}/infer", summary="OIP inference (one version)",
              openapi_extra=INFER_BODY)
async def v2_infer_version(name: str, version: str, request: Request, state: AppStateDep) -> Response:
    return await _infer(request, state, name, version)


router = APIRouter()
router.include_router(health)
router.include_router(guarded)
