"""common.heap: start-up objects frozen, start-up garbage collected first."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from common import heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_live_objects_are_frozen_and_garbage_is_collected_first() -> None:
    alive = Node()
    garbage, partner = Node(), Node()
    garbage.other, partner.other = partner, garbage  # a cycle only the collector frees
    gone = weakref.ref(garbage)
    del garbage, partner
    heap.freeze_start_up()
    assert gone() is None
    assert gc.get_freeze_count() > 0
    assert not any(o is alive for o in gc.get_objects())  # frozen: no longer among what collections walk
