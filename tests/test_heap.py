"""The controller's garbage-collector policy (`controller.heap`): no automatic full collections, the live heap
frozen after each event, and frozen cyclic garbage still reclaimed, so memory stays bounded."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from controller.heap import NO_AUTOMATIC_FULL, Heap


@pytest.fixture
def heap() -> Iterator[Heap]:
    before = gc.get_threshold()
    policy = Heap(grow_factor=1.5, floor_objects=1_000, min_interval_s=0.0, young_objects=20_000)
    policy.install()
    try:
        yield policy
    finally:
        policy.uninstall()
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector can free it


def test_install_turns_off_automatic_full_collections(heap: Heap) -> None:
    assert gc.get_threshold()[2] == NO_AUTOMATIC_FULL
    assert gc.get_freeze_count() > 0  # the heap at install is frozen


def test_hurried_collects_the_youngest_generation_less_often_and_still_reclaims_cycles(heap: Heap) -> None:
    """Inside `hurried` the youngest generation is collected every `young_objects` allocations (then as
    before);
    cyclic garbage made inside is still found by the automatic young collections, not left to the full
    ones."""
    before = gc.get_threshold()
    collected = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collected.append(info["collected"])

    gc.callbacks.append(seen)
    try:
        with heap.hurried():
            assert gc.get_threshold() == (20_000, before[1], before[2])
            for _ in range(60_000):
                _Node()
    finally:
        gc.callbacks.remove(seen)
    assert gc.get_threshold() == before
    assert 2 <= len(collected) <= 4 and sum(collected) >= 20_000


def test_young_objects_must_be_positive() -> None:
    assert Heap().young_objects == 200_000
    with pytest.raises(ValueError, match="young_objects"):
        Heap(young_objects=0)


def test_settled_freezes_what_is_alive(heap: Heap) -> None:
    kept = [_Node() for _ in range(5_000)]
    heap.settled()
    # every one is in the permanent generation now (counting the frozen heap before and after is not
    # enough: frozen objects that die meanwhile, on any thread of the process, shrink it)
    ids = {id(node) for node in kept}
    assert all(gc.is_tracked(node) for node in kept)
    assert not any(id(o) in ids for g in range(3) for o in gc.get_objects(g))
    assert gc.get_freeze_count() >= len(kept)
    assert all(len(gc.get_objects(g)) < 1_000 for g in range(3))  # nothing left for young collections
    assert heap.stats.settles == 1


def test_frozen_cycles_are_reclaimed_and_the_heap_stays_bounded(heap: Heap) -> None:
    """Cycles alive when frozen and dropped later would leak under a plain freeze; the policy collects in
    full once the frozen heap has grown by its factor, so it never grows past about that."""
    start = gc.get_freeze_count()
    chunk = max(20_000, start // 4)
    peak = 0
    for _ in range(30):
        nodes = [_Node() for _ in range(chunk)]
        heap.settled()  # frozen while alive
        del nodes  # now garbage that refcounting cannot free
        peak = max(peak, gc.get_freeze_count())
    assert heap.stats.full_collections >= 1
    assert heap.stats.collected >= chunk
    # 30 chunks leaked would be start + 30 * chunk; the bound is the growth factor plus one chunk
    assert peak <= start * heap.grow_factor + 2 * chunk + heap.floor_objects
    assert peak < start + 10 * chunk


def test_objects_that_die_by_refcount_leave_the_frozen_heap(heap: Heap) -> None:
    """The estimate may run high (frozen objects die): the exact count then corrects it, and no full
    collection is paid for objects that are already gone."""
    for _ in range(30):
        items = [[i] for i in range(20_000)]  # lists: tracked, freed by refcount alone
        heap.settled()
        del items
    assert heap.stats.full_collections == 0
    assert heap._grown < 30 * 20_000  # corrected by the exact count at least once


def test_growth_alone_waits_for_the_interval_and_the_hard_limit_does_not() -> None:
    """The live heap grows for good reasons (a partition layer): between full collections at least
    `min_interval_s` passes, unless the heap grew past `hard_factor`."""
    now = [0.0]
    policy = Heap(grow_factor=1.5, hard_factor=3.0, floor_objects=1_000, min_interval_s=60.0,
                  clock=lambda: now[0])  # fmt: skip
    policy.install()
    kept: list[list[_Node]] = []
    try:
        policy.settled()  # the baseline
        base = gc.get_freeze_count()
        kept.append([_Node() for _ in range(base)])  # 2x: past grow_factor, within hard_factor
        policy.settled()
        assert policy.stats.full_collections == 0
        now[0] = 61.0
        policy.settled()
        assert policy.stats.full_collections == 1  # the interval passed
        kept.append([_Node() for _ in range(4 * gc.get_freeze_count())])  # 5x: past hard_factor
        policy.settled()
        assert policy.stats.full_collections == 2  # at once
    finally:
        policy.uninstall()


def test_factors_must_make_sense() -> None:
    with pytest.raises(ValueError, match="grow_factor"):
        Heap(grow_factor=1.0)
    with pytest.raises(ValueError, match="hard_factor"):
        Heap(grow_factor=3.0, hard_factor=2.0)
