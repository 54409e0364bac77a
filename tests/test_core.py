"""The controller's decision core driven by sequences of events and timestamps — no threads, no clock.

Each test feeds typed events to `FabricCore` (through `CoreDriver`, which executes its commands against
fake switches that decode the real OpenFlow bytes) and checks the commands, the records and the switches.
"""

from __future__ import annotations

import pytest

from controller.core import fabric as fabric_module
from controller.core.events import (
    FlowRemoval,
    FlowsRemoved,
    LinkSighting,
    LinksSeen,
    Log,
    Phase,
    PortChange,
    PortsChanged,
    Push,
    PushDone,
    ReadSwitch,
    Reply,
    RoutingRequested,
    Save,
    SwitchConnected,
    SwitchDisconnected,
    SwitchesConnected,
    SwitchesRead,
    SwitchRead,
    Tick,
)
from controller.core.fabric import (
    AUDIT_ROUNDS,
    GENERATION_BLOCK,
    MAX_GENERATION,
    FabricCore,
    GenerationExhausted,
)
from controller.core.state import Config, RecordKind
from controller.sm.intents import FlowIntent, ForwardingOptions, generation_of
from controller.sm.manager import SubnetContext
from controller.statestore import SavedState
from tests.core_driver import CoreDriver
from topologies.generators import fat_tree, leaf_spine


def switch_links(driver: CoreDriver) -> list[int]:
    nodes = driver.fabric.nodes
    return [
        i
        for i, lk in enumerate(driver.fabric.links)
        if nodes[lk.a.node].is_switch and nodes[lk.b.node].is_switch
    ]


def test_start_computes_and_reserves_a_block_of_generations_before_any_cookie_is_written() -> None:
    d = CoreDriver(fat_tree(4))
    step = d.start()[0]
    saves = [c for c in step.commands if isinstance(c, Save)]
    assert [s.state.generation for s in saves] == [1 + GENERATION_BLOCK]
    assert d.state.generation == 1 and d.state.reserved == 1 + GENERATION_BLOCK
    assert [r.kind for r in d.state.records] == [RecordKind.ROUTING_COMPUTED]


def test_a_connecting_switch_is_read_back_then_sent_only_its_difference() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    dpid = d.sb.dpids["leaf1"]
    d.sb.up.add(dpid)
    steps = d.feed(SwitchConnected(dpid), now=10.0)
    assert isinstance(steps[0].commands[0], ReadSwitch)  # nothing is pushed before the switch is read
    pushes = [c for s in steps for c in s.commands if isinstance(c, Push) and c.phase is Phase.MAKE]
    assert len(pushes) == 1 and set(pushes[0].deltas) == {dpid}
    (record,) = d.records("switch_connect")
    assert (
        record.switch == "leaf1" and record.flow_mods and record.flow_mods > 0 and record.detected_at == 10.0
    )
    assert "leaf1" in d.state.synced and d.state.in_sync is not False
    # Reconnecting an up-to-date switch sends nothing.
    d.feed(SwitchDisconnected(dpid), now=11.0)
    d.feed(SwitchConnected(dpid), now=12.0)
    assert d.records("switch_connect")[-1].flow_mods == 0


def test_connect_all_programs_every_switch_and_every_pair_is_delivered() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    assert d.state.in_sync and len(d.state.connected) == 20
    d.fake.assert_delivers(d.fake.all_pairs())
    d.assert_holds_desired()
    cookies = {f.cookie for sw in d.fake.switches.values() for f in sw.flows.values()}
    assert {generation_of(c) for c in cookies} == {1}


