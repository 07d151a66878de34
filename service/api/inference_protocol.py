"""The Open Inference Protocol's operations, whatever carries them: the HTTP routes (``service.api.routes.oip``,
``routes.repository``) and the gRPC service (``service.api.grpc_service``) each translate their wire format to these
calls and back, so both answer with the same checks, errors, statistics and metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service import __version__
from service.api import oip, oip_decisions
from service.api.model_config import model_config
from service.engine.batching import Ticket
from service.engine.modalities.base import InputDecoder
from service.engine.predictor import Outcome
from service.engine.repository import ModelVersion, VersionState
from service.errors import ApiError, not_found, shown
from service.state import AppState

SERVER_NAME = "director-serving"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]
TRITON_STATES = {VersionState.READY: "READY", VersionState.LOADING: "LOADING",
                 VersionState.UNAVAILABLE: "UNAVAILABLE"}


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}


def known_version(state: AppState, name: str, version: str | None) -> ModelVersion:
    """The version a metadata, readiness or statistics call names, in whatever state it is."""
    if not state.repository.is_known(name):
        raise not_found(f"unknown model {shown(name)}")
    entry = state.repository.get(name, version)
    if entry is None and version is not None:
        raise not_found(f"unknown model {shown(name)} version {shown(version)}")
    if entry is None:
        raise not_found(f"model {shown(name)} has no ready version")
    return entry


def model_metadata(state: AppState, name: str, version: str | None) -> dict[str, Any]:
    entry = known_version(state, name, version)
    if entry.artifact is None:
        return {"name": name, "versions": [entry.version], "platform": "pytorch_torchscript", "inputs": [],
                "outputs": [], "state": entry.state.value, "reason": entry.reason}
    versions = [entry.version] if version is not None else [
        v.version for v in state.repository.versions(name) if v.state is VersionState.READY]
    return oip.metadata(name, versions, entry.artifact)


def model_ready(state: AppState, name: str, version: str | None) -> bool:
    entry = known_version(state, name, version)
    return entry.state is VersionState.READY and not state.lifecycle.draining


def configuration(state: AppState, name: str, version: str | None) -> dict[str, Any]:
    """Triton's model configuration of a ready version."""
    entry = state.predictor.resolve(name, version)
    return model_config(entry, state.settings, state.device)


def statistics(state: AppState, name: str | None, version: str | None) -> dict[str, Any]:
    """Triton's statistics of every version (``name`` None), of every version of ``name``, or of one version."""
    if name is None:
        entries = state.repository.all_versions()
    elif version is None:
        if not state.repository.is_known(name):
            raise not_found(f"unknown model {shown(name)}")
        entries = state.repository.versions(name)
    else:
        entries = [known_version(state, name, version)]
    return state.statistics.report([(e.name, e.version) for e in entries])


# a protocol's own check of a request, given the names of the outputs its response will carry, run before inference
ProtocolCheck = Callable[[list[str]], None]


@dataclass(frozen=True)
class Inference:
    """An infer call's answer before its wire format: what was asked and the outcome."""

    outcome: Outcome
    n_samples: int
    requested: list[str] | None  # output names asked for (None: every output)
    request_id: str | None
    left_out: dict[str, str] = field(default_factory=dict)  # named decision outputs without their ask, and why

    def response(self) -> dict[str, Any]:
        """The OIP inference response (JSON form, every output's ``data`` inline); with sets or abstentions
        asked, the rules applied in its ``parameters`` (docs/api.md)."""
        outcome = self.outcome
        response: dict[str, Any] = {
            "model_name": outcome.entry.name, "model_version": outcome.entry.version,
            "parameters": {"n_samples": self.n_samples, "prediction_id": outcome.id,
                           "ood_score_name": outcome.rule.score, "ood_threshold": outcome.rule.threshold,
                           **oip_decisions.response_parameters(outcome.decisions), **self.left_out},
            "outputs": oip.outputs_json(outcome, self.requested),
        }
        if self.request_id is not None:
            response["id"] = self.request_id
        return response


async def infer(state: AppState, name: str, version: str | None, body: dict[str, Any], tail: bytes,
                ticket: Ticket | None = None, before: ProtocolCheck | None = None,
                client_request_id: str | None = None) -> Inference:
    """One inference: every check of the request before the model runs (``before(names)`` adds a protocol's own,
    given the outputs the response will carry), then the prediction use-case on the body's tensor (``tail``: the
    binary tensors after it), with the prediction sets and abstentions its parameters ask for. The prediction is
    logged under ``client_request_id`` (the transport's request id), else the OIP request's ``id``."""
    predictor = state.predictor
    entry = predictor.resolve(name, version)
    decoder: InputDecoder = entry.artifact.decoder
    parameters = oip.parameters_of(body, ["body", "parameters"])
    n_samples = predictor.samples(entry, oip.int_parameter(parameters, "n_samples"))
    seed = oip.seed_parameter(parameters)
    ask = oip_decisions.decision_request(parameters)
    request_id = oip.request_id(body)
    requested = oip.requested_outputs(body, decoder, ask, entry.artifact.task)
    if before is not None:
        before(requested or oip.available_outputs(decoder, ask, entry.artifact.task))
    limit = state.settings.max_inputs_per_request
    outcome = await predictor.predict(entry, lambda: oip.raw_inputs(body, tail, decoder, limit), n_samples, seed,
                                      ticket, client_request_id or request_id, ask)
    return Inference(outcome, n_samples, requested, request_id, oip_decisions.left_out_parameters(body, requested))


def controllable(state: AppState) -> None:
    """Model control changes what is served: it needs the API key, and acts on one process only."""
    if state.settings.api_key is None:
        raise ApiError(403, "model control needs an API key (DIRECTOR_API_KEY): without one, anybody could unload "
                            "the models; add or remove version folders instead (the repository is polled)")
    if state.settings.workers > 1:
        raise ApiError(409, "model control acts on one process and this server runs several workers: add or remove "
                            "version folders instead (every worker polls the repository)")


def repository_index(state: AppState, ready_only: bool) -> list[dict[str, Any]]:
    """Every model version with its state, as Triton's index lists them (unloaded models by name, no version)."""
    rows: list[dict[str, Any]] = []
    for entry in state.repository.all_versions():
        if ready_only and entry.state is not VersionState.READY:
            continue
        row = {"name": entry.name, "version": entry.version, "state": TRITON_STATES[entry.state]}
        if entry.reason:
            row["reason"] = entry.reason
        rows.append(row)
    if not ready_only:
        rows += [{"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
                 for name in sorted(state.repository.unloaded)]
    return rows


async def load_model(state: AppState, name: str) -> None:
    controllable(state)
    if not await state.repository.load(name):
        raise not_found(f"no model folder {shown(name)} in the repository")
    if name in state.repository.unloaded:  # an unload of the same model ran while this load scanned
        raise ApiError(409, f"model {shown(name)} was unloaded while it loaded; load it again to serve it")
    if state.repository.default_version(name) is None:
        reasons = "; ".join(f"version {v.version}: {v.reason}" for v in state.repository.versions(name) if v.reason)
        raise ApiError(400, f"model {shown(name)} has no version that loaded" + (f" ({reasons})" if reasons else ""))


async def unload_model(state: AppState, name: str) -> None:
    controllable(state)
    if not await state.repository.unload(name):
        raise not_found(f"unknown model {shown(name)}")
