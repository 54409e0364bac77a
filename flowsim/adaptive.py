"""Adaptive routing in the simulator: the controller's `adaptive` at its interval, and switch-local AR.

**`adaptive`** is simulated as the controller runs it (`controller.core.adaptive.sample`), on the slot
tables of `flowsim.slots`: every `interval_ms` of simulated time it reads each set's port utilisation
(bytes over the interval / capacity) and per-slot load (the bytes of the slot's flows, as a share of its
port's capacity), smooths both (`ALPHA`; the first sample after a move replaces a port's history), skips a
set for the one sample after it moved (the controller's "mixed interval"), gives slots back only after
`RESTORE_AFTER` calm samples, and asks `controller.sm.adaptive.rebalance` — the controller's own
function — what to move.  So a move needs traffic that lasts several intervals: at the default 100 ms, a
collective that finishes in 27 ms is never touched (docs/flowsim.md shows the regimes).

**`local-ar`** (`flowsim.policies`): at every event each set's traffic is split over its ports so that
their utilisation evens out given the other traffic on them (water-filling), damped by half a step and
iterated with the max-min solve until it settles.  Only local load is seen, as a switch sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from controller.sm.adaptive import ALPHA, RESTORE_AFTER, rebalance
from controller.sm.policies import PolicyParams
from flowsim.network import F64
from flowsim.slots import SetKey, SlotTables

PortRef = tuple[str, int]
#: A local-AR split is settled when no port's share moves by more than this.
LOCAL_AR_TOL = 1e-3
#: A set's split counts as a move when some port's share changed by more than this.
LOCAL_AR_MOVE = 0.02


class ControllerAdaptive:
    """The controller's decision loop over counter samples (state kept across samples)."""

    def __init__(self, params: PolicyParams) -> None:
        self.params = params
        self.port_smoothed: dict[PortRef, float] = {}
        self.slot_smoothed: dict[tuple[SetKey, int], float] = {}
        self.calm: dict[SetKey, int] = {}
        self.moved_at: dict[SetKey, int] = {}
        self.fresh: set[PortRef] = set()
        self.samples = 0
        self.moves = 0
        self.reasons: list[str] = []

    def sample(
        self,
        tables: SlotTables,
        utilisation: Mapping[PortRef, float],
        slot_load: Callable[[int], list[float] | None],
        down: set[PortRef],
    ) -> dict[int, tuple[int, ...]]:
        """New assignments (set id -> slots) after one interval; `slot_load(set)` per slot, share of its
        port's capacity (None: not measurable)."""
        self.samples += 1
        mixed = {key for key, at in self.moved_at.items() if at == self.samples - 1}
        mixed_ports = {(switch, p) for switch, ports in mixed for p in ports}
        for ref, value in utilisation.items():
            if ref not in mixed_ports:
                old = self.port_smoothed.get(ref)
                fresh = old is None or ref in self.fresh
                self.port_smoothed[ref] = value if fresh else ALPHA * value + (1 - ALPHA) * old  # type: ignore[operator]
                self.fresh.discard(ref)
        params = self.params
        changed: dict[int, tuple[int, ...]] = {}
        for sid, key in enumerate(tables.keys):
            if key in mixed:
                continue
            switch, ports = key
            live = {
                p: self.port_smoothed[(switch, p)]
                for p in ports
                if (switch, p) in self.port_smoothed
                and (switch, p) in utilisation
                and (switch, p) not in down
            }
            loads = slot_load(sid)
            smoothed = None
            if loads is not None:
                smoothed = []
                for slot, value in enumerate(loads):
                    old = self.slot_smoothed.get((key, slot))
                    now = value if old is None else ALPHA * value + (1 - ALPHA) * old
                    self.slot_smoothed[(key, slot)] = now
                    smoothed.append(now)
            hot = any(u > params.threshold for u in live.values())
            self.calm[key] = 0 if hot else self.calm.get(key, 0) + 1
            result = rebalance(switch, tables.assignment(sid), live, smoothed, params,
                               restore=self.calm[key] >= RESTORE_AFTER)  # fmt: skip
            if result.moves:
                changed[sid] = result.assignment
                self.moves += len(result.moves)
                self.moved_at[key] = self.samples
                self.calm[key] = 0
                self.fresh |= {(switch, p) for p in ports}
                if result.reason and len(self.reasons) < 100:
                    self.reasons.append(result.reason)
        return changed


def water_fill(total: float, other: F64, cap: F64) -> F64:
    """Shares of `total` over ports with `other` load and capacity `cap` that even out their utilisation
    (ports already above the resulting level get nothing)."""
    if total <= 0 or cap.size == 0:
        return np.full(cap.size, 1.0 / max(cap.size, 1))
    order = np.argsort(other / cap, kind="stable")
    o, c = other[order], cap[order]
    shares = np.zeros(cap.size)
    for k in range(1, cap.size + 1):
        level = (total + o[:k].sum()) / c[:k].sum()
        if k == cap.size or level <= o[k] / c[k]:
            give = np.maximum(level * c[:k] - o[:k], 0.0)
            shares[order[:k]] = give / give.sum() if give.sum() > 0 else 1.0 / k
            return shares
    return shares  # pragma: no cover - the loop always returns


def local_split(
    tables: SlotTables, frac: F64, arriving: F64, port_load: F64, port_cap: F64
) -> tuple[F64, int, float]:
    """One damped local-AR update of every set's split: (new shares, sets that moved, largest change).
    `arriving[set]` is the set's traffic, `port_load`/`port_cap` per (set, port index), Gb/s."""
    new = frac.copy()
    moved, change = 0, 0.0
    for sid in range(tables.n_sets):
        k = int(tables.nports[sid])
        total = float(arriving[sid])
        if total <= 0:
            continue
        own = total * frac[sid, :k]
        other = np.maximum(port_load[sid, :k] - own, 0.0)
        target = water_fill(total, other, np.maximum(port_cap[sid, :k], 1e-12))
        step = 0.5 * (target - frac[sid, :k])
        new[sid, :k] = frac[sid, :k] + step
        delta = float(np.abs(step).max())
        change = max(change, delta)
        moved += int(delta > LOCAL_AR_MOVE)
    return new, moved, change


__all__ = ["LOCAL_AR_MOVE", "LOCAL_AR_TOL", "ControllerAdaptive", "local_split", "water_fill"]
