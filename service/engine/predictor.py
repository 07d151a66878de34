"""The prediction use-case every protocol shares (``/predict``, the upload route, OIP and offline batch scoring):
resolve the model version, check the sample count, take a queue slot, decode the inputs with the model's decoder in
the decode pool, queue them on the version's batching worker, and turn the summaries into per-input results with
the manifest's OOD rule. Records metrics, statistics, drift and the log that ``/feedback`` joins to. The routes only
translate their protocol to raw inputs (``service.engine.modalities.base``) and the ``Outcome`` back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.uncertainty import UncertaintySummary, ood_score
from service.config import Settings
from service.engine.artifact import ArtifactError, OodRule, ood_rule
from service.engine.batching import BatchResult, Draining, QueueFull, Ticket
from service.engine.decisions import AnswersDecisions, DecisionRequest, Decisions
from service.engine.decoding import DecodePool
from service.engine.device import DeviceOutOfMemory
from service.engine.modalities.base import InputBatch, InputLimits, RawInput, Text
from service.engine.repository import ModelRepository, ModelVersion, ReadyVersion, VersionState
from service.engine.shift import Shift, check_shift, expected_flag_rate
from service.errors import ApiError, invalid, not_found, overloaded, shown, too_large
from service.feedback.decisions import DecisionLog, set_mask
from service.feedback.store import FeedbackStore, LabelSet
from service.observability.drift import Drift, DriftMonitor
from service.observability.metrics import DRAINING, QUEUE_FULL, TIMEOUT, Metrics
from service.observability.statistics import Statistics
from service.observability.tracing import Tracing
from service.random_ids import random_hex

log = logging.getLogger("service.engine.predictor")
# a request's raw inputs, or what produces them in the decode pool (a protocol whose parsing is CPU-bound too)
RawInputs = Sequence[RawInput] | Callable[[], Sequence[RawInput]]


@dataclass(frozen=True)
class Outcome:
    """One request's result, protocol-neutral."""

    id: str
    entry: ReadyVersion
    n_samples: int
    rule: OodRule
    summary: UncertaintySummary  # fields [n]
    ood: list[float]
    is_ood: list[bool]
    batch: BatchResult
    extras: Mapping[str, list[Any]] = field(default_factory=dict)  # per-input facts from the decoder (texts: tokens)
    client_request_id: str | None = None  # the request's X-Request-ID, logged with it for /feedback
    decisions: Decisions | None = None  # prediction sets and abstentions, when the request asked for them


