"""Policy changes and adaptive routing in the decision core, driven by events and timestamps (no threads).

A policy change is an operator change: validated whole, persisted before it takes effect, rolled out make
before break, an event.  Adaptive routing is counter samples in, slot moves out — each move an event with
its reason, bounded, and stable under hysteresis."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from controller.core.events import CountersSampled, PolicyRequested, Push, Save
from controller.core.fabric import StateNotSaved
from controller.core.state import RecordKind
from controller.sm.intents import FlowKey, ForwardingOptions
from controller.sm.policies import SLOTS, PolicyChoice, PolicyError, PolicyParams, weights_of
from controller.statestore import SavedState, StateError, StateStore
from tests.core_driver import CoreDriver
from topologies.generators import fat_tree, leaf_spine
from topologies.model import Fabric
from traffic.entropy import spray_sport

#: Links of the generated fabrics carry 400 Gb/s; the tests pretend an emulator shaped them to 100 Mb/s.
SCALE = 100e6 / 400e9
CAPACITY_BYTES_S = 100e6 / 8


def driven(fabric: Fabric, policy: str = "static", **params: float) -> CoreDriver:
    d = CoreDriver(fabric, options=ForwardingOptions(policy=policy), params=PolicyParams(**params),  # type: ignore[arg-type]
                   link_scale=SCALE)  # fmt: skip
    d.start()
    d.connect_all()
    return d


class Counters:
    """Cumulative byte counters of every switch port and slot flow, advanced by utilisations per interval:
    a port's traffic is sprayed traffic, split over the slots it holds."""

    def __init__(self, d: CoreDriver) -> None:
        self.d = d
        self.bytes = {(d.sb.dpids[r.node], r.port): 0 for r in d.fabric.port_map if r.node in d.sb.dpids}
        self.slots: dict[tuple[int, FlowKey], int] = {}
        self.at = 0.0

    def sample(self, interval_s: float, util: dict[tuple[str, int], float]) -> CountersSampled:
        self.at += interval_s
        current = self.d.state.current
        assert current is not None
        for (switch, port), u in util.items():
            sent = int(u * CAPACITY_BYTES_S * interval_s)
            dpid = self.d.sb.dpids[switch]
            self.bytes[(dpid, port)] += sent
            for ports, assignment in current.weights.get(switch, {}).items():
                keys = current.slot_keys[switch][ports]
                mine = [key for key, p in zip(keys, assignment, strict=True) if p == port]
                for key in mine:
                    self.slots[(dpid, key)] = self.slots.get((dpid, key), 0) + sent // len(mine)
        for switch, sets in current.slot_keys.items():  # every slot flow has a counter, busy or not
            for keys in sets.values():
                for key in keys:
                    self.slots.setdefault((self.d.sb.dpids[switch], key), 0)
        return CountersSampled(self.at, dict(self.bytes), dict(self.slots))

    def feed(self, interval_s: float, util: dict[tuple[str, int], float]) -> None:
        event = self.sample(interval_s, util)
        self.d.feed(event, now=event.at)


def leaf1_uplinks(d: CoreDriver) -> tuple[int, ...]:
    assert d.state.current is not None
    ((ports, _),) = d.state.current.weights["leaf1"].items()
    return ports


def split(d: CoreDriver, src: str, dst: str) -> Counter[int]:
    """Which leaf uplink each of 256 sprayed packets takes."""
    return Counter(
        int(d.fake.trace(src, dst, udp_src=spray_sport(i))[1].rsplit(">", 1)[1]) for i in range(256)
    )


# --- policy changes -----------------------------------------------------------------------------------------


def test_a_policy_change_is_saved_before_it_takes_effect_then_rolled_out() -> None:
    d = driven(fat_tree(4))
    steps = d.feed(PolicyRequested(7, PolicyChoice("spray")), now=5.0)
    first = steps[0]
    assert [type(c) for c in first.commands] == [Save]  # persisted first, nothing pushed yet
    assert first.state.config.options.policy == "static"
    assert first.commands[0].state.policy == "spray"  # type: ignore[union-attr]
    assert any(isinstance(c, Push) for s in steps[1:] for c in s.commands)
    assert d.state.config.options.policy == "spray" and d.state.in_sync
    (record,) = d.records(RecordKind.POLICY_CHANGE)
    assert record.policy == "spray" and record.flow_mods and record.flow_mods > 0
    assert d.replies[7].error is None and d.replies[7].result["kind"] == "policy_change"  # type: ignore[index]
    d.assert_holds_desired()
    assert len(split(d, "h1", "h16")) == 2
    # back to static: every slot table and its groups are removed again
    d.feed(PolicyRequested(8, PolicyChoice("static")), now=6.0)
    assert all(f.table == 0 for s in d.fake.switches.values() for f in s.flows.values())
    d.assert_holds_desired()


