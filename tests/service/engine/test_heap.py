"""The garbage collector kept off the request path (``service.engine.heap``): what is alive at a model load is frozen
out of later collections, cyclic garbage that ended up frozen is collected at the next freeze, and ``thaw`` hands
everything back."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.engine.heap import collect_retired, freeze_long_lived, thaw


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen (the rest of the test run must not inherit a frozen heap)."""
    thaw()
    yield
    thaw()


def test_a_freeze_exempts_what_is_alive_until_the_next_freeze_or_thaw() -> None:
    """Two freezes (each a full collection, the slow part) cover the three calls."""
    node = Node()
    frozen = weakref.ref(node)
    freeze_long_lived()  # alive at the freeze: frozen
    assert gc.get_freeze_count() > 0
    del node
    collect_retired()
    assert frozen() is not None  # garbage now, but a collection skips the frozen
    retired = Node()  # made after the freeze, as a version's per-request objects are
    collectable = weakref.ref(retired)
    del retired
    collect_retired()
    assert collectable() is None
    freeze_long_lived()  # thaws first: the frozen garbage goes
    assert frozen() is None
    thaw()
    assert gc.get_freeze_count() == 0
