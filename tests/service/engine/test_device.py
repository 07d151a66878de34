"""The forward gate (``service.engine.device.ForwardGate``) beyond the ordering test in tests/service/test_device.py:
its bounds and what an exclusive holder and a shared turn keep out of each other."""

from __future__ import annotations

import threading

import pytest

from service.engine.device import ForwardGate
from tests.service.engine.fakes import WAIT_S


def test_a_gate_has_at_least_one_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        ForwardGate(slots=0)


def test_a_shared_turn_keeps_an_exclusive_holder_out_until_it_ends() -> None:
    gate = ForwardGate(slots=2)
    with gate.shared():
        assert not gate.acquire(blocking=False)
        assert not gate.acquire(timeout=0.01)  # a bounded wait gives up and stops counting as waiting
        assert gate.exclusive_waiting == 0 and not gate.locked()
    assert gate.acquire(blocking=False) and gate.locked()
    gate.release()


def test_an_exclusive_holder_keeps_shared_turns_out_until_it_releases() -> None:
    gate = ForwardGate(slots=2)
    trying, entered, released = threading.Event(), threading.Event(), threading.Event()

    def shared_turn() -> None:
        trying.set()
        with gate.shared():
            if released.is_set():  # otherwise it ran beside the exclusive holder: ``entered`` stays unset
                entered.set()

    with gate:
        thread = threading.Thread(target=shared_turn)
        thread.start()
        assert trying.wait(WAIT_S)
        released.set()  # the last thing done while the gate is held
    assert entered.wait(WAIT_S), "a shared turn ran beside the exclusive holder"
    thread.join(WAIT_S)
    assert not gate.locked()