def test_a_policy_that_cannot_be_saved_changes_nothing() -> None:
    d = driven(fat_tree(4))
    before = {n: dict(s.flows) for n, s in d.fake.switches.items()}
    d.save_error = "No space left on device"
    steps = d.feed(PolicyRequested(1, PolicyChoice("adaptive")), now=1.0)
    assert isinstance(d.replies[1].error, StateNotSaved)
    assert d.state.config.options.policy == "static"
    assert not any(isinstance(c, Push) for s in steps for c in s.commands)
    assert {n: dict(s.flows) for n, s in d.fake.switches.items()} == before


@pytest.mark.parametrize(
    ("choice", "field"),
    [
        (PolicyChoice("wcmp"), "policy"),
        (PolicyChoice("adaptive", PolicyParams(threshold=0.0)), "threshold"),
        (PolicyChoice("adaptive", PolicyParams(threshold=1.5)), "threshold"),
        (PolicyChoice("adaptive", PolicyParams(interval_ms=5)), "interval_ms"),
        (PolicyChoice("adaptive", PolicyParams(hysteresis=0.9)), "hysteresis"),
        (PolicyChoice("spray", classes=((26, "adaptive"),)), "classes"),
        (PolicyChoice("spray", classes=((64, "static"),)), "classes"),
    ],
)
def test_bad_policy_input_names_the_field_and_changes_nothing(choice: PolicyChoice, field: str) -> None:
    d = driven(fat_tree(4))
    generation = d.state.generation
    steps = d.feed(PolicyRequested(3, choice), now=2.0)
    error = d.replies[3].error
    assert isinstance(error, PolicyError) and error.field == field
    assert [type(c).__name__ for s in steps for c in s.commands] == ["Reply"]  # no Save, no Push
    assert d.state.generation == generation and d.state.config.options.policy == "static"


def test_spray_on_a_fabric_without_equal_cost_alternatives_is_refused() -> None:
    d = driven(leaf_spine(2, 1, 2))
    d.feed(PolicyRequested(4, PolicyChoice("spray")), now=1.0)
    error = d.replies[4].error
    assert isinstance(error, PolicyError) and error.field == "policy" and "equal-cost" in str(error)
    assert d.state.config.options.policy == "static" and not d.saves[1:]


# --- adaptive routing -------------------------------------------------------------------------------------


def test_a_hot_uplink_loses_slots_with_a_reason_and_few_flow_mods() -> None:
    d = driven(fat_tree(4), "adaptive", threshold=0.7, hysteresis=0.1)
    up_a, up_b = leaf1_uplinks(d)
    assert split(d, "h1", "h16") == {up_a: 128, up_b: 128}
    counters = Counters(d)
    counters.feed(0.1, {})  # the first sample only sets the baseline
    assert not d.records(RecordKind.ADAPTIVE_MOVE)
    counters.feed(0.1, {("leaf1", up_a): 0.95, ("leaf1", up_b): 0.20})
    (move,) = d.records(RecordKind.ADAPTIVE_MOVE)
    assert move.reason is not None and f"leaf1:{up_a} at 95% > 70%" in move.reason
    assert move.moves and all(m.startswith("leaf1: ") and f"{up_a}->{up_b}" in m for m in move.moves)
    assert move.switches_updated == 1 and move.flow_mods is not None and 0 < move.flow_mods <= SLOTS // 2
    assert move.generation == d.state.generation  # weights, not a new routing
    assert d.state.current is not None
    counts = weights_of(d.state.current.weights["leaf1"][(up_a, up_b)])
    assert counts[up_a] < 8 < counts[up_b]
    d.assert_holds_desired()
    packets = split(d, "h1", "h16")
    assert packets[up_a] == 16 * counts[up_a] and packets[up_b] == 16 * counts[up_b]  # exact weights