def test_both_ends_of_a_cut_are_one_reroute_with_timings_and_changed_destinations() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    link = next(i for i in switch_links(d) if "agg1" in (d.fabric.links[i].a.node, d.fabric.links[i].b.node))
    d.now = 50.0
    d.set_link(link, up=False)
    (down,) = d.records("port_down")
    assert down.generation == 2 and down.ports is not None and len(down.ports) == 1  # one link, two ends
    assert down.detected_at == 50.0 and down.installed_ms is not None and down.installed_ms >= 0
    assert down.changed_destinations is not None and 0 < down.changed_destinations < 36
    assert not [c for s in d.steps[-3:] for c in s.commands if isinstance(c, Save)]  # within the block
    d.fake.assert_delivers(d.fake.all_pairs())
    d.set_link(link, up=True)
    assert d.records()[-1].kind == RecordKind.PORT_UP
    d.assert_holds_desired()


def test_make_before_break_every_pair_is_delivered_between_the_phases() -> None:
    d = CoreDriver(fat_tree(4), options=ForwardingOptions(fast_failover=False))
    d.start()
    d.connect_all()
    link = switch_links(d)[5]
    d.fake.set_link(link, up=False)  # the cable is cut: without failover groups pairs drop until rerouted
    d.sb.between_phases.append(lambda: d.fake.assert_delivers(d.fake.all_pairs()))
    ends = [e for e in (d.fabric.links[link].a, d.fabric.links[link].b)]
    d.feed(PortsChanged(tuple(PortChange(d.sb.dpids[e.node], e.port, False, 1.0) for e in ends)))
    assert d.records("port_down")  # the check ran between make and break and passed
    d.assert_holds_desired()


def test_an_operator_change_is_saved_before_it_takes_effect() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    before = d.state
    steps = d.feed(RoutingRequested(7, engine="sssp"))
    first = steps[0]
    assert [type(c) for c in first.commands] == [Save]  # nothing pushed before the save
    assert first.state.config == before.config and first.state.current is before.current
    assert d.saves[-1].engine == "sssp"
    reply = d.replies[7]
    assert reply.error is None and isinstance(reply.result, dict) and reply.result["kind"] == "routing_change"
    assert d.state.config.engine == "sssp" and d.state.in_sync


def test_a_failed_save_changes_nothing_and_tells_the_caller() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    before = d.state
    messages = sum(s.messages for s in d.fake.switches.values())
    d.save_error = "PermissionError: read-only"
    d.feed(RoutingRequested(3, engine="sssp"))
    assert d.replies[3].error is not None and "nothing changed" in str(d.replies[3].error)
    assert d.state.config == before.config and d.state.generation == before.generation
    assert d.state.current is before.current and d.state.pending_change is None
    assert sum(s.messages for s in d.fake.switches.values()) == messages


def test_a_bad_engine_is_refused_without_a_save() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    step = d.feed(RoutingRequested(1, engine="nope"))[0]
    assert [type(c) for c in step.commands] == [Reply]
    assert "unknown routing engine 'nope'" in str(d.replies[1].error)


def test_reroutes_save_only_when_they_leave_the_reserved_block() -> None:
    saved = SavedState("ftree", True, False, generation=5000)
    d = CoreDriver(fat_tree(4), saved=saved)
    d.start()
    assert d.state.generation == 5001 and d.saves[-1].generation == 5001 + GENERATION_BLOCK
    d.connect_all()
    saves = len(d.saves)
    link = switch_links(d)[0]
    for i in range(4):
        d.set_link(link, up=i % 2 == 1)
    assert len(d.saves) == saves  # 4 generations inside the block: no disk write on the reroute path


def test_a_failed_rollout_rereads_the_switch_and_repairs_it() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    d.sb.fail_next.add(d.sb.dpids["agg1"])
    d.feed(RoutingRequested(1, engine="minhop"))
    result = d.replies[1].result
    assert isinstance(result, dict) and result["failed_switches"]
    assert d.state.failed_updates == 1 and d.state.in_sync  # read back and fixed within the same run
    d.assert_holds_desired()


