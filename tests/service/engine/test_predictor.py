"""The prediction use-case alone (``service.engine.predictor.Predictor``): a fake artifact behind a real batch worker
and decode pool, no server. What it refuses and with which status, and that a batch's per-input scores are named once
for both the temperature and the OOD rule."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from service.config import Settings
from service.engine.artifact import ood_rule
from service.engine.decoding import DecodePool
from service.engine.device import Device
from service.engine.modalities.base import PixelValues, RawInput, Text
from service.engine.model_settings import ServingSettings
from service.engine.predictor import Outcome, Predictor
from service.engine.repository import ModelRepository, ModelVersion, ReadyVersion, VersionState
from service.errors import ApiError
from service.observability.metrics import Metrics
from service.observability.statistics import Statistics
from tests.service.conftest import metric_value, until
from tests.service.engine.fakes import (
    LABELS,
    CountingArtifact,
    FakeModule,
    fake_artifact,
    first_probability,
    images,
    pixels,
    worker,
)


class LoggedPredictions:
    """Stands in for the feedback store: keeps what the predictor logs."""

    def __init__(self) -> None:
        self.logged: list[tuple[Any, ...]] = []

    def log(self, *args: Any, **kwargs: Any) -> None:
        self.logged.append(args)


def serving(max_queue: int = 8, request_timeout_s: float = 10.0) -> ServingSettings:
    return ServingSettings(max_batch_samples=4, max_batch_tokens=2048, max_batch_delay_ms=0.0, max_queue=max_queue,
                           request_timeout_s=request_timeout_s, instances=1, default_samples=None, max_samples=None,
                           version_policy={})


def predictor(*versions: ModelVersion, **settings: Any) -> Predictor:
    """A predictor over a repository holding ``versions`` (never scanned), added in order as a scan would add them,
    each change recording the model's default; with a one-thread decode pool."""
    repository = ModelRepository(Path("."), Device(torch.device("cpu")), lambda *_: None,  # type: ignore[arg-type]
                                 lambda _: serving(), drain_timeout_s=1.0)
    for version in versions:
        repository.models.setdefault(version.name, {})[version.version] = version
        repository.default_version(version.name)
    settings = {"default_model": "fake", "decode_threads": 1, **settings}
    return Predictor(Settings(**settings), repository, DecodePool(1), Metrics(), Statistics(),
                     LoggedPredictions())  # type: ignore[arg-type]


def ready(artifact: CountingArtifact, version: str = "1", max_queue: int = 8, request_timeout_s: float = 10.0,
          max_batch_samples: int = 4) -> ModelVersion:
    """A ready version of ``fake`` whose worker is not started yet (``started`` starts it on the running loop)."""
    settings = serving(max_queue, request_timeout_s)
    return ModelVersion("fake", version, Path("."), (), VersionState.READY, artifact=artifact, serving=settings,
                        worker=worker(artifact, max_batch_samples=max_batch_samples, max_queue=max_queue))


@contextmanager
def started(version: ModelVersion) -> Iterator[ReadyVersion]:
    entry = version.ready()
    assert entry is not None
    entry.worker.start()
    yield entry


def test_a_batch_s_scores_are_named_once_for_the_temperature_and_the_ood_rule() -> None:
    """Two requests decoded and batched together: one forward, one naming of its per-input scores; the temperature
    follows ``mds`` (2v) and the OOD rule reads ``kernel_error`` (v), each request its own inputs'."""
    module = FakeModule()
    artifact = fake_artifact(module, ood_score="kernel_error", input_scores=["kernel_error", "mds"],
                             temperature_by="mds")
    version = ready(artifact)
    serve = predictor(version)

    async def main() -> list[Outcome]:
        with started(version) as entry:
            module.release.clear()
            try:  # a first request holds the worker, so the two next are queued side by side
                blocker = entry.worker.enqueue(images(0.0), 2, None)
                await until(lambda: len(module.forwards) == 1, "the first forward")
                asked = [asyncio.ensure_future(serve.predict(entry, [PixelValues(pixels(v), ["body", "inputs", 0])],
                                                             2, None)) for v in (0.3, 0.7)]
                await until(lambda: entry.worker.depth == 2, "both requests queued")
            finally:
                module.release.set()
            outcomes = await asyncio.wait_for(asyncio.gather(*asked), 10)
            await blocker
            await entry.worker.close(10)
            return outcomes

    low, high = asyncio.run(main())
    serve.decoder.close()
    assert module.forwards == [[0.0], [0.3, 0.7]]
    assert artifact.named_calls == 2  # one per batch (the blocker's and the pair's), not one more per request
    assert (low.ood, low.is_ood, high.ood, high.is_ood) == (pytest.approx([0.3]), [False], pytest.approx([0.7]), [True])
    for outcome, value in ((low, 0.3), (high, 0.7)):
        temperature = float(torch.exp(torch.tensor(2 * value)))
        assert outcome.summary.probabilities[0, 0].item() == pytest.approx(first_probability(value, temperature))
        assert outcome.batch.batch_requests == 2 and outcome.rule.score == "kernel_error"
    logged = serve.feedback.logged  # type: ignore[attr-defined]
    assert [(row[0], row[1], row[3], row[4][0][:2]) for row in logged] == [
        (low.id, "fake", 2, (0, LABELS[0])), (high.id, "fake", 2, (0, LABELS[0]))]


