"""POST /predict (JSON) and POST /predict/image (multipart upload)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, File, Form, Request, Response, UploadFile

from service.api.admission import ticket_of
from service.api.deps import AppStateDep, require_api_key
from service.api.json_body import JsonRoute
from service.api.protocol import PredictRequest, PredictResponse, raw_inputs
from service.api.request_context import request_id_of
from service.api.routes.client_gone import unless_client_leaves
from service.engine.decisions import DecisionRequest, Decisions
from service.engine.modalities.base import EncodedImage
from service.engine.predictor import Outcome
from service.errors import ERROR_RESPONSES, too_large

router = APIRouter(tags=["predict"], dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES,
                   route_class=JsonRoute)


class JsonBody(Response):
    """A body built here as plain JSON types and written by orjson: FastAPI passes a returned ``Response`` through,
    so the response model (kept on the route for the OpenAPI schema) is neither validated again nor re-encoded."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def inputs_counted(request: Request, state: AppStateDep) -> None:
    """413 for a body holding more inputs than a request may, before FastAPI validates it: FastAPI runs dependencies
    after parsing the JSON but before validating the body, on the event loop, and validating a million small inputs
    would hold every other request (health probes included) for seconds before the predictor's own count refused
    it. Anything else about the body is left to the validation."""
    try:
        body = await request.json()  # parsed once: FastAPI's own read is cached on the request
    except (ValueError, RecursionError):  # not JSON, or nested past the parser: the validation answers
        return
    inputs = body.get("inputs") if isinstance(body, dict) else None
    limit = state.settings.max_inputs_per_request
    if isinstance(inputs, list) and len(inputs) > limit:
        raise too_large(f"{len(inputs)} inputs in one request, the limit is {limit}")


def elapsed_ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)


def to_response(outcome: Outcome, return_probabilities: bool, started: float) -> JsonBody:
    """The ``PredictResponse`` of ``outcome`` as JSON, fields that are None left out (``response_model_exclude_none``
    on the route says the same for the schema). Every value comes from the server's own summary, already typed."""
    entry, s = outcome.entry, outcome.summary
    labels = entry.artifact.labels
    probabilities = s.probabilities.tolist() if return_probabilities else None
    per_label = entry.artifact.task.prediction_fields(s, labels)  # a multi-label model's labels and entropies
    predictions = []
    for i, (c, conf, pe, ee, mi, score, flag) in enumerate(zip(
            s.prediction.tolist(), s.confidence.tolist(), s.predictive_entropy.tolist(), s.expected_entropy.tolist(),
            s.mutual_information.tolist(), outcome.ood, outcome.is_ood, strict=True)):
        prediction: dict[str, Any] = {"index": i, "label": labels[c], "class_index": c, "confidence": conf}
        if probabilities is not None:
            prediction["probabilities"] = dict(zip(labels, probabilities[i], strict=True))
        prediction.update(predictive_entropy=pe, expected_entropy=ee, mutual_information=mi, ood_score=score,
                          is_ood=flag, **per_label[i])
        prediction.update({name: values[i] for name, values in outcome.extras.items()})
        predictions.append(prediction)
    decided = decisions_json(outcome.decisions, labels, predictions)
    rule, batch = outcome.rule, outcome.batch
    ood: dict[str, Any] = {"score": rule.score, "threshold": rule.threshold,
                           "calibrated_n_samples": rule.calibrated_samples}
    if rule.note is not None:
        ood["note"] = rule.note
    timings: dict[str, Any] = {"queue_ms": round(batch.queue_s * 1000, 3),
                               "inference_ms": round(batch.inference_s * 1000, 3),
                               "total_ms": elapsed_ms(started), "batch_requests": batch.batch_requests,
                               "batch_rows": batch.batch_rows}
    if batch.padded_length is not None:
        timings["batch_padded_length"] = batch.padded_length
    return JsonBody({"id": outcome.id, "model": entry.name, "model_version": entry.version,
                     "n_samples": outcome.n_samples, "ood": ood, "predictions": predictions,
                     **({"decisions": decided} if decided else {}), "timings": timings})


