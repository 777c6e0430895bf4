"""memory.heap_frozen leaves the heap held before an export out of its garbage collections (gc.freeze), and never
hands back to the collector objects it did not freeze: a host process's own frozen heap (a pre-fork server's
gc.freeze) stays frozen through an export, and an export inside another one leaves the outer one's freeze alone."""

from __future__ import annotations

import gc
import weakref

import pytest

from vitdeploy.base import memory


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def unfrozen():
    """Every test starts and ends with nothing frozen (what the test suite's process holds)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_block_freezes_what_was_held_and_unfreezes_it_after(unfrozen):
    before = _Node()
    with memory.heap_frozen():
        assert gc.get_freeze_count() > 0
        watched = weakref.ref(before)
        del before
        gc.collect()
        assert watched() is not None  # held before the block: out of its collections
        made = _Node()
        made_ref = weakref.ref(made)
        del made
        memory.give_back()
        assert made_ref() is None  # what the block creates is collected as before
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert watched() is None  # back with the collector once the block ends


def test_a_hosts_frozen_heap_stays_frozen_through_the_block_and_its_refreeze(unfrozen):
    host = _Node()
    host_ref = weakref.ref(host)
    gc.freeze()  # the host's own (a pre-fork server)
    del host
    # frozen = in the permanent generation, which gc.get_objects() does not list (the count may drop meanwhile:
    # a frozen object that dies by its reference count leaves it, so the host's object itself is watched)
    assert not _collector_sees(host_ref())
    with memory.heap_frozen():
        made = _Node()
        made_ref = weakref.ref(made)
        del made
        memory.refreeze()
        assert made_ref() is None  # collected, not frozen: the block froze nothing
        assert not _collector_sees(host_ref())
    assert not _collector_sees(host_ref())  # not unfrozen: it was not the block's
    gc.collect()
    assert host_ref() is not None


def _collector_sees(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_a_block_inside_a_block_leaves_the_outer_freeze_alone(unfrozen):
    with memory.heap_frozen():
        with memory.heap_frozen():
            memory.refreeze()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_refreeze_outside_a_block_only_collects(unfrozen):
    memory.refreeze()
    assert gc.get_freeze_count() == 0
