"""Progress of a collective through its dependent steps, rank by rank.

`done[r]` is how many steps rank r has finished.  A rank finishes step s when every transfer of step s it
sends or receives is complete and it had finished step s-1; a transfer of step s may start when both of
its ranks have finished step s-1.  Steps are generated when the first rank may enter them and dropped when
every rank is past them, so only a few are in memory however long the collective.

Runs of equivalent steps (same pairs, same bytes within one byte: every step of a ring) are where the
time goes at 16k ranks.  When two consecutive equivalent steps both started on every rank at one instant
with nothing else on the fabric, the collective is in lockstep and the next step will repeat the last one
exactly; `Collectives.try_skip` then advances by whole periods instead of simulating them (exact, bounded by
the next external event).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flowsim.network import F64, I32, Bool
from flowsim.workload import Collective


@dataclass
class StepState:
    index: int
    src: I32
    dst: I32
    size: F64
    started: Bool
    done: Bool
    fct: F64
    pending: I32  # per rank: transfers of this step not yet complete
    first_start: float = -1.0
    all_started_at: float | None = None  # every transfer started at this one instant
    lone: bool = False  # when they started, nothing else was active


@dataclass
class SyncMark:
    step: int
    at: float
    link_bytes: F64
    #: Flow members started and disturbances (faults, moves) so far: nothing else may happen in a period.
    started: float = 0.0
    disturbances: int = 0


@dataclass
class CollectiveState:
    spec: Collective
    done: I32
    window: dict[int, StepState] = field(default_factory=dict)
    next_step: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    last_mark: SyncMark | None = None
    last_done: StepState | None = None  # the most recent step every rank finished
    skipped_steps: int = 0

    @classmethod
    def of(cls, spec: Collective) -> CollectiveState:
        return cls(spec, np.zeros(spec.ranks.size, dtype=np.int32))

    @property
    def n_steps(self) -> int:
        return self.spec.n_steps

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def materialise(self) -> None:
        s = self.next_step
        src, dst, size = self.spec.step(s)
        n = self.spec.ranks.size
        m = src.size
        pending = (np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)).astype(np.int32)
        self.window[s] = StepState(
            s, src, dst, size, np.zeros(m, bool), np.zeros(m, bool), np.full(m, np.nan), pending
        )
        self.next_step += 1

    def advance(self, now: float) -> None:
        """Move ranks past finished steps, generating the next steps as ranks reach them."""
        if self.next_step == 0 and self.n_steps > 0:
            self.materialise()
        changed = True
        while changed:
            changed = False
            for s in sorted(self.window):
                st = self.window[s]
                passing = (self.done == s) & (st.pending == 0)
                if passing.any():
                    self.done[passing] = s + 1
                    changed = True
            if self.next_step < self.n_steps and (self.done >= self.next_step).any():
                self.materialise()
                changed = True
        for s in sorted(self.window):
            st = self.window[s]
            if st.done.all() and (self.done > s).all():
                self.last_done = st
                del self.window[s]
        if self.n_steps == 0 or (self.done >= self.n_steps).all():
            self.finished_at = now if self.finished_at is None else self.finished_at

    def ready(self) -> list[tuple[StepState, I32]]:
        """Transfers that may start now: (step, positions)."""
        out = []
        for s in sorted(self.window):
            st = self.window[s]
            can = ~st.started & (self.done[st.src] >= s) & (self.done[st.dst] >= s)
            if can.any():
                out.append((st, np.flatnonzero(can).astype(np.int32)))
        return out

    def completed(self, step: int, positions: I32, now: float) -> None:
        st = self.window[step]
        st.done[positions] = True
        st.fct[positions] = now - st.fct[positions]  # fct held the start time until now
        n = self.spec.ranks.size
        st.pending -= (
            np.bincount(st.src[positions], minlength=n) + np.bincount(st.dst[positions], minlength=n)
        ).astype(np.int32)


def lockstep_candidate(state: CollectiveState, st: StepState) -> bool:
    """Step `st` just started whole and alone; is the previous step an exact template for the next ones?"""
    mark = state.last_mark
    prev = state.last_done
    return (
        mark is not None
        and prev is not None
        and mark.step == st.index - 1
        and prev.index == st.index - 1
        and len(state.window) == 1
        and bool((state.done == st.index).all())
        and state.spec.signature(prev.index) == state.spec.signature(st.index)
        and prev.src.size == st.src.size
        and bool(np.array_equal(prev.src, st.src) and np.array_equal(prev.dst, st.dst))
    )


def equivalent_run(state: CollectiveState, first: int) -> int:
    """How many steps from `first` on (inclusive) share its signature, up to the last step."""
    sig = state.spec.signature(first)
    count = 0
    for s in range(first, state.n_steps):
        if state.spec.signature(s) != sig:
            break
        count += 1
    return count


__all__ = ["CollectiveState", "StepState", "SyncMark", "equivalent_run", "lockstep_candidate"]