def decisions_json(decisions: Decisions | None, labels: list[str], predictions: list[dict[str, Any]]
                   ) -> dict[str, Any] | None:
    """Each prediction's set and abstention (added to ``predictions``) and the response's ``decisions`` object, its
    unset fields left out; None when the request asked for neither."""
    if decisions is None:
        return None
    for i, prediction in enumerate(predictions):
        if decisions.sets is not None:
            prediction["prediction_set"] = [labels[c] for c in decisions.sets[i]]
            prediction["set_size"] = len(decisions.sets[i])
        if decisions.abstain is not None:
            prediction["abstain"] = decisions.abstain[i]
        if decisions.exchangeable is not None:
            prediction["exchangeable"] = decisions.exchangeable[i]
    return decisions.rules()


@router.post("/predict", response_model=PredictResponse, response_model_exclude_none=True,
             summary="Predict with uncertainty",
             description="Classify one or more inputs with `n_samples` stochastic forwards each. Images are "
                         "converted to the model's channels and size (PIL `L`/`RGB`, transparency onto black, "
                         "bilinear resize, aspect ratio not kept); pixel arrays must already have the model's "
                         "shape. Texts (text models only) are tokenised with the model's tokenizer and truncated "
                         "to the manifest's `input.max_length` tokens, reported per input (`tokens`, `truncated`, "
                         "`dropped_tokens`); a text over the model's character limit is refused with 413. Requests "
                         "are batched dynamically with other requests unless `seed` is given.",
             dependencies=[Depends(inputs_counted)])
async def predict(body: PredictRequest, state: AppStateDep, request: Request) -> Response:
    started = time.perf_counter()
    predictor = state.predictor
    entry = predictor.resolve(body.model, body.version)
    n_samples = predictor.samples(entry, body.n_samples)
    outcome = await unless_client_leaves(request, predictor.predict(
        entry, raw_inputs(body.inputs), n_samples, body.seed, ticket_of(request.scope), request_id_of(request.scope),
        body.decision_request()))
    return to_response(outcome, body.return_probabilities, started)


@router.post("/predict/image", response_model=PredictResponse, response_model_exclude_none=True,
             summary="Predict one uploaded image (multipart/form-data)",
             description="Same as /predict for a single PNG or JPEG file sent as the form field `file`.")
async def predict_image(
    state: AppStateDep,
    request: Request,
    file: Annotated[UploadFile, File(description="PNG or JPEG image")],
    model: Annotated[str | None, Form(description="model name (default: the server's default model)")] = None,
    version: Annotated[str | None, Form(description="model version (default: highest ready)")] = None,
    n_samples: Annotated[int | None, Form(ge=1, description="stochastic samples")] = None,
    seed: Annotated[int | None, Form(ge=0, le=2**63 - 1, description="reproducible run")] = None,
    return_probabilities: Annotated[bool, Form(description="include the label -> probability map")] = True,
    coverage: Annotated[float | None, Form(gt=0, lt=1, description="prediction set at this coverage")] = None,
    conformal_score: Annotated[Literal["lac", "aps", "raps"] | None, Form(description="the sets' score")] = None,
    class_conditional: Annotated[bool, Form(description="coverage within each class")] = False,
    max_risk: Annotated[float | None, Form(gt=0, lt=1, description="abstain above this risk")] = None,
    abstain_if_ood: Annotated[bool, Form(description="inputs that are not exchangeable abstain")] = True,
    widen_if_shifted: Annotated[bool, Form(description="sets hold every label when the input looks shifted")] = True,
) -> Response:
    started = time.perf_counter()
    predictor = state.predictor
    entry = predictor.resolve(model, version)
    count = predictor.samples(entry, n_samples)
    data = await file.read(state.settings.max_body_bytes + 1)
    if len(data) > state.settings.max_body_bytes:
        raise too_large(f"file larger than {state.settings.max_body_bytes} bytes")
    outcome = await unless_client_leaves(request, predictor.predict(
        entry, [EncodedImage(data, ["body", "file"])], count, seed, ticket_of(request.scope),
        request_id_of(request.scope),
        DecisionRequest(coverage, max_risk, conformal_score, class_conditional, abstain_if_ood, widen_if_shifted)))
    return to_response(outcome, return_probabilities, started)