def test_hysteresis_no_oscillation_and_restore_towards_even() -> None:
    d = driven(fat_tree(4), "adaptive", threshold=0.7, hysteresis=0.2)
    up_a, up_b = leaf1_uplinks(d)
    counters = Counters(d)
    counters.feed(0.1, {})
    counters.feed(0.1, {("leaf1", up_a): 0.9, ("leaf1", up_b): 0.3})
    assert len(d.records(RecordKind.ADAPTIVE_MOVE)) == 1
    # the next sample covers the move itself: skipped, whatever it says
    counters.feed(0.1, {("leaf1", up_a): 0.9, ("leaf1", up_b): 0.3})
    assert len(d.records(RecordKind.ADAPTIVE_MOVE)) == 1
    # balanced now (both below the threshold, but not calm enough to give slots back): nothing moves
    for _ in range(5):
        counters.feed(0.1, {("leaf1", up_a): 0.6, ("leaf1", up_b): 0.6})
    assert len(d.records(RecordKind.ADAPTIVE_MOVE)) == 1
    # calm: one slot per clean interval goes back until the split is even again, and it stays there
    for _ in range(30):
        counters.feed(0.1, {("leaf1", up_a): 0.1, ("leaf1", up_b): 0.1})
    assert d.state.current is not None
    assert weights_of(d.state.current.weights["leaf1"][(up_a, up_b)]) == {up_a: 8, up_b: 8}
    restores = d.records(RecordKind.ADAPTIVE_MOVE)[1:]
    assert restores and all(m.moves and "restore" in m.moves[0] for m in restores)


def test_congestion_no_move_can_fix_moves_nothing() -> None:
    d = driven(fat_tree(4), "adaptive")
    up_a, up_b = leaf1_uplinks(d)
    counters = Counters(d)
    counters.feed(0.1, {})
    counters.feed(0.1, {("leaf1", up_a): 0.98, ("leaf1", up_b): 0.97})
    assert not d.records(RecordKind.ADAPTIVE_MOVE)


@pytest.mark.parametrize("policy", ["static", "ecmp", "spray"])
def test_only_adaptive_moves(policy: str) -> None:
    d = driven(fat_tree(4), policy)
    counters = Counters(d)
    counters.feed(0.1, {})
    counters.feed(0.1, {("leaf1", 3): 1.0, ("agg1", 3): 1.0})
    assert not d.records(RecordKind.ADAPTIVE_MOVE)
    assert d.state.load.samples == 2 and d.state.load.utilisation  # measured all the same (REST shows it)


def test_a_reroute_keeps_the_weights_of_sets_it_does_not_change() -> None:
    d = driven(fat_tree(4), "adaptive")
    counters = Counters(d)
    counters.feed(0.1, {})
    hot = {(n, p): 0.95 for n in ("leaf1", "leaf3") for p in (leaf1_uplinks(d)[:1])}
    counters.feed(0.1, {**hot, **{(n, p): 0.1 for n in ("leaf1", "leaf3") for p in leaf1_uplinks(d)[1:]}})
    assert d.state.current is not None
    skewed = {n: dict(d.state.current.weights[n]) for n in ("leaf1", "leaf3")}
    assert all(weights_of(a) != {p: 8 for p in a} for w in skewed.values() for a in w.values())
    cut = next(i for i, lk in enumerate(d.fabric.links) if {lk.a.node, lk.b.node} == {"leaf1", "agg1"})
    d.set_link(cut, up=False)
    current = d.state.current
    assert current is not None
    assert dict(current.weights["leaf3"]) == skewed["leaf3"]  # untouched set keeps its weights
    assert "leaf1" not in current.weights  # one uplink left: no set, no slot table
    d.fake.assert_delivers(d.fake.all_pairs(), (0,), [spray_sport(i) for i in range(32)])
    d.assert_holds_desired()


# --- persistence ------------------------------------------------------------------------------------------


