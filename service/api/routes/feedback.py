"""POST /feedback: join a delayed true label to a logged prediction; updates live accuracy and ECE, and records
whether the prediction set logged with it held the label (live coverage, docs/operations.md)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import AppStateDep, FeedbackClientDep
from service.api.json_body import JsonRoute
from service.api.protocol import FeedbackRequest, FeedbackResponse
from service.engine.tasks import label_outcomes, shown_labels
from service.errors import ERROR_RESPONSES, invalid, not_found, overloaded, shown
from service.feedback.decisions import in_set
from service.feedback.store import FeedbackUnavailable, LabelSet, LoggedPrediction
from service.observability.metrics import UNKNOWN
from service.state import AppState

router = APIRouter(tags=["feedback"], responses=ERROR_RESPONSES, route_class=JsonRoute)


@router.post("/feedback", response_model=FeedbackResponse, summary="Report the true label of a prediction")
async def feedback(body: FeedbackRequest, state: AppStateDep, client: FeedbackClientDep) -> FeedbackResponse:
    """Takes the feedback keys when the server has them (``DIRECTOR_FEEDBACK_KEYS``), else the API key; the label is
    attributed to the key's name, else to the peer's address."""
    try:
        return await record_feedback(body, state, client)
    except FeedbackUnavailable as exc:  # a store that is down, locked, full or slow: the label can be sent again
        raise overloaded(str(exc), retry_after_s=5) from exc


def label_set(state: AppState, logged: LoggedPrediction) -> LabelSet | None:
    """The labels the prediction was logged with; for a row an earlier release logged, its version's if loaded."""
    if logged.label_set is not None:
        return logged.label_set
    entry = state.repository.get(logged.model, logged.version)
    artifact = entry.artifact if entry is not None else None
    return None if artifact is None else LabelSet(tuple(artifact.labels), artifact.task.multi_label)


async def record_feedback(body: FeedbackRequest, state: AppState, client: str) -> FeedbackResponse:
    store = state.feedback
    calls = state.store_calls
    prediction = body.id
    if prediction is None:
        assert body.request_id is not None  # the schema takes one of the two
        prediction = await calls.run(store.prediction_of, body.request_id)
        if prediction is None:
            raise not_found(f"no logged prediction under request id {shown(body.request_id)} (unknown, or pruned)")
    logged = await calls.run(store.lookup, prediction, body.index)
    if logged is None:
        raise not_found(f"no logged prediction {shown(prediction)} input {body.index} (unknown, or pruned)")
    known = label_set(state, logged)
    labels = list(known.labels) if known is not None else None
    model, version = state.metric_labels(logged.model, logged.version)
    exact = isinstance(body.label, list)  # a multi-label model's: accuracy is the exact-match rate
    if exact or (known is not None and known.multi_label):
        correct = multi_label_feedback(body.label, logged, labels, known is None or known.multi_label)
        was_covered, recall = None, set_recall(logged, body.label, labels) if isinstance(body.label, list) else None
    else:
        correct = single_label_feedback(body.label, logged, labels)
        was_covered, recall = covered(logged, body.label, labels), None
    await calls.run(store.record, prediction, body.index, correct, was_covered, recall, client)
    stats = await calls.run(store.live_stats, logged.model, logged.version)
    state.metrics.feedback.labels(model, version).inc()
    if isinstance(body.label, list):  # each label's outcome, once the feedback is recorded
        state.metrics.observe_label_feedback(model, version, label_outcomes(logged.label, body.label, labels))
    if stats is not None and version != UNKNOWN:
        # a mean decision confidence against exact matches would be no calibration error
        state.metrics.live.set_stats(model, version, stats.accuracy, None if exact else stats.ece, stats.clients)
    return FeedbackResponse(id=prediction, index=body.index, model=logged.model, model_version=logged.version,
                            correct=correct, live_accuracy=stats.accuracy if stats else None,
                            live_ece=stats.ece if stats and not exact else None, labelled=stats.n if stats else 0)


def single_label_feedback(label: int | str, logged: LoggedPrediction, labels: list[str] | None) -> bool:
    """Whether the logged prediction is the true ``label`` (a name or an index), checked against the version's."""
    if isinstance(label, int):
        if labels is not None and not 0 <= label < len(labels):
            raise invalid(f"label index {label} outside 0..{len(labels) - 1}", ["body", "label"])
        return label == logged.class_index
    if labels is not None and label not in labels:
        raise invalid(f"unknown label {shown(label)}; labels: {shown_labels(labels)}", ["body", "label"])
    return label == logged.label


def multi_label_feedback(label: int | str | list[int | str], logged: LoggedPrediction, labels: list[str] | None,
                         multi_label: bool) -> bool:
    """Whether the logged label set of a multi-label prediction is exactly the true ``label`` list (each label's own
    outcome goes to ``director_feedback_label_decisions_total``)."""
    if not multi_label:
        raise invalid("a single-label model takes one true label (a name or an index), not a list", ["body", "label"])
    if not isinstance(label, list):
        raise invalid("a multi-label model takes the list of true labels (names or indices; [] for none)",
                      ["body", "label"])
    try:
        return all(label_outcomes(logged.label, label, labels).values())
    except ValueError as exc:
        raise invalid(str(exc), ["body", "label"]) from exc


def covered(logged: LoggedPrediction, label: int | str, labels: list[str] | None) -> bool | None:
    """Whether the logged prediction set held the true label; None without a set, or for a label name of a version
    no longer loaded (its index is unknown: that label counts for accuracy only)."""
    if logged.prediction_set is None:
        return None
    if isinstance(label, str):
        if labels is None:
            return None
        label = labels.index(label)
    return in_set(logged.prediction_set, label)


def set_recall(logged: LoggedPrediction, truth: list[int | str], labels: list[str] | None) -> float | None:
    """The share of the true labels (names or indices, already checked) that the logged multi-label set held, 1 when
    there is none; None without a set, or when the version is no longer loaded (names cannot be mapped to the set's
    indices)."""
    if logged.prediction_set is None or labels is None:
        return None
    indices = {value if isinstance(value, int) else labels.index(value) for value in truth}
    if not indices:
        return 1.0
    return sum(in_set(logged.prediction_set, index) for index in indices) / len(indices)
