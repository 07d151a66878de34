"""Queue slots (``service.engine.batching.slots``): what admission reserves before a request's body is read, and how
a reserved slot turns into the queued request or comes back."""

from __future__ import annotations

import pytest

from service.engine.batching import QueueFull, Slots


def test_reservations_and_waiting_requests_share_the_capacity() -> None:
    slots = Slots(capacity=3, reservation_timeout_s=30)
    first, second = slots.reserve(waiting=0), slots.reserve(waiting=0)
    assert first is not None and second is not None and slots.reserved == 2
    assert slots.pending(waiting=1) == 3
    assert slots.reserve(waiting=1) is None  # two reserved and one waiting: full
    first.release()
    first.release()  # idempotent: gives the slot back once
    assert slots.reserved == 1 and not first.live and second.live
    assert slots.reserve(waiting=1) is not None


def test_taking_its_own_ticket_queues_the_request_on_the_reserved_slot() -> None:
    slots = Slots(capacity=1, reservation_timeout_s=30)
    ticket = slots.reserve(waiting=0)
    assert ticket is not None
    slots.take(ticket, waiting=0)  # the full queue still takes it: the slot was its own
    assert not ticket.live and slots.reserved == 0
    with pytest.raises(QueueFull):
        slots.take(None, waiting=1)  # a request without a ticket needs a free slot


def test_a_ticket_of_other_slots_is_given_back_and_a_free_slot_taken() -> None:
    """A request that named another model (or a version swapped meanwhile) releases that model's reservation."""
    mine, other = Slots(capacity=1, reservation_timeout_s=30), Slots(capacity=1, reservation_timeout_s=30)
    foreign = other.reserve(waiting=0)
    assert foreign is not None
    mine.take(foreign, waiting=0)
    assert not foreign.live and other.reserved == 0
    with pytest.raises(QueueFull):
        mine.take(other.reserve(waiting=0), waiting=1)
    assert other.reserved == 0  # released even though the request was refused


def test_a_reservation_lapses_so_an_unsent_body_cannot_hold_a_slot() -> None:
    slots = Slots(capacity=1, reservation_timeout_s=0)  # every ticket has expired by the next count
    lapsed = slots.reserve(waiting=0)
    assert lapsed is not None
    assert slots.pending(waiting=0) == 0 and not lapsed.live and slots.reserved == 0
    with pytest.raises(QueueFull):  # its request, arriving after all, needs a free slot like any other
        slots.take(lapsed, waiting=1)
    slots.take(lapsed, waiting=0)  # and takes one when there is