class Predictor:
    def __init__(self, settings: Settings, repository: ModelRepository, decoder: DecodePool, metrics: Metrics,
                 statistics: Statistics, feedback: FeedbackStore, tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.repository = repository
        self.decoder = decoder
        self.metrics = metrics
        self.statistics = statistics
        self.feedback = feedback
        self.limits = InputLimits(settings.max_text_chars, settings.max_image_pixels, settings.max_request_pixels)
        self.drift: dict[tuple[str, str], DriftMonitor] = {}
        self.last_drift: dict[tuple[str, str], Drift | None] = {}  # each version's latest live drift
        self.tracing = tracing if tracing is not None else Tracing(None)

    def resolve(self, model: str | None, version: str | None) -> ReadyVersion:
        """The ready version a request names (the default model, the highest ready version), or the error why not."""
        name = model or self.settings.default_model
        repo = self.repository
        if not repo.is_known(name):
            raise not_found(f"unknown model {shown(name)}; known: {', '.join(sorted(repo.models)) or 'none'}")
        entry = repo.get(name, version)
        if entry is None and version is not None:
            known = ", ".join(v.version for v in repo.versions(name))
            raise not_found(f"model {shown(name)} has no version {shown(version)}; known: {known}")
        if entry is None:
            entry = self.newest_not_ready(name)
        if entry.state is VersionState.LOADING:
            raise overloaded(f"model {shown(name)} version {entry.version} is still loading", retry_after_s=5)
        if entry.state is VersionState.UNAVAILABLE:
            raise ApiError(503, f"model {shown(name)} version {entry.version} is unavailable: {entry.reason}")
        ready = entry.ready()
        if ready is None:  # READY without its artifact or worker cannot happen: the repository sets all three at once
            raise ApiError(503, f"model {shown(name)} version {entry.version} is not ready")
        return ready

    def newest_not_ready(self, name: str) -> ModelVersion:
        """The version that says why a model has no ready one: one still loading (a retry will find it) before the
        newest that cannot load (its reason, as ``GET /models`` shows it)."""
        versions = self.repository.versions(name)
        if not versions:
            raise overloaded(f"model {shown(name)} has no version yet", retry_after_s=5)
        loading = [v for v in versions if v.state is VersionState.LOADING]
        return (loading or versions)[-1]

    def samples(self, entry: ReadyVersion, n_samples: int | None) -> int:
        """The request's sample count (the model's default when it names none), within the model's maximum (its
        config.yaml's, else the manifest's)."""
        count = entry.default_samples if n_samples is None else n_samples
        if not 1 <= count <= entry.max_samples:
            raise invalid(f"n_samples must be between 1 and {entry.max_samples} for {entry.name} "
                          f"version {entry.version}, got {count}", ["body", "n_samples"])
        return count

    async def predict(self, entry: ReadyVersion, inputs: RawInputs, n_samples: int, seed: int | None,
                      ticket: Ticket | None = None, request_id: str | None = None,
                      ask: DecisionRequest | None = None) -> Outcome:
        """Decode ``inputs`` with the model's decoder on a queue slot of the version (the one admission reserved, if
        it is this version's) and run them; ``request_id`` (the client's) is logged with the predictions; ``ask``:
        the prediction sets and abstentions the request wants (``service.engine.decisions``), answered in ``run``
        so that the log keeps them."""
        decisions = self.decisions_for(entry, ask)
        with self.queue_slot(entry, ticket) as slot:
            try:  # a sample count the manifest has no usable threshold for is refused before anything is decoded
                rule = ood_rule(entry.artifact.manifest.ood, n_samples)
            except ArtifactError as exc:  # e.g. only mutual-information thresholds and n_samples = 1
                raise invalid(str(exc), ["body", "n_samples"]) from exc
            batch = await self.decoder.run(self.decode, entry, inputs)
            return await self.run(entry, batch, n_samples, seed, rule, slot, request_id,
                                  None if decisions is None or ask is None else (decisions, ask))

    @staticmethod
    def decisions_for(entry: ReadyVersion, ask: DecisionRequest | None) -> AnswersDecisions | None:
        """The version's decisions when the request asks for sets or abstentions: 400 when it has none (it was
        exported without them) or its task answers no such ask, 422 when it cannot answer what is asked; checked
        before anything is queued."""
        if ask is None:
            return None
        incomplete = ask.incomplete()
        if incomplete is not None:
            raise invalid(incomplete, ["body"])
        if not ask.asked:
            return None
        refusal = entry.artifact.task.decisions_refusal(ask)
        if refusal is not None:
            raise ApiError(400, f"model {shown(entry.name)} version {entry.version}: {refusal}")
        decisions = entry.artifact.decisions
        if decisions is None and entry.artifact.task.multi_label:
            raise ApiError(400, f"model {shown(entry.name)} version {entry.version} has no label-recall calibration, "
                                "so it answers no coverage: export the model again with export.calibration_share "
                                "above 0 (python -m training export, or calibrate) to give its version one")
        if decisions is None:
            raise ApiError(400, f"model {shown(entry.name)} version {entry.version} has no conformal calibration, so "
                                "it answers neither coverage nor max_risk: export the model again (python -m training "
                                "export, or calibrate) to give its version one")
        problem = decisions.problem(ask)
        if problem is not None:
            raise invalid(problem, ["body"])
        return decisions

    def decode(self, entry: ReadyVersion, inputs: RawInputs) -> InputBatch:
        """The server's size limits (inputs per request, characters per text, whatever the model), then the model's
        decoder. CPU-bound: runs in the decode pool."""
        items = inputs() if callable(inputs) else inputs
        count = sum(item.count for item in items)
        limit = self.settings.max_inputs_per_request
        if count > limit:
            raise too_large(f"{count} inputs in one request, the limit is {limit}")
        for item in items:
            if isinstance(item, Text) and len(item.text) > self.limits.max_text_chars:
                where = ".".join(str(part) for part in item.loc[1:])
                raise too_large(f"{where}: text has {len(item.text)} characters, the limit is "
                                f"{self.limits.max_text_chars}")
        return entry.artifact.decoder.decode(items, self.limits, entry.name)

    @contextlib.contextmanager
    def queue_slot(self, entry: ReadyVersion, ticket: Ticket | None) -> Iterator[Ticket]:
        """This request's slot in the version's queue, held while its inputs are decoded and handed to ``run``: the
        slot admission reserved when it is this version's, else a free one now. Without one the request is refused
        with 503 here, before the decode pool spends anything on it (admission can only refuse before the body when
        every ready version is full, since ``/predict`` names its model in the body). Released if the request ends
        before it is queued."""
        worker = entry.worker
        if ticket is None or ticket.slots is not worker.slots or not ticket.live:
            if ticket is not None:
                ticket.release()
            ticket = worker.reserve()
        if ticket is None:
            labels = (entry.name, entry.version)
            if worker.closed:
                self.metrics.rejected.labels(*labels, DRAINING).inc()
                raise overloaded("model version is shutting down", retry_after_s=5)
            self.metrics.rejected.labels(*labels, QUEUE_FULL).inc()
            raise overloaded(f"model {entry.name!r} is overloaded: queue full ({worker.max_queue} requests queued "
                             "or being prepared)")
        try:
            yield ticket
        finally:
            ticket.release()  # a no-op once queued: queuing consumed it

    def check_cost(self, entry: ReadyVersion, inputs: InputBatch, n_samples: int) -> None:
        """413 for a request that costs more than ``max_request_batches`` full batches of its version, before it is
        queued: the limit and the request's cost are named, so the client can split it or lower n_samples."""
        cost = entry.worker.batch_cost
        spent = cost.cost(inputs.size * n_samples, inputs.longest)
        batches = self.settings.max_request_batches
        limit = cost.budget * batches
        if spent > limit:
            raise too_large(f"the request costs {spent:,} {cost.unit}; model {entry.name!r} takes at most {limit:,} "
                            f"per request ({batches} batches of {cost.budget:,}, DIRECTOR_MAX_REQUEST_BATCHES): send "
                            "fewer inputs or a smaller n_samples")

    async def run(self, entry: ReadyVersion, inputs: InputBatch, n_samples: int, seed: int | None, rule: OodRule,
                  ticket: Ticket | None = None, request_id: str | None = None,
                  decide: tuple[AnswersDecisions, DecisionRequest] | None = None) -> Outcome:
        """Queue decoded ``inputs`` on the version's worker; map overload, drain and timeout to 503/503/504. Counted
        end to end, by outcome, in the version's statistics and ``director_model_request_duration_seconds``.
        ``rule`` is the manifest's OOD rule at ``n_samples``; ``decide``: the version's conformal part and what the
        request asks of it, answered before the outcome is recorded, so the prediction log keeps the decisions
        (live coverage and selective risk, docs/operations.md)."""
        self.check_cost(entry, inputs, n_samples)
        labels = (entry.name, entry.version)
        started, queued_ns = time.perf_counter(), time.time_ns()
        try:
            batch = await self._batched(entry, inputs, n_samples, seed, ticket)
        except BaseException:  # a refusal, a timeout, a failed forward, or the client gone
            self._count(labels, "fail", time.perf_counter() - started)
            raise
        self._count(labels, "success", time.perf_counter() - started)
        if self.tracing.enabled:
            self._trace(entry, n_samples, batch, queued_ns)
        scores = ood_score(batch.summary, rule.score, batch.input_scores, rule.terms).tolist()  # named by the worker
        flags = [score > rule.threshold for score in scores]
        decisions = None if decide is None else decide[0].decide(batch.summary.probabilities, self.shift(entry, flags),
                                                                 decide[1])
        outcome = Outcome(random_hex(16), entry, n_samples, rule, batch.summary, scores, flags, batch,
                          inputs.extras, request_id, decisions)
        self.record(outcome)
        # One batch wakes all its requests at once; without a yield here the loop would build and send every one of
        # their responses before it next reads a socket, leaving new requests unread meanwhile.
        await asyncio.sleep(0)
        return outcome

    def _trace(self, entry: ReadyVersion, n_samples: int, batch: BatchResult, queued_ns: int) -> None:
        """The request's queue wait and its batch's forwards as spans under the current one (the HTTP request's);
        called only with tracing on."""
        forward_ns = queued_ns + int(batch.queue_s * 1e9)
        attributes = {"model": entry.name, "model.version": entry.version, "n_samples": n_samples}
        self.tracing.span("queue", queued_ns, forward_ns, attributes)
        self.tracing.span("inference", forward_ns, forward_ns + int(batch.inference_s * 1e9),
                          {**attributes, "batch.requests": batch.batch_requests, "batch.inputs": batch.batch_inputs,
                           "batch.rows": batch.batch_rows})

    def _count(self, labels: tuple[str, str], outcome: str, elapsed: float) -> None:
        getattr(self.statistics.of(*labels), outcome).add(elapsed)
        self.metrics.model_requests.labels(*labels, outcome).observe(elapsed)

    async def _batched(self, entry: ReadyVersion, inputs: InputBatch, n_samples: int, seed: int | None,
                       ticket: Ticket | None) -> BatchResult:
        labels = (entry.name, entry.version)
        metrics = self.metrics
        worker = entry.worker
        timeout = entry.serving.request_timeout_s
        try:
            future = worker.enqueue(inputs, n_samples, seed, ticket)
            metrics.queue_depth.labels(*labels).set(worker.depth)
            async with asyncio.timeout(timeout):  # not wait_for, which can swallow a cancel (Python 3.11)
                return await future
        except QueueFull as exc:
            metrics.rejected.labels(*labels, QUEUE_FULL).inc()
            raise overloaded(f"model {entry.name!r} is overloaded: {exc}") from exc
        except Draining as exc:
            metrics.rejected.labels(*labels, DRAINING).inc()
            raise overloaded(str(exc), retry_after_s=5) from exc
        except DeviceOutOfMemory as exc:  # that batch failed; the next one starts from an emptied cache
            raise overloaded(f"model {entry.name!r} ran out of device memory on this batch: {exc}") from exc
        except TimeoutError as exc:
            metrics.rejected.labels(*labels, TIMEOUT).inc()
            raise ApiError(504, f"no result within {timeout:g}s") from exc
        finally:
            metrics.queue_depth.labels(*labels).set(worker.depth)

    def record(self, outcome: Outcome) -> None:
        """Metrics, drift at the default sample count, and the prediction log ``/feedback`` joins to."""
        entry, summary = outcome.entry, outcome.summary
        manifest = entry.artifact.manifest
        confidence = summary.confidence.tolist()
        rows = entry.artifact.task.logged(summary, manifest.labels)  # the log's (a multi-label model: its label sets)
        self.metrics.observe_summary(entry.name, entry.version, summary, outcome.ood, outcome.is_ood,
                                     outcome.rule.relative(outcome.ood))
        if outcome.n_samples == manifest.sampling.default_samples:  # the reference's sample count
            monitor = self.drift_monitor(entry)
            if monitor is not None:
                drift = monitor.observe(confidence)
                self.last_drift[(entry.name, entry.version)] = drift
                if drift is not None:
                    self.metrics.drift_ks.labels(entry.name, entry.version).set(drift.ks)
                    self.metrics.drift_psi.labels(entry.name, entry.version).set(drift.psi)
        try:
            self.feedback.log(outcome.id, entry.name, entry.version, outcome.n_samples, rows,  # buffered: no I/O
                              outcome.client_request_id, decision_log(outcome.decisions),
                              LabelSet(tuple(manifest.labels), entry.artifact.task.multi_label))
        except Exception:  # the prediction is still good: losing its log only weakens live accuracy
            log.exception("could not log prediction %s", outcome.id)

    def shift(self, entry: ReadyVersion, flagged: list[bool]) -> Shift:
        """The request's shift signals: its inputs' OOD flags against the share the manifest expects, and the
        version's live drift (``service.engine.shift``)."""
        monitor = self.drift.get((entry.name, entry.version))
        drift = self.last_drift.get((entry.name, entry.version)) if monitor is not None \
            and monitor.owner == id(entry.artifact) else None
        return check_shift(flagged, expected_flag_rate(entry.artifact.manifest.ood.tpr), drift)

    def drift_monitor(self, entry: ReadyVersion) -> DriftMonitor | None:
        """The version's live confidence window against its manifest's reference (None without one); a reloaded
        version starts a fresh window."""
        key = (entry.name, entry.version)
        monitor = self.drift.get(key)
        artifact = entry.artifact
        reference = artifact.manifest.reference
        if reference is None:
            return None
        if monitor is None or monitor.owner != id(artifact):
            try:
                monitor = DriftMonitor(reference.document(), self.settings.drift_window,
                                       self.settings.drift_min_window, owner=id(artifact))
            except (KeyError, TypeError, ValueError):
                log.warning("model %s version %s has no usable reference distribution", *key)
                return None
            self.drift[key] = monitor
        return monitor


def decision_log(decisions: Decisions | None) -> DecisionLog | None:
    """What the prediction log keeps of a request's sets and abstentions (``service.feedback.decisions``)."""
    if decisions is None:
        return None
    sets = None if decisions.sets is None else [set_mask(indices) for indices in decisions.sets]
    return DecisionLog(decisions.coverage, sets, decisions.max_risk, decisions.abstain)
