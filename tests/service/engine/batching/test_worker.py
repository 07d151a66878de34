"""The batch worker alone (``service.engine.batching.worker``), on a fake artifact: how requests are packed into
batches, what each request gets back, and how the worker refuses, fails and drains."""

from __future__ import annotations

import asyncio

import pytest
import torch

from service.engine.batching import BatchStats, Draining, QueueFull
from service.engine.batching.worker import OverBudget
from tests.service.conftest import until
from tests.service.engine.fakes import FakeModule, fake_artifact, first_probability, images, worker


def test_requests_queued_together_share_one_forward_and_get_their_own_rows_back() -> None:
    """Two requests of 2 rows each fill a budget of 4: one forward, packed in order; a third that would overflow it
    starts the next batch. Each request's summary is its own inputs'."""
    module = FakeModule()
    stats: list[BatchStats] = []

    async def main() -> list:
        batch_worker = worker(fake_artifact(module), max_batch_samples=4, on_batch=stats.append)
        batch_worker.start()
        futures = [batch_worker.enqueue(images(*values), 2, None) for values in ([0.1], [0.2], [0.3, 0.4])]
        results = await asyncio.wait_for(asyncio.gather(*futures), 10)
        await batch_worker.close(10)
        return results

    first, second, third = asyncio.run(main())
    assert module.forwards == [[0.1, 0.2], [0.3, 0.4]]
    assert [(s.requests, s.inputs, s.rows) for s in stats] == [(2, 2, 4), (1, 2, 4)]
    assert (first.batch_requests, first.batch_inputs, first.batch_rows) == (2, 2, 4)
    for result, values in ((first, [0.1]), (second, [0.2]), (third, [0.3, 0.4])):
        assert result.summary.probabilities[:, 0].tolist() == pytest.approx([first_probability(v) for v in values])
        assert result.input_scores is None  # the manifest reads no per-input score


def test_a_seeded_request_runs_alone() -> None:
    """A request with a seed never shares its forward (its answer must not depend on its neighbours): queued between
    two that would share one, it cuts them apart."""
    module = FakeModule()

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=8)
        batch_worker.start()
        futures = [batch_worker.enqueue(images(0.1), 2, None), batch_worker.enqueue(images(0.2), 2, 7),
                   batch_worker.enqueue(images(0.3), 2, None)]
        results = await asyncio.wait_for(asyncio.gather(*futures), 10)
        await batch_worker.close(10)
        assert [r.batch_requests for r in results] == [1, 1, 1]

    asyncio.run(main())
    assert module.forwards == [[0.1], [0.2], [0.3]]  # the seeded one cut the batch in three, in order


def test_a_failed_forward_fails_its_batch_and_the_worker_goes_on() -> None:
    module = FakeModule()
    module.fail = RuntimeError("the forward broke")

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=4)
        batch_worker.start()
        failed = [batch_worker.enqueue(images(0.1), 2, None), batch_worker.enqueue(images(0.2), 2, None)]
        outcomes = await asyncio.wait_for(asyncio.gather(*failed, return_exceptions=True), 10)
        assert [str(o) for o in outcomes] == ["the forward broke"] * 2
        module.fail = None
        result = await asyncio.wait_for(batch_worker.enqueue(images(0.3), 2, None), 10)
        assert result.summary.probabilities[0, 0].item() == pytest.approx(first_probability(0.3))
        assert batch_worker.idle and batch_worker.queued_units == 0
        await batch_worker.close(10)

    asyncio.run(main())


def test_a_full_queue_refuses_at_once_and_a_closed_worker_drains() -> None:
    """``max_queue`` requests waiting: the next is refused with ``QueueFull``. Closing with no grace fails what still
    waits with ``Draining`` and refuses anything new."""
    module = FakeModule()
    module.release.clear()

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=2, max_queue=2)
        batch_worker.start()
        running = batch_worker.enqueue(images(0.1), 2, None)
        await until(lambda: len(module.forwards) == 1, "the first forward")
        waiting = [batch_worker.enqueue(images(0.2), 2, None), batch_worker.enqueue(images(0.3), 2, None)]
        assert batch_worker.depth == 2 and batch_worker.reserve() is None
        with pytest.raises(QueueFull):
            batch_worker.enqueue(images(0.4), 2, None)
        try:
            await batch_worker.close(0)
        finally:
            module.release.set()
        for future in waiting:
            with pytest.raises(Draining):
                await future
        with pytest.raises(Draining):
            batch_worker.enqueue(images(0.5), 2, None)
        assert batch_worker.reserve() is None
        running.cancel()

    asyncio.run(main())


def test_a_closing_worker_finishes_what_is_queued_within_its_grace() -> None:
    module = FakeModule()
    module.release.clear()

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=2)
        batch_worker.start()
        futures = [batch_worker.enqueue(images(v), 2, None) for v in (0.1, 0.2)]
        await until(lambda: len(module.forwards) == 1, "the first forward")
        closing = asyncio.create_task(batch_worker.close(10))
        await until(lambda: batch_worker.closed, "the worker closing")
        with pytest.raises(Draining):
            batch_worker.enqueue(images(0.3), 2, None)
        module.release.set()
        await asyncio.wait_for(closing, 10)
        results = [future.result() for future in futures]
        assert [r.summary.probabilities[0, 0].item() for r in results] == pytest.approx(
            [first_probability(0.1), first_probability(0.2)])

    asyncio.run(main())
    assert module.forwards == [[0.1], [0.2]]


