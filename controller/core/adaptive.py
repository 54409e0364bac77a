"""Adaptive routing inside the decision core: a counter sample in, slot moves out (pure, like the rest).

`sample` turns one `CountersSampled` into utilisation (per switch port, bits sent over the interval / the
link's capacity) and per-slot load (the byte counter of each slot flow), smooths both, and — under an
adaptive policy — asks `controller.sm.adaptive.rebalance` per slot table what to move.  Measurements on a
small emulated fabric are noisy (a 100 ms interval of a 1 Mb/s link is a dozen packets, and a CPU-starved
switch forwards in bursts), so three rules keep noise from moving traffic:

* **Smoothing**: utilisation and slot loads are exponentially weighted (`ALPHA` = 1/2 per sample), except
  across a move: the first clean sample after a set's slots moved replaces its ports' history.
* **Clean samples only**: the interval in which a set's slots moved mixes old and new weights and is
  skipped for that set (and slot counters that restarted because a flow was replaced are not read).
* **Restore hold-down**: a set gives slots back towards even weights only after `RESTORE_AFTER` calm
  samples in a row (no port above the threshold), one slot per sample; relief acts on the first hot one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.core.events import CountersSampled
from controller.core.state import Config, FabricState, Load
from controller.sm.adaptive import ALPHA, RESTORE_AFTER, rebalance
from controller.sm.policies import Assignment
from topologies.model import PortRef

SetKey = tuple[str, tuple[int, ...]]


def poll_interval_s(config: Config, stats_interval_s: float) -> float:
    """How often port counters are read: the policy's interval under adaptive routing (each sample may
    move slots), else `stats_interval_s` (counters for metrics and the live view only)."""
    if config.policy.multipath_policy == "adaptive":
        return config.policy_params.interval_ms / 1000.0
    return stats_interval_s


def sample_wanted(config: Config) -> bool:
    """Whether a counter poll also goes to the core as `CountersSampled` (with the slot counters)."""
    return config.policy.multipath_policy == "adaptive"


@dataclass(frozen=True)
class Decision:
    load: Load
    #: switch -> every set's assignment, for switches where something moved
    changed: Mapping[str, Mapping[tuple[int, ...], Assignment]]
    moves: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def _smooth(old: float | None, new: float, fresh: bool) -> float:
    return new if old is None or fresh else ALPHA * new + (1 - ALPHA) * old


def sample(
    state: FabricState,
    event: CountersSampled,
    names: Mapping[int, str],
    capacity_bps: Mapping[PortRef, float],
    now: float,
) -> Decision:
    """The new `Load` and, under an adaptive policy, the moves this sample calls for."""
    load = state.load
    tx = {PortRef(names[d], p): b for (d, p), b in event.tx_bytes.items() if d in names}
    slot_bytes = {(names[d], key): b for (d, key), b in event.slot_bytes.items() if d in names}
    interval_s = event.at - load.at if load.at is not None else 0.0
    utilisation: dict[PortRef, float] = {}
    if interval_s > 0:
        for ref, now_bytes in tx.items():
            before, capacity = load.tx_bytes.get(ref), capacity_bps.get(ref)
            if before is not None and capacity and now_bytes >= before:
                utilisation[ref] = (now_bytes - before) * 8.0 / interval_s / capacity
    fresh = set(load.fresh)
    smoothed = dict(load.smoothed)
    mixed = {
        (switch, ports)
        for (switch, ports), at in load.moved_at.items()
        if load.at is not None and at >= load.at  # moved during this interval
    }
    mixed_ports = {PortRef(s, p) for s, ports in mixed for p in ports}
    for ref, value in utilisation.items():
        if ref not in mixed_ports:
            smoothed[ref] = _smooth(smoothed.get(ref), value, ref in fresh)
            fresh.discard(ref)
    new_load = replace(load, at=event.at, tx_bytes=tx, slot_bytes=slot_bytes, utilisation=utilisation,
                       smoothed=smoothed, fresh=frozenset(fresh), samples=load.samples + 1)  # fmt: skip
    current = state.current
    if (
        current is None
        or not utilisation
        or state.config.policy.multipath_policy != "adaptive"
        or state.pending_change is not None
    ):
        return Decision(new_load, {})
    params = state.config.policy_params
    slot_smoothed = dict(load.slot_smoothed)
    calm = dict(load.calm)
    moved_at = dict(load.moved_at)
    changed: dict[str, dict[tuple[int, ...], Assignment]] = {}
    moves: list[str] = []
    reasons: list[str] = []
    for switch, sets in sorted(current.weights.items()):
        if switch not in state.connected:
            continue
        for ports, assignment in sorted(sets.items()):
            key: SetKey = (switch, ports)
            if key in mixed:
                continue  # this interval saw the old and the new weights: wait for a clean one
            live = {
                p: smoothed[PortRef(switch, p)]
                for p in ports
                if PortRef(switch, p) in smoothed
                and PortRef(switch, p) in utilisation
                and PortRef(switch, p) not in state.ports_down
            }
            slots = _slot_loads(switch, assignment, current.slot_keys.get(switch, {}).get(ports, ()),
                                load.slot_bytes, slot_bytes, interval_s, capacity_bps)  # fmt: skip
            smoothed_slots = None
            if slots is not None:
                smoothed_slots = []
                for slot_key, value in slots:
                    slot_smoothed[slot_key] = _smooth(slot_smoothed.get(slot_key), value, False)
                    smoothed_slots.append(slot_smoothed[slot_key])
            hot = any(u > params.threshold for u in live.values())
            calm[key] = 0 if hot else calm.get(key, 0) + 1
            result = rebalance(switch, assignment, live, smoothed_slots, params,
                               restore=calm[key] >= RESTORE_AFTER)  # fmt: skip
            if result.moves:
                changed.setdefault(switch, dict(sets))[ports] = result.assignment
                moves += [str(m) for m in result.moves]
                reasons += [result.reason] if result.reason else []
                moved_at[key] = now
                calm[key] = 0
                fresh |= {PortRef(switch, p) for p in ports}
    new_load = replace(
        new_load,
        slot_smoothed=slot_smoothed,
        calm=calm,
        moved_at=moved_at,
        fresh=frozenset(fresh),
        moves=load.moves + len(moves),
    )
    return Decision(new_load, changed, tuple(moves), tuple(reasons))


def _slot_loads(
    switch: str,
    assignment: Assignment,
    keys: tuple[Any, ...],
    before: Mapping[tuple[str, Any], int],
    now: Mapping[tuple[str, Any], int],
    interval_s: float,
    capacity_bps: Mapping[PortRef, float],
) -> list[tuple[tuple[str, Any], float]] | None:
    """(slot flow, traffic over the interval as a share of its port's capacity) per slot; None when a
    counter is missing or went backwards (a flow replaced since: its counter restarted)."""
    if interval_s <= 0 or len(keys) != len(assignment):
        return None
    loads = []
    for key, port in zip(keys, assignment, strict=True):
        old, new = before.get((switch, key)), now.get((switch, key))
        capacity = capacity_bps.get(PortRef(switch, port))
        if old is None or new is None or new < old or not capacity:
            return None
        loads.append(((switch, key), (new - old) * 8.0 / interval_s / capacity))
    return loads


__all__ = [
    "ALPHA",
    "RESTORE_AFTER",
    "Decision",
    "poll_interval_s",
    "sample",
    "sample_wanted",
]
