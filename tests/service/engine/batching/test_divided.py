"""Requests over one batch, run in parts (``service.engine.batching.divided``): how they are cut, that their answer
is the parts joined in order, and that requests queued meanwhile run between the parts."""

from __future__ import annotations

import asyncio

import pytest
import torch

from models.uncertainty import UncertaintySummary
from service.engine.batch_cost import BatchCost
from service.engine.batching import BatchResult, BatchStats
from service.engine.batching.divided import Divided, inputs_per_part, joined
from service.engine.batching.items import WorkItem
from service.engine.modalities.image import ImageRunner
from tests.service.conftest import until
from tests.service.engine.fakes import SHAPE, FakeModule, fake_artifact, first_probability, images, worker


def test_a_part_holds_the_inputs_whose_rows_fit_one_batch() -> None:
    rows = BatchCost(8, "max_batch_samples", "rows")
    assert inputs_per_part(rows, n_samples=2, longest=0) == 4
    assert inputs_per_part(rows, n_samples=16, longest=0) == 1  # one input over the budget is still a part
    tokens = BatchCost(256, "max_batch_tokens", "tokens", width=lambda longest: max(8, longest))
    assert inputs_per_part(tokens, n_samples=2, longest=32) == 4  # 4 x 2 samples x 32 tokens = 256


def test_parts_follow_each_other_in_order_with_the_request_s_queue_time() -> None:
    async def main() -> None:
        future: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        item = WorkItem(images(0.1, 0.2, 0.3, 0.4, 0.5), 2, None, future, enqueued=5.0)
        divided = Divided(item, queued_at=item.enqueued)
        runner, cost = ImageRunner(SHAPE), BatchCost(4, "max_batch_samples", "rows")
        seen = []
        while True:
            part = divided.next_part(runner, cost)
            assert part.future is not future and part.n_samples == 2
            seen.append([round(v, 6) for v in part.inputs.pixels[:, 0, 0, 0].tolist()])
            part.future.set_result(result(part.size, part.size * 2))
            if divided.add(part):
                break
        assert seen == [[0.1, 0.2], [0.3, 0.4], [0.5]] and divided.done == 5

    asyncio.run(main())


def result(inputs: int, rows: int, scores: dict[str, torch.Tensor] | None = None, first: float = 0.0
           ) -> BatchResult:
    """A part's result whose per-input fields count up from ``first``."""
    values = torch.arange(inputs, dtype=torch.float32) + first  # [n]
    summary = UncertaintySummary(**{name: values for name in UncertaintySummary.__dataclass_fields__})
    return BatchResult(summary, scores, queue_s=0.5 + first, inference_s=1.0, batch_requests=2, batch_inputs=inputs,
                       batch_rows=rows)


def test_a_divided_answer_is_its_parts_joined_in_order() -> None:
    parts = [result(2, 4, {"kernel_error": torch.tensor([1.0, 2.0]), "mds": torch.tensor([3.0, 4.0])}),
             result(1, 2, {"kernel_error": torch.tensor([5.0]), "mds": torch.tensor([6.0])}, first=2.0)]
    whole = joined(parts)
    assert whole.summary.confidence.tolist() == [0.0, 1.0, 2.0]
    assert whole.input_scores is not None
    assert {name: s.tolist() for name, s in whole.input_scores.items()} == {"kernel_error": [1.0, 2.0, 5.0],
                                                                           "mds": [3.0, 4.0, 6.0]}
    assert (whole.queue_s, whole.inference_s, whole.batch_inputs, whole.batch_rows) == (0.5, 2.0, 2, 4)
    assert joined([result(1, 2), result(1, 2)]).input_scores is None


def test_requests_queued_during_a_part_run_before_the_next_part() -> None:
    """A request of 5 inputs x 2 samples against a budget of 4 rows runs as parts of 2, 2 and 1 inputs; a small
    request queued while the first part runs is answered before the second part, and the large one's answer is the
    same as its inputs one by one."""
    module = FakeModule()
    module.release.clear()
    stats: list[BatchStats] = []

    async def main() -> tuple[BatchResult, BatchResult]:
        batch_worker = worker(fake_artifact(module), max_batch_samples=4, on_batch=stats.append)
        batch_worker.start()
        try:
            large = batch_worker.enqueue(images(0.1, 0.2, 0.3, 0.4, 0.5), 2, None)
            await until(lambda: len(module.forwards) == 1, "the first part's forward")
            small = batch_worker.enqueue(images(0.9), 2, None)
            assert batch_worker.depth == 2  # the divided request counts until its last part has run
        finally:
            module.release.set()
        answers = await asyncio.wait_for(asyncio.gather(large, small), 10)
        assert batch_worker.idle and batch_worker.queued_units == 0
        await batch_worker.close(10)
        return answers

    large, small = asyncio.run(main())
    assert module.forwards == [[0.1, 0.2], [0.9], [0.3, 0.4], [0.5]]
    assert [s.inputs for s in stats] == [2, 1, 2, 1]
    assert large.summary.probabilities[:, 0].tolist() == pytest.approx(
        [first_probability(v) for v in (0.1, 0.2, 0.3, 0.4, 0.5)])
    assert small.summary.probabilities[0, 0].item() == pytest.approx(first_probability(0.9))


def test_a_seeded_request_over_one_batch_is_not_divided() -> None:
    """Its answer must not depend on how the budget cuts it: it runs whole, alone, the runner cutting its forwards."""
    module = FakeModule()

    async def main() -> BatchResult:
        batch_worker = worker(fake_artifact(module), max_batch_samples=4)
        batch_worker.start()
        answer = await asyncio.wait_for(batch_worker.enqueue(images(0.1, 0.2, 0.3), 2, 11), 10)
        await batch_worker.close(10)
        return answer

    answer = asyncio.run(main())
    assert module.forwards == [[0.1, 0.2], [0.3]]  # two forwards of one batch
    assert (answer.batch_requests, answer.batch_inputs, answer.batch_rows) == (1, 3, 6)
