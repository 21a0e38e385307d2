"""The frozen start-up heap (hybrid/heap.py): kept frozen through a library's teardown."""

from __future__ import annotations

import gc
import weakref

import pytest

from hybrid.heap import freeze_heap, heap_kept_frozen

pytestmark = pytest.mark.unit


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_a_teardown_s_unfreeze_keeps_the_heap_frozen_and_collects_what_came_after() -> None:
    freeze_heap()
    frozen = gc.get_freeze_count()
    unfreeze = gc.unfreeze
    with heap_kept_frozen():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made after the freeze: the teardown's garbage
        gone = weakref.ref(a)
        del a, b
        gc.unfreeze()  # what vLLM's engine shutdown calls before its full collections
        # Still frozen (a real unfreeze leaves 0); a few frozen objects may have died since.
        assert gc.get_freeze_count() > frozen // 2 > 0
        gc.collect()
        assert gone() is None
    assert gc.unfreeze is unfreeze


def test_unfreeze_comes_back_after_an_error() -> None:
    unfreeze = gc.unfreeze
    with pytest.raises(RuntimeError), heap_kept_frozen():
        raise RuntimeError("teardown failed")
    assert gc.unfreeze is unfreeze
