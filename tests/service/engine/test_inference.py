"""How a batch's forwards take the device and how its per-input scores go back to requests
(``service.engine.inference``)."""

from __future__ import annotations

import threading

import torch

from service.engine.device import Device, ForwardGate
from service.engine.inference import seeded_or_shared, split_scores


def exclusive_free(gate: ForwardGate) -> bool:
    """Whether another thread could take the gate exclusively right now."""
    answer: list[bool] = []

    def probe() -> None:
        got = gate.acquire(blocking=False)
        if got:
            gate.release()
        answer.append(got)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(10)
    return answer[0]


def test_a_seeded_batch_holds_the_gate_alone_for_all_its_forwards_under_its_seed() -> None:
    device = Device(torch.device("cpu"))
    torch.manual_seed(3)
    expected = torch.rand(4)
    with seeded_or_shared(device, 3) as turn:
        assert device.lock.locked()
        drawn = []
        for _ in range(2):  # between its forwards too: no other draw can come in between
            with turn():
                drawn.append(torch.rand(2))
            assert not exclusive_free(device.lock)
    assert torch.equal(torch.cat(drawn), expected)
    assert not device.lock.locked() and exclusive_free(device.lock)


def test_an_unseeded_batch_takes_a_shared_turn_per_forward() -> None:
    device = Device(torch.device("cpu"))
    with seeded_or_shared(device, None) as turn:
        assert not device.lock.locked()
        with turn():
            assert not exclusive_free(device.lock)  # a seeded batch waits for this forward
        assert exclusive_free(device.lock)  # and may run between two of its forwards


def test_named_scores_go_back_per_request_by_name() -> None:
    scores = {"kernel_error": torch.tensor([1.0, 2.0, 3.0]), "mds": torch.tensor([4.0, 5.0, 6.0])}
    first, second = split_scores(scores, [1, 2])
    assert first is not None and second is not None
    assert {name: s.tolist() for name, s in first.items()} == {"kernel_error": [1.0], "mds": [4.0]}
    assert {name: s.tolist() for name, s in second.items()} == {"kernel_error": [2.0, 3.0], "mds": [5.0, 6.0]}
    assert split_scores(None, [1, 2]) == [None, None]