def test_discovery_grace_period_then_missing_then_ok() -> None:
    fabric = leaf_spine(2, 1, 1)
    d = CoreDriver(fabric)
    d.start()
    dpids = d.sb.dpids
    for name in ("leaf1", "spine1"):
        d.feed(SwitchConnected(dpids[name]), now=100.0)  # not up in the fake: reads fail, nothing probed
    d.feed(Tick(), now=103.0)
    assert not [c for c in d.steps[-1].commands if isinstance(c, Log) and "missing" in c.message]
    step = d.feed(Tick(), now=106.0)[0]
    warnings = [c.message for c in step.commands if isinstance(c, Log)]
    assert any("missing" in w for w in warnings), warnings
    link = next(lk for lk in fabric.links if {lk.a.node, lk.b.node} == {"leaf1", "spine1"})
    a, b = link.a, link.b
    d.feed(LinksSeen((LinkSighting(dpids[a.node], a.port, dpids[b.node], b.port, 107.0),)), now=107.0)
    step = d.feed(Tick(), now=108.0)[0]
    # leaf2 never connected: its link is pending, not missing; leaf1's was seen, so the fabric is fine again
    assert [c.message for c in step.commands if isinstance(c, Log)] == [
        "cabling: all declared links seen as declared"
    ]
    assert d.state.cabling_problems == ()
    step = d.feed(Tick(), now=109.0)[0]
    assert not [c for c in step.commands if isinstance(c, Log)]  # logged when it changes, not every round


def test_a_switch_that_disconnects_while_being_read_is_left_for_its_next_connection() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    dpid = d.sb.dpids["leaf2"]
    d.feed(SwitchConnected(dpid))
    d.feed(SwitchDisconnected(dpid))
    steps = d.feed(SwitchRead(dpid, {}, (), ()))
    assert steps[0].commands == () and "leaf2" not in d.state.installed


def test_unknown_datapaths_are_recorded_once_and_left_alone() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.feed(SwitchConnected(0xDEAD))
    d.feed(SwitchConnected(0xDEAD))
    assert [r.dpid for r in d.records("unknown_switch")] == [f"{0xDEAD:016x}"]


def test_same_events_same_state() -> None:
    def run() -> list[tuple[str, int | None, int | None]]:
        d = CoreDriver(fat_tree(4))
        d.start()
        d.connect_all()
        for i, link in enumerate(switch_links(d)[:6]):
            d.now = float(i)
            d.set_link(link, up=False)
        return [(r.kind, r.generation, r.flow_mods) for r in d.state.records]

    assert run() == run()


def test_generation_exhaustion_is_refused_up_front() -> None:
    core = FabricCore(SubnetContext.build(fat_tree(2)))
    with pytest.raises(GenerationExhausted):
        core.initial_state(SavedState("ftree", True, False, MAX_GENERATION - 1))
    state = core.initial_state(None, Config("ftree"))
    assert state.generation == 0


# --- entries lost behind the controller's back -------------------------------------------------------------


def _removals(
    d: CoreDriver, name: str, flows: list[FlowIntent], at: float, reason: str = "delete"
) -> FlowsRemoved:
    return FlowsRemoved(tuple(FlowRemoval(d.sb.dpids[name], f, reason, at) for f in flows))


def test_a_wiped_switch_is_noticed_from_its_flow_removed_messages_and_repaired() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    leaf = d.fake.switches["leaf1"]
    wiped = list(leaf.flows.values())
    leaf.flows.clear()  # `ovs-ofctl del-flows` + `del-groups`: no reconnect, only flow-removed messages
    leaf.groups.clear()
    steps = d.feed(_removals(d, "leaf1", wiped, at=50.0), now=50.002)
    assert ReadSwitch(d.sb.dpids["leaf1"]) in steps[0].commands
    (lost,) = d.records("entries_lost")
    assert lost.switch == "leaf1" and lost.entries_lost == len(wiped) and lost.detected_at == 50.0
    (repair,) = d.records("reconcile")
    assert repair.switch == "leaf1" and repair.flow_mods and repair.flow_mods >= len(wiped)
    assert d.state.in_sync and not d.state.repairing
    d.assert_holds_desired()
    d.fake.assert_delivers(d.fake.all_pairs())


