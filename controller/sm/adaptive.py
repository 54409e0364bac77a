"""Adaptive routing's decision: given measured link load, which slots of a slot table move where.

A slot table (see `controller.sm.policies`) gives each port of a set of equal-cost ports some of its 16
slots; sprayed traffic splits in proportion to the slots, a flow that is not sprayed sits in one slot.
Every interval the controller measures each port's utilisation (bits sent over the interval / capacity)
and each slot's load (the byte counter of its slot flow, as a share of a port's capacity), and calls
`rebalance` per set:

* **Relief** — when a port of the set is above ``threshold``: move one slot at a time from the hottest
  port to the coolest, choosing the slot whose load best evens out the two, but only a slot whose move
  lowers the hotter of the two ports by at least `MIN_GAIN` — min(load, gap - load) >= MIN_GAIN — and only
  while the hottest port is above ``threshold - hysteresis``.  Every move replaces the largest load by two
  smaller ones, by a margin, so for a given load the moves end (no ping-pong), and congestion no move can
  fix (every port full, or one flow that alone fills its port) moves nothing.
* **Restore** — when no port is above ``threshold``: give back one slot per interval towards an even
  split (what spraying wants when nothing is hot), the lightest slot of the port with the most surplus,
  but only if the receiving port stays at or below ``threshold - hysteresis`` afterwards — so a restore
  never makes the next relief necessary (no oscillation between the two).

Per-slot loads are measured, not guessed: estimating them as a port's load divided by its slots makes a
pinned elephant bounce between two ports forever (tests/test_adaptive.py shows the loop that found it).
Without per-slot counters for a set, nothing in it moves.  It is a pure function of (assignment, loads,
parameters); the same function serves the controller and the flow-level simulator, so both mean the same
by ``adaptive``.  Ports not in `utilisation` (down) keep their slots: fast failover carries them until the
reroute recompiles the set without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.sm.policies import SLOTS, Assignment, PolicyParams, even_assignment

#: At most this many slots move in one set per interval (half the table): a bad sample cannot swing all.
MAX_MOVES = SLOTS // 2
#: Weight of the newest sample in the smoothed utilisation and slot loads (the controller's, and the
#: simulator's model of it: `controller.core.adaptive`, `flowsim.adaptive`).
ALPHA = 0.5
#: Calm samples in a row before a set gives a slot back towards even weights.
RESTORE_AFTER = 3
#: A relief move must lower the hotter of its two ports by at least this share of capacity: moving a slot
#: between two ports that differ by about one slot's load would only swap which one is hot.
MIN_GAIN = 0.02


@dataclass(frozen=True)
class Move:
    """`slots` slots of `switch`'s set moved from port `source` to port `target` (utilisation before)."""

    switch: str
    source: int
    target: int
    slots: int
    source_util: float
    target_util: float
    restore: bool = False

    def __str__(self) -> str:
        why = "restore" if self.restore else "relief"
        return (
            f"{self.switch}: {self.slots} slot(s) {self.source}->{self.target} ({why}; "
            f"{self.source_util:.0%} -> {self.target_util:.0%})"
        )


@dataclass(frozen=True)
class Rebalanced:
    assignment: Assignment
    moves: tuple[Move, ...]
    #: Why it acted (the hot port and its utilisation), None when nothing moved.
    reason: str | None = None


def rebalance(
    switch: str,
    assignment: Assignment,
    utilisation: Mapping[int, float],
    slot_load: Sequence[float] | None,
    params: PolicyParams,
    max_moves: int = MAX_MOVES,
    restore: bool = True,
) -> Rebalanced:
    """New slot assignment for one set (see the module doc).  `utilisation`: port -> share of capacity, for
    the set's live ports; `slot_load`: per slot, its traffic as a share of a port's capacity (None: not
    measured, nothing moves); `restore`: whether giving slots back is allowed now (the caller's hold-down:
    the controller waits for a few calm samples in a row)."""
    ports = sorted(utilisation)
    if len(ports) < 2 or slot_load is None or len(slot_load) != len(assignment):
        return Rebalanced(assignment, ())
    held: dict[int, list[int]] = {p: [] for p in ports}
    for slot, port in enumerate(assignment):
        if port in held:
            held[port].append(slot)
    estimate = {p: float(utilisation[p]) for p in ports}
    calm_level = params.threshold - params.hysteresis
    result = list(assignment)
    moved: dict[tuple[int, int], int] = {}
    hottest = max(ports, key=lambda p: (estimate[p], -p))
    reason: str | None = None
    calm = estimate[hottest] <= params.threshold
    if not calm:
        reason = f"{switch}:{hottest} at {estimate[hottest]:.0%} > {params.threshold:.0%}"
        for _ in range(max_moves):
            source = max(ports, key=lambda p: (estimate[p], -p))
            target = min(ports, key=lambda p: (estimate[p], p))
            gap = estimate[source] - estimate[target]
            if source == target or estimate[source] <= calm_level:
                break
            fits = [s for s in held[source] if min(slot_load[s], gap - slot_load[s]) >= MIN_GAIN]
            if not fits:
                break
            slot = min(fits, key=lambda s: (abs(gap / 2 - slot_load[s]), s))
            _move(slot, source, target, held, result, estimate, slot_load[slot], moved)
    elif restore:
        even = _even_counts(assignment, ports)
        donors = [p for p in ports if len(held[p]) > even[p]]
        takers = [p for p in ports if len(held[p]) < even[p]]
        if donors and takers:
            source = max(donors, key=lambda p: (len(held[p]) - even[p], -p))
            target = min(takers, key=lambda p: (estimate[p], p))
            fits = [s for s in held[source] if estimate[target] + slot_load[s] <= calm_level]
            if fits:
                slot = min(fits, key=lambda s: (slot_load[s], s))
                _move(slot, source, target, held, result, estimate, slot_load[slot], moved)
                reason = f"{switch}: restoring even weights ({target} at {utilisation[target]:.0%})"
    if not moved:
        return Rebalanced(assignment, ())
    moves = tuple(
        Move(switch, s, t, n, float(utilisation[s]), float(utilisation[t]), calm)
        for (s, t), n in sorted(moved.items())
    )
    return Rebalanced(tuple(result), moves, reason)


def _move(
    slot: int,
    source: int,
    target: int,
    held: dict[int, list[int]],
    result: list[int],
    estimate: dict[int, float],
    load: float,
    moved: dict[tuple[int, int], int],
) -> None:
    held[source].remove(slot)
    held[target].append(slot)
    result[slot] = target
    estimate[source] -= load
    estimate[target] += load
    moved[(source, target)] = moved.get((source, target), 0) + 1


def _even_counts(assignment: Assignment, ports: list[int]) -> dict[int, int]:
    """Slots each live port holds in an even split of the slots the live ports hold together."""
    live = [p for p in assignment if p in ports]
    base = even_assignment(tuple(ports))[: len(live)] if live else ()
    counts = dict.fromkeys(ports, 0)
    for port in base:
        counts[port] += 1
    return counts


__all__ = ["ALPHA", "MAX_MOVES", "MIN_GAIN", "RESTORE_AFTER", "Move", "Rebalanced", "rebalance"]
