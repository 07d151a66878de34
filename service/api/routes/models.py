"""GET /models, /models/{name}, /models/{name}/versions/{version}: manifests, states and reasons."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from artifact.samples import samples_verdict
from service.api.deps import AppStateDep, require_api_key
from service.api.protocol import ModelDetail, ModelList, ModelSummary, VersionInfo
from service.engine.model_settings import ModelConfigFile
from service.engine.repository import ModelVersion
from service.errors import ERROR_RESPONSES, not_found, shown
from service.state import AppState

router = APIRouter(tags=["models"], dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES)


def version_info(state: AppState, entry: ModelVersion) -> VersionInfo:
    """A ready version from its typed manifest and what it is served with; any other from its manifest as written,
    which may not parse (that is often why the version is unavailable), read defensively."""
    ready = entry.ready()
    common = {"version": entry.version, "state": entry.state.value, "reason": entry.reason,
              "reload_error": entry.reload_error, "loaded_at": entry.loaded_at,
              "queue_depth": entry.worker.depth if entry.worker else None}
    if ready is None:
        raw = entry.manifest
        sampling = raw.get("sampling") if isinstance(raw.get("sampling"), dict) else {}
        section = raw.get("input")
        return VersionInfo(**common, method=raw.get("method"), modality=raw.get("modality"),
                           default_samples=sampling.get("default_samples"), max_samples=sampling.get("max_samples"),
                           input=section if isinstance(section, dict) else None)
    manifest = ready.artifact.manifest
    verdict = samples_verdict(manifest)
    return VersionInfo(**common, method=manifest.method, modality=manifest.modality,
                       default_samples=ready.default_samples, max_samples=ready.max_samples,
                       serving=ready.serving.shown(), input=manifest.input.document(),
                       max_text_characters=ready.artifact.decoder.max_characters(state.predictor.limits),
                       samples_informative=verdict.informative if verdict else None,
                       samples_note=verdict.note if verdict else None,
                       kernel_verdict=manifest.kernel_verdict.sentence if manifest.kernel_verdict else None)


def summary(state: AppState, name: str) -> ModelSummary:
    default = state.repository.default_version(name)
    config = state.repository.configs.get(name)
    return ModelSummary(name=name, default_version=default.version if default else None,
                        versions=[version_info(state, v) for v in state.repository.versions(name)],
                        config=config.given() if isinstance(config, ModelConfigFile) else None,
                        config_error=str(config) if isinstance(config, ValueError) else None)


def detail(state: AppState, name: str, entry: ModelVersion | None) -> ModelDetail:
    manifest = entry.manifest if entry is not None and entry.manifest else None
    return ModelDetail(**summary(state, name).model_dump(), manifest=manifest,
                       reference=manifest.get("reference") if manifest else None)


@router.get("/models", response_model=ModelList, summary="All models and versions with their state")
async def list_models(state: AppStateDep) -> ModelList:
    return ModelList(default_model=state.settings.default_model,
                     models=[summary(state, name) for name in sorted(state.repository.models)])


@router.get("/models/{name}", response_model=ModelDetail,
            summary="A model: versions, states, and the default version's manifest and reference calibration")
async def get_model(name: str, state: AppStateDep) -> ModelDetail:
    if not state.repository.is_known(name):
        raise not_found(f"unknown model {shown(name)}")
    versions = state.repository.versions(name)
    return detail(state, name, state.repository.default_version(name) or versions[-1])


@router.get("/models/{name}/versions/{version}", response_model=ModelDetail,
            summary="One version of a model with its manifest")
async def get_model_version(name: str, version: str, state: AppStateDep) -> ModelDetail:
    if not state.repository.is_known(name, version):
        raise not_found(f"unknown model {shown(name)} version {shown(version)}")
    return detail(state, name, state.repository.get(name, version))