def test_removals_by_the_controllers_own_rollouts_are_not_damage() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    before = {n: dict(p.flows) for n, p in d.state.installed.items()}
    d.set_link(switch_links(d)[0], up=False)  # a reroute: its break phase deletes entries
    after = {n: p.flows for n, p in d.state.installed.items()}
    gone = {n: [f for k, f in flows.items() if after[n].get(k) != f] for n, flows in before.items()}
    removed = [(n, f) for n, flows in gone.items() for f in flows]
    assert removed  # the reroute deleted or replaced something
    for name, flow in removed:  # OVS reports every one of them (our entries ask for it)
        steps = d.feed(_removals(d, name, [flow], at=60.0), now=60.0)
        assert not any(isinstance(c, ReadSwitch) for s in steps for c in s.commands)
    assert d.records("entries_lost") == [] and d.state.in_sync


def test_ticks_audit_every_switch_and_repair_silent_damage_without_noise() -> None:
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    records = len(d.state.records)
    agg = d.fake.switches["agg2"]
    key, flow = next(iter(agg.flows.items()))
    agg.flows[key] = flow._replace(actions=(("output", 4),))  # modified behind our back: no message at all
    read: set[int] = set()
    for i in range(AUDIT_ROUNDS):
        steps = d.feed(Tick(), now=100.0 + 10 * i)
        read |= {c.dpid for s in steps for c in s.commands if isinstance(c, ReadSwitch)}
    assert read == set(d.sb.dpids.values())  # every switch read back within AUDIT_ROUNDS ticks
    (repair,) = [r for r in d.state.records[records:] if r.kind == "reconcile"]  # only the damaged one
    assert repair.switch == "agg2" and repair.flow_mods == 1
    d.assert_holds_desired()
    assert d.state.in_sync


def test_the_audit_reads_a_bounded_number_of_entries_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """At scale a sixth of the fabric per tick is too much to read (k=16: 58,000 entries every 10 s): a tick
    reads at most AUDIT_ENTRIES_PER_TICK entries (at least one switch), and the round robin still reaches
    every switch and repairs what it finds."""
    monkeypatch.setattr(fabric_module, "AUDIT_ENTRIES_PER_TICK", 40)
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    sizes = {d.sb.dpids[n]: len(p.flows) + len(p.groups) for n, p in d.state.installed.items()}
    assert min(sizes.values()) > 10 and sum(sizes.values()) > 6 * 40  # the budget binds at k=4
    core4 = d.fake.switches["core4"]
    key, flow = next(iter(core4.flows.items()))
    core4.flows[key] = flow._replace(actions=(("output", 1),))  # modified behind our back
    read: set[int] = set()
    ticks = 0
    while read != set(sizes) and ticks < 100:
        steps = d.feed(Tick(), now=100.0 + 10 * ticks)
        chosen = [c.dpid for s in steps for c in s.commands if isinstance(c, ReadSwitch)]
        assert chosen, "every tick reads at least one switch"
        assert len(chosen) == 1 or sum(sizes[c] for c in chosen) <= 40
        read |= set(chosen)
        ticks += 1
    assert read == set(sizes) and ticks > AUDIT_ROUNDS  # all of them, over more ticks than unbounded
    (repair,) = [r for r in d.state.records if r.kind == "reconcile"]
    assert repair.flow_mods == 1
    d.assert_holds_desired()


def test_an_audit_read_leaves_port_changes_to_their_port_status_messages() -> None:
    """A port-status message can wait in the queue behind an audit's read of the same switch: the read
    must not take the change from it (it would then report nothing, and no reroute would be recorded)."""
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    index = switch_links(d)[0]
    ends = d.fake.set_link(index, up=False)  # the switches know; the messages are still on their way
    for i in range(AUDIT_ROUNDS):  # every switch read back meanwhile
        d.feed(Tick(), now=200.0 + i)
    assert d.records("port_down") == [] and not d.state.ports_down
    d.feed(PortsChanged(tuple(PortChange(d.sb.dpids[e.node], e.port, False, 210.0) for e in ends)), now=210.0)
    (down,) = d.records("port_down")
    assert down.flow_mods and len(d.state.ports_down) == 2
    d.fake.assert_delivers(d.fake.all_pairs())


