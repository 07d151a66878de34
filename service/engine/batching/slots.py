"""Queue slots of one model version, reserved before a request's body is read (``reserve`` -> ``Ticket``, see
``service.api.admission``): queued + held + reserved never exceeds the capacity (``max_queue``), so an
admitted request is never refused later and an overloaded model refuses before it spends anything on a request."""

from __future__ import annotations

import time
from collections import deque


class QueueFull(Exception):
    """The model's queue is at ``max_queue``."""


class Ticket:
    """One queue slot reserved for a request whose body is still being read; queuing the request consumes it, and
    ``release`` (idempotent) gives it back if the request ends before it is queued. It lapses at ``expires``
    (monotonic), so a client that announces a body and never sends it cannot hold a slot for ever."""

    __slots__ = ("slots", "expires", "_live")

    def __init__(self, slots: Slots, expires: float) -> None:
        self.slots = slots
        self.expires = expires
        self._live = True

    @property
    def live(self) -> bool:
        return self._live

    def release(self) -> None:
        if self._live:
            self._live = False
            self.slots.reserved -= 1


class Slots:
    """``capacity`` slots shared by the requests waiting for a batch (``waiting``, counted by the caller) and the
    live tickets."""

    def __init__(self, capacity: int, reservation_timeout_s: float) -> None:
        self.capacity = capacity
        self.reservation_timeout_s = reservation_timeout_s
        self.reserved = 0  # live tickets
        self._tickets: deque[Ticket] = deque()  # in reservation order, so in expiry order

    def pending(self, waiting: int) -> int:
        """Requests holding a slot: the ``waiting`` ones, and those admitted and still being received (tickets past
        their expiry are released first)."""
        now = time.monotonic()
        tickets = self._tickets
        while tickets and (not tickets[0].live or tickets[0].expires <= now):
            tickets.popleft().release()
        return waiting + self.reserved

    def reserve(self, waiting: int) -> Ticket | None:
        """A slot for a request not yet read, or None when every slot is taken."""
        if self.pending(waiting) >= self.capacity:
            return None
        self.reserved += 1
        ticket = Ticket(self, time.monotonic() + self.reservation_timeout_s)
        self._tickets.append(ticket)
        return ticket

    def take(self, ticket: Ticket | None, waiting: int) -> None:
        """The slot of a request about to be queued: its own live ticket's, else a free one (``QueueFull`` when none
        is). A ticket of other slots (the request named another model, or the version was swapped) is released."""
        if ticket is not None and ticket.slots is self and ticket.live:
            ticket.release()  # the slot passes to the request queued next, with no await in between
            return
        if ticket is not None:
            ticket.release()
        if self.pending(waiting) >= self.capacity:
            raise QueueFull(f"queue full ({self.capacity} requests queued or being received)")
