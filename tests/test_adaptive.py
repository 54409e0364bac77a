"""Adaptive routing's decision function on its own: relief, stability, restore — over a closed loop where
the measured load follows the slot assignment (sprayed traffic splits by slots, a pinned flow sits in
its slot), as it does on the fabric."""

from __future__ import annotations

import random

import pytest

from controller.sm.adaptive import MAX_MOVES, rebalance
from controller.sm.policies import SLOTS, PolicyParams, even_assignment, weights_of

PORTS = (3, 4, 5, 6)


def slots(sprayed: float, pinned: dict[int, float]) -> list[float]:
    """Load per slot: `sprayed` (share of one port's capacity, in total) split evenly over the slots, plus
    flows pinned to a slot (slot -> load)."""
    return [sprayed / SLOTS + pinned.get(slot, 0.0) for slot in range(SLOTS)]


def measured(assignment: tuple[int, ...], sprayed: float, pinned: dict[int, float]) -> dict[int, float]:
    """Utilisation per port, given where the slots are."""
    util = dict.fromkeys(sorted(set(PORTS)), 0.0)
    for slot, port in enumerate(assignment):
        util[port] += slots(sprayed, pinned)[slot]
    return util


def run(assignment: tuple[int, ...], sprayed: float, pinned: dict[int, float], params: PolicyParams,
        rounds: int) -> list[tuple[int, ...]]:  # fmt: skip
    history = [assignment]
    for _ in range(rounds):
        util = measured(assignment, sprayed, pinned)
        result = rebalance("leaf1", assignment, util, slots(sprayed, pinned), params)
        assert len(result.moves) <= MAX_MOVES and len(result.assignment) == SLOTS
        assignment = result.assignment
        history.append(assignment)
    return history


def test_an_even_split_below_threshold_stays_put() -> None:
    result = rebalance(
        "leaf1", even_assignment(PORTS), dict.fromkeys(PORTS, 0.6), [0.15] * SLOTS, PolicyParams()
    )
    assert result.moves == () and result.reason is None


def test_without_per_slot_counters_nothing_moves() -> None:
    util = {3: 0.95, 4: 0.3, 5: 0.1, 6: 0.5}
    assert rebalance("leaf1", even_assignment(PORTS), util, None, PolicyParams()).moves == ()


def test_relief_moves_slots_from_the_hot_port_to_the_coolest() -> None:
    util = {3: 0.95, 4: 0.3, 5: 0.1, 6: 0.5}
    assignment = even_assignment(PORTS)
    load = [util[p] / 4 for p in assignment]
    result = rebalance("leaf1", assignment, util, load, PolicyParams(threshold=0.7, hysteresis=0.1))
    assert result.reason == "leaf1:3 at 95% > 70%"
    counts = weights_of(result.assignment)
    assert counts[3] < 4 and counts[5] > 4 and sum(counts.values()) == SLOTS
    assert all(m.source == 3 for m in result.moves) and "relief" in str(result.moves[0])


def test_a_pinned_elephant_gets_its_port_to_itself_and_the_loop_settles() -> None:
    """A flow that cannot be sprayed (fixed source port) fills 80% of port 3; the sprayed rest (1.2 ports
    worth) moves off port 3 until nothing is hot, then nothing moves any more (no oscillation)."""
    params = PolicyParams(threshold=0.7, hysteresis=0.1)
    history = run(even_assignment(PORTS), 1.2, {0: 0.8}, params, rounds=40)
    final = history[-1]
    assert history[-10:] == [final] * 10  # settled
    util = measured(final, 1.2, {0: 0.8})
    # all that is left on port 3 is the elephant's own slot (moving it would only move the elephant), and
    # every other port is below the threshold
    assert [s for s, p in enumerate(final) if p == 3] == [0]
    assert util[3] == pytest.approx(0.8 + 1.2 / SLOTS)
    assert all(u <= params.threshold for p, u in util.items() if p != 3)


@pytest.mark.parametrize("seed", range(200))
def test_random_loads_never_oscillate(seed: int) -> None:
    """Whatever the load, the assignment settles: after a few rounds it repeats (a fixed point), it never
    flips between two states."""
    rng = random.Random(seed)
    params = PolicyParams(threshold=rng.uniform(0.5, 0.9), hysteresis=rng.uniform(0.0, 0.3))
    if params.hysteresis >= params.threshold:
        params = PolicyParams(threshold=params.threshold, hysteresis=params.threshold / 2)
    pinned = {rng.randrange(SLOTS): rng.uniform(0, 0.9) for _ in range(rng.randrange(4))}
    sprayed = rng.uniform(0.2, 3.5)
    history = run(even_assignment(PORTS), sprayed, pinned, params, rounds=60)
    assert history[-1] == history[-2] == history[-3]
    # and it never made the hottest port hotter than spraying evenly did
    before, after = measured(history[0], sprayed, pinned), measured(history[-1], sprayed, pinned)
    assert max(after.values()) <= max(before.values()) + 1e-9


def test_restore_gives_back_one_slot_per_round_and_only_while_calm() -> None:
    params = PolicyParams(threshold=0.7, hysteresis=0.2)
    skewed = tuple([3] * 10 + [4] * 2 + [5] * 2 + [6] * 2)
    light = [0.01 if p == 3 else 0.05 for p in skewed]
    calm = rebalance("leaf1", skewed, {3: 0.1, 4: 0.1, 5: 0.1, 6: 0.1}, light, params)
    assert len(calm.moves) == 1 and calm.moves[0].restore and calm.moves[0].source == 3
    busy = rebalance("leaf1", skewed, {3: 0.6, 4: 0.5, 5: 0.5, 6: 0.5}, [0.06] * SLOTS, params)
    assert busy.moves == ()  # a restore would push the receiver above threshold - hysteresis


def test_a_dead_port_keeps_its_slots_for_fast_failover() -> None:
    assignment = even_assignment(PORTS)
    result = rebalance(
        "leaf1", assignment, {3: 0.95, 4: 0.2, 5: 0.2}, [0.2] * SLOTS, PolicyParams()
    )  # 6 down
    assert [s for s, p in enumerate(result.assignment) if p == 6] == [
        s for s, p in enumerate(assignment) if p == 6
    ]