def test_resolve_names_why_a_model_cannot_serve() -> None:
    artifact = fake_artifact()
    serving_one, loading = ready(artifact, "1"), ModelVersion("fake", "2", Path("."), ())
    broken = ModelVersion("other", "1", Path("."), (), VersionState.UNAVAILABLE, reason="sha256 mismatch")
    serve = predictor(serving_one, loading, broken)
    assert serve.resolve(None, None).version == "1"  # serving before 2 began to load: it goes on serving
    assert serve.resolve("fake", "1").artifact is artifact
    newest_first = predictor(ModelVersion("fake", "2", Path("."), ()), ready(artifact, "1"))
    with pytest.raises(ApiError) as waiting:  # 1 became ready while 2 loads: never the default meanwhile
        newest_first.resolve(None, None)
    assert waiting.value.status == 503 and "version 2 is still loading" in waiting.value.message
    assert waiting.value.headers == {"Retry-After": "5"}
    newest_first.decoder.close()
    for model, version, status, words in [("nope", None, 404, "known: fake, other"),
                                          ("fake", "9", 404, "known: 1, 2"), ("fake", "2", 503, "still loading"),
                                          ("other", None, 503, "sha256 mismatch")]:
        with pytest.raises(ApiError) as refused:
            serve.resolve(model, version)
        assert refused.value.status == status and words in refused.value.message, (model, version)
    serve.decoder.close()


def test_sample_counts_within_what_the_version_takes() -> None:
    version = ready(fake_artifact())
    serve = predictor(version)
    entry = version.ready()
    assert entry is not None
    assert serve.samples(entry, None) == 2 and serve.samples(entry, 8) == 8
    for count in (0, 9):
        with pytest.raises(ApiError) as refused:
            serve.samples(entry, count)
        assert refused.value.status == 422 and "between 1 and 8" in refused.value.message
    serve.decoder.close()


def test_inputs_over_the_server_s_limits_are_413_and_of_another_modality_422() -> None:
    version = ready(fake_artifact())
    serve = predictor(version, max_inputs_per_request=2, max_text_chars=5)
    entry = version.ready()
    assert entry is not None
    too_many: list[RawInput] = [PixelValues(pixels(0.1), ["body", "inputs", i]) for i in range(3)]
    for inputs, status, words in [(too_many, 413, "3 inputs in one request, the limit is 2"),
                                  ([Text("too long", ["body", "inputs", 0, "text"])], 413, "8 characters"),
                                  ([Text("text", ["body", "inputs", 0, "text"])], 422, "takes images")]:
        with pytest.raises(ApiError) as refused:
            serve.decode(entry, inputs)
        assert refused.value.status == status and words in refused.value.message
    assert serve.decode(entry, too_many[:2]).size == 2
    serve.decoder.close()


def test_a_request_over_its_share_of_batches_is_413_before_it_is_queued() -> None:
    module = FakeModule()
    version = ready(fake_artifact(module))
    serve = predictor(version, max_request_batches=1)

    async def main() -> None:
        with started(version) as entry:
            rule = ood_rule(entry.artifact.manifest.ood, 2)
            with pytest.raises(ApiError) as refused:
                await serve.run(entry, images(0.1, 0.2, 0.3), 2, None, rule)  # 6 rows, one batch of 4 allowed
            assert refused.value.status == 413 and "6 sampled rows" in refused.value.message
            assert entry.worker.depth == 0
            await entry.worker.close(10)

    asyncio.run(main())
    serve.decoder.close()
    assert module.forwards == []


def test_a_full_queue_is_503_before_anything_is_decoded() -> None:
    module = FakeModule()
    version = ready(fake_artifact(module), max_queue=1)
    serve = predictor(version)
    decoded: list[int] = []

    def inputs() -> list[RawInput]:  # what a protocol would parse in the decode pool
        decoded.append(1)
        return [PixelValues(pixels(0.5), ["body", "inputs", 0])]

    async def main() -> None:
        with started(version) as entry:
            module.release.clear()
            try:
                running = entry.worker.enqueue(images(0.1), 2, None)
                await until(lambda: len(module.forwards) == 1, "the first forward")
                waiting = entry.worker.enqueue(images(0.2), 2, None)  # the one slot
                with pytest.raises(ApiError) as refused:
                    await serve.predict(entry, inputs, 2, None)
                assert refused.value.status == 503 and "queue full" in refused.value.message
            finally:
                module.release.set()
            await asyncio.wait_for(asyncio.gather(running, waiting), 10)
            await entry.worker.close(10)

    asyncio.run(main())
    serve.decoder.close()
    assert decoded == []
    assert metric_value(serve.metrics.expose().decode(), "director_rejected_requests_total", model="fake",
                        version="1", reason="queue_full") == 1.0


def test_a_request_that_outlives_its_timeout_is_504_and_counted_as_failed() -> None:
    module = FakeModule()
    version = ready(fake_artifact(module), request_timeout_s=0.05)
    serve = predictor(version)

    async def main() -> None:
        with started(version) as entry:
            module.release.clear()
            try:
                with pytest.raises(ApiError) as refused:
                    await serve.run(entry, images(0.1), 2, None, ood_rule(entry.artifact.manifest.ood, 2))
                assert refused.value.status == 504 and "no result within 0.05s" in refused.value.message
            finally:
                module.release.set()
            await until(lambda: entry.worker.idle, "the held forward to end")
            await entry.worker.close(10)

    asyncio.run(main())
    serve.decoder.close()
    counted = serve.statistics.of("fake", "1")
    assert (counted.fail.count, counted.success.count) == (1, 0)
    assert metric_value(serve.metrics.expose().decode(), "director_rejected_requests_total", model="fake",
                        version="1", reason="timeout") == 1.0
