"""Open Inference Protocol v2 routes (/v2 ...); tensors are mapped in ``service.api.oip``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from service import __version__
from service.api import oip
from service.api.admission import ticket_of
from service.api.deps import AppStateDep, require_api_key
from service.api.model_config import model_config
from service.api.oip_binary import binary_outputs, infer_response
from service.engine.repository import ModelVersion, VersionState
from service.errors import ERROR_RESPONSES, not_found, shown
from service.state import AppState

SERVER_NAME = "director-serving"
health = APIRouter(prefix="/v2", tags=["open inference protocol"])
guarded = APIRouter(prefix="/v2", tags=["open inference protocol"], dependencies=[Depends(require_api_key)],
                    responses=ERROR_RESPONSES)
# the body is read raw (it may carry binary tensors), so its schema is documented here
INFER_BODY = {"requestBody": {"required": True, "description": (
    "OIP inference request: inputs [{name: pixels, datatype: FP32, shape: [N, C, H, W], data}] (image models) or "
    "[{name: text, datatype: BYTES, shape: [N], data: [UTF-8 strings]}] (text models), parameters {n_samples, seed}, "
    "outputs [{name}]; the binary tensor extension (Inference-Header-Content-Length) is accepted"),
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
    return {"name": SERVER_NAME, "version": __version__,
            "extensions": ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]}


def _entry(state: AppState, name: str, version: str | None) -> ModelVersion:
    if not state.repository.is_known(name):
        raise not_found(f"unknown model {shown(name)}")
    entry = state.repository.get(name, version)
    if entry is None and version is not None:
        raise not_found(f"unknown model {shown(name)} version {shown(version)}")
    if entry is None:
        raise not_found(f"model {shown(name)} has no ready version")
    return entry


def _metadata(state: AppState, name: str, version: str | None) -> dict[str, Any]:
    entry = _entry(state, name, version)
    if entry.artifact is None:
        return {"name": name, "versions": [entry.version], "platform": "pytorch_torchscript", "inputs": [],
                "outputs": [], "state": entry.state.value, "reason": entry.reason}
    versions = [entry.version] if version is not None else [
        v.version for v in state.repository.versions(name) if v.state is VersionState.READY]
    return oip.metadata(name, versions, entry.artifact)


def _ready(state: AppState, name: str, version: str | None) -> JSONResponse:
    entry = _entry(state, name, version) if version is not None or state.repository.is_known(name) else None
    if entry is None:
        raise not_found(f"unknown model {shown(name)}")
    ready = entry.state is VersionState.READY and not state.lifecycle.draining
    return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)


async def _infer(request: Request, state: AppState, name: str, version: str | None) -> Response:
    raw = await request.body()
    body, tail = await state.decoder.run(oip.parse_body, raw, request.headers.get(oip.HEADER_LENGTH))
    predictor = state.predictor
    entry = predictor.resolve(name, version)
    codec = entry.artifact.codec
    parameters = oip.parameters_of(body, ["body", "parameters"])
    n_samples = predictor.samples(entry, oip.int_parameter(parameters, "n_samples"))
    seed = oip.seed_parameter(parameters)
    request_id = oip.request_id(body)  # every check of the request comes before inference
    requested = oip.requested_outputs(body, codec)
    binary = binary_outputs(body, requested or oip.available_outputs(codec))
    outcome = await predictor.predict(entry, lambda: oip.raw_inputs(body, tail, codec), n_samples, seed,
                                      ticket_of(request.scope))
    response: dict[str, Any] = {
        "model_name": entry.name, "model_version": entry.version,
        "parameters": {"n_samples": n_samples, "prediction_id": outcome.id, "ood_score_name": outcome.rule.score,
                       "ood_threshold": outcome.rule.threshold},
        "outputs": oip.outputs_json(outcome, requested),
    }
    if request_id is not None:
        response["id"] = request_id
    return infer_response(response, binary)


def _stats(state: AppState, name: str | None, version: str | None) -> dict[str, Any]:
    """Triton's statistics of every version (``name`` None), of every version of ``name``, or of one version."""
    if name is None:
        entries = state.repository.all_versions()
    elif version is None:
        if not state.repository.is_known(name):
            raise not_found(f"unknown model {shown(name)}")
        entries = state.repository.versions(name)
    else:
        entries = [_entry(state, name, version)]
    return state.statistics.report([(e.name, e.version) for e in entries])


# before /models/{name}: a model named "stats" is shadowed here, as in Triton
@guarded.get("/models/stats", summary="Triton statistics of every model version")
async def v2_all_stats(state: AppStateDep) -> dict[str, Any]:
    return _stats(state, None, None)


@guarded.get("/models/{name}/stats", summary="Triton statistics of every version of a model")
async def v2_model_stats(name: str, state: AppStateDep) -> dict[str, Any]:
    return _stats(state, name, None)


@guarded.get("/models/{name}/versions/{version}/stats", summary="Triton statistics of one model version")
async def v2_model_version_stats(name: str, version: str, state: AppStateDep) -> dict[str, Any]:
    return _stats(state, name, version)


@guarded.get("/models/{name}", summary="OIP model metadata (default version)")
async def v2_model(name: str, state: AppStateDep) -> dict[str, Any]:
    return _metadata(state, name, None)


@guarded.get("/models/{name}/versions/{version}", summary="OIP model metadata (one version)")
async def v2_model_version(name: str, version: str, state: AppStateDep) -> dict[str, Any]:
    return _metadata(state, name, version)


@guarded.get("/models/{name}/ready", summary="OIP model readiness", responses={503: {"description": "not ready"}})
async def v2_model_ready(name: str, state: AppStateDep) -> JSONResponse:
    return _ready(state, name, None)


@guarded.get("/models/{name}/versions/{version}/ready", summary="OIP model version readiness",
             responses={503: {"description": "not ready"}})
async def v2_model_version_ready(name: str, version: str, state: AppStateDep) -> JSONResponse:
    return _ready(state, name, version)


def _config(state: AppState, name: str, version: str | None) -> dict[str, Any]:
    entry = state.predictor.resolve(name, version)
    return model_config(entry.name, entry.artifact, state.settings, state.device)


@guarded.get("/models/{name}/config", summary="Triton model configuration (default version)")
async def v2_model_config(name: str, state: AppStateDep) -> dict[str, Any]:
    return _config(state, name, None)


@guarded.get("/models/{name}/versions/{version}/config", summary="Triton model configuration (one version)")
async def v2_model_version_config(name: str, version: str, state: AppStateDep) -> dict[str, Any]:
    return _config(state, name, version)


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