def test_work_that_would_outlast_the_timeout_is_refused_before_it_queues() -> None:
    """With the measured rate, the queued work and a new request's would take longer than ``ADMIT_FRACTION`` of the
    timeout: ``OverBudget`` (a 503 now, not a 504 later). A request alone is always admitted."""
    module = FakeModule()

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=4, request_timeout_s=1.0)
        batch_worker.start()
        await asyncio.wait_for(batch_worker.enqueue(images(0.1), 2, None), 10)
        assert batch_worker.seconds_per_unit is not None  # measured on that forward
        batch_worker.seconds_per_unit = 0.3  # as if each row took 0.3 s: 2 rows queued = 0.6 s of a 1 s timeout
        module.release.clear()
        try:
            held = batch_worker.enqueue(images(0.2), 2, None)  # alone in the queue: admitted whatever it costs
            await until(lambda: len(module.forwards) == 2, "the held forward")
            assert batch_worker.estimated_wait_s(2) == pytest.approx(1.2)
            with pytest.raises(OverBudget):
                batch_worker.enqueue(images(0.3), 2, None)  # 1.2 s > 0.8 x 1 s
            assert batch_worker.depth == 0 and batch_worker.queued_units == 2  # the refused one took nothing
        finally:
            module.release.set()
        await asyncio.wait_for(held, 10)
        assert batch_worker.queued_units == 0
        await batch_worker.close(10)

    asyncio.run(main())


def test_when_the_rate_slows_after_admission_the_newest_request_is_refused_not_every_one_late() -> None:
    """Two requests admitted at a fast rate; the rate then slows (as when requests still arriving are being decoded)
    so that with the newer one the older would end past its deadline, and without it would not: before the next batch
    the newer is refused (``OverBudget``, a 503 saying the timeout does not allow it) and the older runs and is
    answered. After the held forward the rate is 0.7 x 1.0 s plus 0.3 x that forward's (under 1 s a unit here): the
    older alone is at most 2 s of work, both at least 2.8 s, against a 2.6 s timeout."""
    module = FakeModule()

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=2, request_timeout_s=2.6)
        batch_worker.start()
        await asyncio.wait_for(batch_worker.enqueue(images(0.1), 2, None), 10)
        batch_worker.seconds_per_unit = 0.01  # fast: everything below is admitted
        module.release.clear()
        running = batch_worker.enqueue(images(0.2), 2, None)
        await until(lambda: len(module.forwards) == 2, "the held forward")
        older, newer = batch_worker.enqueue(images(0.3), 2, None), batch_worker.enqueue(images(0.4), 2, None)
        batch_worker.seconds_per_unit = 1.0  # slow now
        module.release.set()
        await asyncio.wait_for(running, 10)
        assert (await asyncio.wait_for(older, 10)) is not None
        with pytest.raises(OverBudget, match="request timeout allows"):
            await asyncio.wait_for(newer, 10)
        await until(lambda: batch_worker.queued_units == 0, "the refused request's work off the queue's account")
        assert len(module.forwards) == 3  # the refused request never reached a forward
        await batch_worker.close(10)

    asyncio.run(main())


def test_per_input_scores_are_named_once_per_batch_and_split_per_request() -> None:
    """The worker names the batch's per-input scores once; the temperature read them (per input) and each request
    gets its own share by name."""
    module = FakeModule()
    artifact = fake_artifact(module, ood_score="kernel_error", input_scores=["kernel_error", "mds"],
                             temperature_by="mds")

    async def main() -> list:
        batch_worker = worker(artifact, max_batch_samples=6)
        batch_worker.start()
        futures = [batch_worker.enqueue(images(*values), 2, None) for values in ([0.1], [0.2, 0.3])]
        results = await asyncio.wait_for(asyncio.gather(*futures), 10)
        await batch_worker.close(10)
        return results

    first, second = asyncio.run(main())
    assert module.forwards == [[0.1, 0.2, 0.3]] and artifact.named_calls == 1
    assert first.input_scores is not None and second.input_scores is not None
    assert first.input_scores["kernel_error"].tolist() == pytest.approx([0.1])
    assert second.input_scores["mds"].tolist() == pytest.approx([0.4, 0.6])
    temperatures = torch.exp(torch.tensor([0.2, 0.4, 0.6]))  # exp(max(0, mds))
    served = torch.cat([first.summary.probabilities[:, 0], second.summary.probabilities[:, 0]])
    assert served.tolist() == pytest.approx([first_probability(v, float(t)) for v, t in
                                             zip((0.1, 0.2, 0.3), temperatures, strict=True)])


def test_a_request_late_even_alone_does_not_make_the_worker_refuse_newer_small_ones() -> None:
    """The oldest request's own work already ends past its deadline: refusing newer requests would not save it, and a
    small request interleaved between its parts ends long before it, so nothing is refused."""
    module = FakeModule()

    async def main() -> None:
        batch_worker = worker(fake_artifact(module), max_batch_samples=2, request_timeout_s=1.0)
        batch_worker.start()
        await asyncio.wait_for(batch_worker.enqueue(images(0.1), 2, None), 10)
        batch_worker.seconds_per_unit = 0.01
        module.release.clear()
        running = batch_worker.enqueue(images(0.2), 2, None)
        await until(lambda: len(module.forwards) == 2, "the held forward")
        costly = batch_worker.enqueue(images(*[0.3] * 8), 2, None)  # 16 units in parts of one input
        small = batch_worker.enqueue(images(0.4), 2, None)
        batch_worker.seconds_per_unit = 1.0  # the costly request alone is 16 s of a 1 s timeout
        module.release.set()
        await asyncio.wait_for(running, 10)
        assert (await asyncio.wait_for(small, 10)) is not None
        assert (await asyncio.wait_for(costly, 10)) is not None
        await batch_worker.close(10)

    asyncio.run(main())
