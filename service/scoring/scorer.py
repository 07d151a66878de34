"""The offline scorer every engine shares: the batch CLI, Ray Data's actors, Dask's partitions, Spark's UDF.

``Scorer(repository, model, version, ...)`` loads that one version as the server does (``service.scoring.version``)
and answers a chunk of inputs as ``/predict`` answers one request with the same inputs: the server's decoders, its
batch worker's forward and summary (``BatchWorker.infer``, under the request's seed), the manifest's OOD rule, the
version's prediction sets and abstentions, and ``/predict``'s own response builder. Each line is one input's
prediction with its ``key``, the model version and the OOD rule, or its ``error`` and ``status``.

Called on a batch (a dict of NumPy arrays, a pandas DataFrame or an Arrow table; ``service.scoring.batches``) it
returns the lines as columns of the same kind, one row per input, in order."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from models.uncertainty import ood_score
from service.api.routes.predict import to_response
from service.config import Settings
from service.engine.artifact import ArtifactError, ood_rule
from service.engine.batching import BatchResult
from service.engine.decisions import DecisionRequest
from service.engine.modalities.base import InputBatch, InputLimits, RawInput, Text
from service.engine.predictor import Outcome, Predictor
from service.engine.repository import Only
from service.engine.shift import Shift, check_shift, expected_flag_rate
from service.errors import ApiError, invalid, too_large
from service.scoring.batches import Input, Item, from_columns, probe_input, to_columns
from service.scoring.version import ScoringError, load_version

Batch = TypeVar("Batch")
ERROR_COLUMNS = ("error", "status")


def error_line(key: str, error: ApiError) -> dict[str, Any]:
    return {"key": key, "error": str(error), "status": error.status}


class Scorer:
    """One model version's answers to chunks of inputs, byte for byte the server's for the same inputs and seed."""

    def __init__(self, repository: str | Path, model: str, version: str | None = None, *,
                 n_samples: int | None = None, seed: int | None = None, ask: DecisionRequest | None = None,
                 settings: Settings | None = None) -> None:
        self.arguments = (repository, model, version, n_samples, seed, ask, settings)
        self.settings = settings if settings is not None else Settings()
        self.entry = entry = load_version(Path(repository), Only(model, version), self.settings)
        self.n_samples = entry.default_samples if n_samples is None else n_samples
        self.seed, self.ask = seed, ask
        given = self.settings
        self.limits = InputLimits(given.max_text_chars, given.max_image_pixels, given.max_request_pixels)
        try:  # what the server checks per request, checked once: the run fails, not every input
            if not 1 <= self.n_samples <= entry.max_samples:
                raise invalid(f"n_samples must be between 1 and {entry.max_samples} for {entry.name} version "
                              f"{entry.version}, got {self.n_samples}")
            self.decisions = Predictor.decisions_for(entry, ask)
            self.rule = ood_rule(entry.artifact.manifest.ood, self.n_samples)
        except (ApiError, ArtifactError) as exc:
            raise ScoringError(str(exc)) from exc
        self._columns: list[str] | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its arguments: a process that unpickles one (a Dask or Spark worker) loads the model itself."""
        repository, model, version, n_samples, seed, ask, settings = self.arguments
        rebuild = partial(type(self), n_samples=n_samples, seed=seed, ask=ask, settings=settings)
        return rebuild, (repository, model, version)

    @property
    def version(self) -> str:
        return self.entry.version

    def __call__(self, batch: Batch) -> Batch:
        """The batch's lines as columns (``columns`` and any other a line has), one row per input, in order."""
        return to_columns(self.lines(from_columns(batch)), self.columns, batch)

    @property
    def columns(self) -> list[str]:
        """The fields of a line, in order: those of a scored input (found by scoring one), then error and status."""
        if self._columns is None:
            line = self.request([("probe", probe_input(self.entry.artifact.decoder))])[0]
            self._columns = [*line, *ERROR_COLUMNS]
        return self._columns

    def lines(self, items: Sequence[Item]) -> list[dict[str, Any]]:
        """Each item's line, in order. The good ones are answered as one request; when the server would refuse that
        request, input by input, so that one bad input costs only its own line."""
        good = [i for i, (_, item) in enumerate(items) if not isinstance(item, ApiError)]
        out = [error_line(key, item) if isinstance(item, ApiError) else {} for key, item in items]
        if not good:
            return out
        try:
            answered = self.request([items[i] for i in good])  # type: ignore[misc]
        except ApiError as exc:
            if len(good) > 1:
                answered = [self.lines([items[i]])[0] for i in good]
            else:
                answered = [error_line(items[good[0]][0], exc)]
        for i, line in zip(good, answered, strict=True):
            out[i] = line
        return out

    def request(self, items: Sequence[tuple[str, Input]]) -> list[dict[str, Any]]:
        """One request's worth of inputs, answered as ``/predict`` answers it (probabilities included, the sets and
        abstentions asked, with the rules applied on every line); ``ApiError`` when the server would refuse it."""
        started = time.perf_counter()
        entry, samples = self.entry, self.n_samples
        inputs = self.decode([item.raw(["body", "inputs", i]) for i, (_, item) in enumerate(items)])
        sizes = [inputs.size]
        forward, (summary,), (scores,) = entry.worker.infer([inputs], [samples] * inputs.size, sizes, [samples],
                                                            self.seed)
        rule = self.rule
        ood = ood_score(summary, rule.score, scores, rule.terms).tolist()
        flags = [score > rule.threshold for score in ood]
        decisions = None if self.decisions is None or self.ask is None else \
            self.decisions.decide(summary.probabilities, self.shift(flags), self.ask)
        batch = BatchResult(summary, scores, 0.0, time.perf_counter() - started, 1, inputs.size, inputs.size * samples,
                            forward.padded_length)
        outcome = Outcome("", entry, samples, rule, summary, ood, flags, batch, inputs.extras, None, decisions)
        answer = json.loads(to_response(outcome, True, started).body)
        common = {"model": answer["model"], "model_version": answer["model_version"], "n_samples": answer["n_samples"],
                  "ood_score_name": answer["ood"]["score"], "ood_threshold": answer["ood"]["threshold"],
                  **({"decisions": answer["decisions"]} if "decisions" in answer else {})}
        return [{"key": key, **common, **{k: v for k, v in p.items() if k != "index"}}
                for (key, _), p in zip(items, answer["predictions"], strict=True)]

    def decode(self, items: list[RawInput]) -> InputBatch:
        """The server's per-input limits, then the model's decoder. No inputs-per-request limit: a chunk is no
        request, and ``--chunk`` sizes it."""
        limit = self.settings.max_text_chars
        for item in items:
            if isinstance(item, Text) and len(item.text) > limit:
                where = ".".join(str(part) for part in item.loc[1:])
                raise too_large(f"{where}: text has {len(item.text)} characters, the limit is {limit}")
        return self.entry.artifact.decoder.decode(items, self.limits, self.entry.name)

    def shift(self, flagged: list[bool]) -> Shift:
        """The chunk's shift signals as the server reads a request's: its flags against the share the manifest
        expects. An offline run has no live traffic, so no live drift window."""
        return check_shift(flagged, expected_flag_rate(self.entry.artifact.manifest.ood.tpr), None)