def test_saved_policy_round_trips_and_old_state_files_still_load(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    saved = SavedState("ftree", True, True, 12, "adaptive", 50, 0.8, 0.05, {"26": "static"})
    store.save(saved)
    assert store.load() == saved
    d = CoreDriver(fat_tree(4), saved=store.load())
    d.core.initial_state(store.load())
    config = d.core.initial_state(store.load()).config
    assert config.options.policy == "adaptive" and config.options.classes == ((26, "static"),)
    assert config.policy_params == PolicyParams(50, 0.8, 0.05)
    # a file from before routing policies: multipath true meant select groups; it now means ecmp
    (tmp_path / "controller-state.json").write_text(
        json.dumps(
            {"format": 1, "engine": "ftree", "fast_failover": True, "multipath": True, "generation": 3}
        )
    )
    old = store.load()
    assert old is not None and d.core.initial_state(old).config.options.policy == "ecmp"


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"policy": "wcmp"}, "policy"), ({"threshold": 2}, "threshold"), ({"interval_ms": 1}, "interval_ms")],
)
def test_a_bad_saved_policy_is_refused_naming_file_and_field(
    tmp_path: Path, patch: dict[str, object], field: str
) -> None:
    from controller.service import FabricService

    data = {"format": 1, "engine": "ftree", "fast_failover": True, "multipath": False, "generation": 3}
    (tmp_path / "controller-state.json").write_text(json.dumps({**data, **patch}))
    with pytest.raises(StateError, match=f"controller-state.json: {field}: "):
        FabricService.for_fabric(fat_tree(4), StateStore(tmp_path))


def test_changes_among_multipath_policies_reprogram_nothing_but_reset_adaptive_weights() -> None:
    d = driven(fat_tree(4), "ecmp")
    for policy in ("spray", "adaptive"):
        d.feed(PolicyRequested(1, PolicyChoice(policy)), now=1.0)
        (record, *_) = reversed(d.records(RecordKind.POLICY_CHANGE))
        assert record.policy == policy and record.flow_mods == 0 and record.switches_updated == 0
        assert d.state.current is not None and d.state.current.slot_sets == 16  # every set still known
    counters = Counters(d)
    counters.feed(0.1, {})
    up_a, up_b = leaf1_uplinks(d)
    counters.feed(0.1, {("leaf1", up_a): 0.95, ("leaf1", up_b): 0.1})
    assert d.records(RecordKind.ADAPTIVE_MOVE)
    d.feed(PolicyRequested(2, PolicyChoice("spray")), now=2.0)  # spraying means even weights again
    (record, *_) = reversed(d.records(RecordKind.POLICY_CHANGE))
    assert record.switches_updated == 1 and record.flow_mods and record.flow_mods <= SLOTS // 2
    assert split(d, "h1", "h16") == {up_a: 128, up_b: 128}
    d.assert_holds_desired()


def test_noise_neither_restores_early_nor_moves_on_one_burst() -> None:
    """Samples are smoothed and a set gives slots back only after RESTORE_AFTER calm samples in a row: a
    single quiet interval between busy ones restores nothing, and one burst on an otherwise quiet set is
    halved by the smoothing."""
    from controller.core.adaptive import RESTORE_AFTER

    d = driven(fat_tree(4), "adaptive", threshold=0.7, hysteresis=0.2)
    up_a, up_b = leaf1_uplinks(d)
    counters = Counters(d)
    counters.feed(0.1, {})
    counters.feed(0.1, {("leaf1", up_a): 0.3, ("leaf1", up_b): 0.3})
    counters.feed(0.1, {("leaf1", up_a): 1.0, ("leaf1", up_b): 0.3})  # one burst: smoothed to 0.65
    assert not d.records(RecordKind.ADAPTIVE_MOVE)
    counters.feed(0.1, {("leaf1", up_a): 1.0, ("leaf1", up_b): 0.3})  # it persists: 0.825 > 0.7
    assert len(d.records(RecordKind.ADAPTIVE_MOVE)) == 1
    counters.feed(0.1, {("leaf1", up_a): 0.6, ("leaf1", up_b): 0.6})  # the move's own interval: skipped
    for _ in range(3):  # calm, busy, calm ...: never RESTORE_AFTER calm samples in a row
        counters.feed(0.1, {("leaf1", up_a): 0.1, ("leaf1", up_b): 0.1})
        counters.feed(0.1, {("leaf1", up_a): 0.1, ("leaf1", up_b): 1.6})
    assert [m for m in d.records(RecordKind.ADAPTIVE_MOVE) if m.moves and "restore" in m.moves[0]] == []
    for _ in range(RESTORE_AFTER + 2):
        counters.feed(0.1, {("leaf1", up_a): 0.05, ("leaf1", up_b): 0.05})
    assert [m for m in d.records(RecordKind.ADAPTIVE_MOVE) if m.moves and "restore" in m.moves[0]]
