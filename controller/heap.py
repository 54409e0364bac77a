"""Keeps the cyclic garbage collector's full collections off the readers' path.

Why: at k=16 the controller holds millions of objects (tables, programs, the partition layer's flows).
CPython's automatic full collection walks all of them, holding the interpreter lock for 0.2-1.3 s at a time
(measured in a k=16 controller during an engine and a partition change, `benchmarks.reads`), and it ran
dozens of times per change: every REST read waited behind it.  Almost all of that heap is live, and
refcounting frees it when a state is replaced; the walks found next to nothing (0 objects in most).

What this does instead:
- automatic collections of the young generations only (their cost is bounded by their thresholds);
- while the worker handles a port change (`hurried`: a reroute, tens to hundreds of milliseconds at
  k=16), the youngest generation is collected only every `young_objects` allocations instead of CPython's
  700, and the event's objects are frozen (`settled`) before the usual threshold returns: a k=16 switch
  loss creates ~20,000 flow entries that all live on, and a collection every 700 allocations walked them
  again and again (~40 collections, ~20 ms of a ~100 ms cable cut, `benchmarks.reroute_fakes`).  Not
  during long changes (an engine or partition change: seconds): there collections of tens of thousands
  of young objects hold the lock long enough to put readers' p99 past 20 ms (`benchmarks.reads`: 20.1 ms
  with a threshold of 20,000 throughout, 4.9 ms without);
- once the worker has handled an event, everything alive is moved out of the collector's sight
  (`gc.freeze`, a constant-time list splice), so the next change's collections walk only what it created;
- a full collection (unfreeze, collect, freeze) only when the frozen heap has grown by `grow_factor` since
  the last one *and* `min_interval_s` has passed, or at once when it has grown by `hard_factor`: cyclic
  garbage that was frozen before it died is reclaimed then.  The live heap also grows for good reasons
  (a partition layer at k=16 takes the heap from 0.9 to 5.4 million objects), and each full collection
  there is a 0.3-1.6 s pause for every reader, so growth alone must not trigger one every time; the
  garbage found was 5-43 objects per change.  Memory stays within `hard_factor` of the heap after the
  first computation (plus an hour's garbage), and readers see a full collection at most once an hour.

The policy is process-wide (the collector is), so only the composition root (`fabriclab controller`)
installs it; tests and the library leave the collector alone.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

LOG = logging.getLogger(__name__)

#: Larger than any generation-1 count can reach: CPython then never starts a full collection by itself.
NO_AUTOMATIC_FULL = 1 << 30


@dataclass
class HeapStats:
    settles: int = 0
    full_collections: int = 0
    full_collection_ms_max: float = 0.0
    collected: int = 0


class Heap:
    def __init__(
        self,
        grow_factor: float = 2.0,
        floor_objects: int = 200_000,
        min_interval_s: float = 3600.0,
        hard_factor: float = 8.0,
        clock: Callable[[], float] = time.monotonic,
        young_objects: int = 200_000,
    ) -> None:
        if grow_factor <= 1.0 or hard_factor < grow_factor:
            raise ValueError("grow_factor must be > 1 and hard_factor >= grow_factor")
        if young_objects < 1:
            raise ValueError("young_objects must be >= 1")
        self.young_objects = young_objects
        self.grow_factor = grow_factor
        self.hard_factor = hard_factor
        self.floor_objects = floor_objects
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._last_full = clock()
        self.stats = HeapStats()
        self._baseline = 0
        #: Objects frozen since the last full collection (an over-estimate: some have died since).
        self._grown = 0
        self._saved_threshold: tuple[int, int, int] | None = None

    def install(self) -> None:
        """Young collections as CPython's defaults have them; no automatic full collections."""
        young0, young1, _ = gc.get_threshold()
        self._saved_threshold = gc.get_threshold()
        gc.set_threshold(young0, young1, NO_AUTOMATIC_FULL)
        gc.freeze()
        self._baseline = 0  # taken at the first settle: the heap with the first computation in it

    def uninstall(self) -> None:
        """Back to CPython's policy (tests; the controller never needs it)."""
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None
        gc.unfreeze()

    @contextlib.contextmanager
    def hurried(self) -> Iterator[None]:
        """The youngest generation collected every `young_objects` allocations while inside (see the
        module docstring: for short events whose latency matters).  Call `settled` inside: leaving
        with many young objects starts a collection of all of them at the next allocation."""
        before = gc.get_threshold()
        gc.set_threshold(max(before[0], self.young_objects), before[1], before[2])
        try:
            yield
        finally:
            gc.set_threshold(*before)

    def settled(self) -> None:
        """Called by the worker once an event is handled: freeze what is alive now; collect in full only
        as the class docstring says.  The growth is estimated from what each freeze adds (cheap: the young
        objects only); the exact count, a walk over the whole frozen heap, is taken only when the estimate
        crosses a limit."""
        self.stats.settles += 1
        self._grown += sum(len(gc.get_objects(generation)) for generation in range(3))
        gc.freeze()
        if self._baseline == 0:
            self._baseline, self._grown = max(self.floor_objects, gc.get_freeze_count()), 0
            return
        due = self.clock() - self._last_full >= self.min_interval_s
        limit = int(self._baseline * (self.grow_factor if due else self.hard_factor))
        if self._baseline + self._grown <= limit:
            return
        frozen = gc.get_freeze_count()
        if frozen > limit:
            self.collect()
        else:  # objects frozen earlier have died since: the estimate was high
            self._grown = max(0, frozen - self._baseline)

    def collect(self) -> int:
        """One full collection over everything (a pause proportional to the heap), then freeze again."""
        started = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        took_ms = 1000 * (time.perf_counter() - started)
        self._baseline, self._grown = max(self.floor_objects, gc.get_freeze_count()), 0
        self._last_full = self.clock()
        self.stats.full_collections += 1
        self.stats.collected += found
        self.stats.full_collection_ms_max = max(self.stats.full_collection_ms_max, took_ms)
        LOG.info("full collection: %d unreachable objects, %.0f ms, %d objects alive", found, took_ms,
                 self._baseline)  # fmt: skip
        return found


__all__ = ["NO_AUTOMATIC_FULL", "Heap", "HeapStats"]