def test_a_fabric_connecting_at_once_is_read_together_and_programmed_in_one_rollout() -> None:
    """The service batches connections and reads their switches concurrently (`SwitchesConnected`,
    `SwitchesRead`): every switch is read, and one rollout programs them all, as one at a time would."""
    d = CoreDriver(fat_tree(4))
    d.start()
    dpids = sorted(d.sb.dpids.values())
    d.sb.up.update(dpids)
    step = d.core.handle(d.state, 10.0, SwitchesConnected(tuple(dpids)))
    d.state = step.state
    reads = [c for c in step.commands if isinstance(c, ReadSwitch)]
    assert [r.dpid for r in reads] == dpids
    snaps = [(r.dpid, d.sb.read_switch(r.dpid)) for r in reads]
    batch = tuple(SwitchRead(dp, s.ports, tuple(s.flows), tuple(s.groups)) for dp, s in snaps)
    steps = d.feed(SwitchesRead(batch), now=10.5)
    pushes = [c for s in steps for c in s.commands if isinstance(c, Push) and c.phase is Phase.MAKE]
    assert len(pushes) == 1 and set(pushes[0].deltas) == set(dpids)
    records = d.records("switch_connect")  # one per switch, as when they connect one by one
    assert sorted(r.switch or "" for r in records) == sorted(d.sb.dpids)
    assert all(r.detected_at == 10.0 and r.flow_mods and r.switches_updated == 1 for r in records)
    assert sum(r.flow_mods or 0 for r in records) == sum(d.n_messages for d in pushes[0].deltas.values())
    assert d.state.synced == frozenset(d.sb.dpids)
    d.assert_holds_desired()


def test_make_before_break_is_sequenced_by_the_core_and_a_failed_make_gets_no_break() -> None:
    """The core asks for the make phase; only when it is confirmed does it ask for the break phase, and
    only on the switches whose make succeeded (the failed one keeps its old entries and is read back).
    Each phase's deadline grows with its size."""
    d = CoreDriver(fat_tree(4))
    d.start()
    d.connect_all()
    leaf1 = d.sb.dpids["leaf1"]
    step = d.core.handle(d.state, 20.0, PortsChanged((PortChange(leaf1, 3, False, 20.0),)))  # a cut
    make = [c for c in step.commands if isinstance(c, Push)]
    assert len(make) == 1 and make[0].phase is Phase.MAKE
    messages = sum(x.n_messages for x in make[0].deltas.values())
    assert make[0].timeout_s == Push.timeout_for(make[0].deltas) > 10.0 + messages / 2001
    failed = next(iter(make[0].deltas))
    made: set[int] = set()
    state, push, problems = step.state, make[0], {failed: "no barrier"}
    while push.phase is Phase.MAKE:  # the make phase's waves, each confirmed before the next
        made |= set(push.deltas)
        after = d.core.handle(state, 20.1, PushDone(push.rollout, Phase.MAKE, problems, 20.0, 20.1))
        state, problems = after.state, {}
        (push,) = [c for c in after.commands if isinstance(c, Push)]
        assert after.records == ()  # not done until the break phase is confirmed
    assert len(made) >= 2
    brk = [push]
    assert set(brk[0].deltas) == made - {failed}
    done = d.core.handle(state, 20.3, PushDone(make[0].rollout, Phase.BREAK, {}, 20.1, 20.3))
    record = done.records[-1]
    assert record.kind == "port_down" and record.failed_switches == {f"{failed:016x}": "no barrier"}
    assert (record.installed_ms, record.cleaned_ms) == (100.0, 300.0)
    assert [c.dpid for c in done.commands if isinstance(c, ReadSwitch)] == [failed]
