"""The controller's logic (decision core + subnet manager + intents) against fake OpenFlow switches.

Invariants, not exact tables: every host pair is delivered for every engine and forwarding mode, through
fast-failover before the controller reacts to a cut uplink, after make (adds only) and after break
(deletes), and switches end up holding exactly the desired program (no stale entries) after any seeded
sequence of failures and repairs.
"""

from __future__ import annotations

import random

import pytest

from controller.core.events import PortChange, PortsChanged
from controller.sm.intents import COOKIE_MAGIC, ForwardingOptions, GroupKind, diff, generation_of
from controller.sm.manager import SubnetManager
from tests.core_driver import CoreDriver
from tests.fakes import NotDelivered
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.model import Fabric

ENGINES = ["minhop", "updn", "ftree", "sssp"]
MODES = {
    "static": ForwardingOptions(fast_failover=False, multipath=False),
    "ff": ForwardingOptions(),
    # multipath policies: slot tables (the legacy `multipath=True` means ecmp), with and without failover
    "ecmp": ForwardingOptions(multipath=True),
    "spray-no-ff": ForwardingOptions(fast_failover=False, policy="spray"),
}
#: Source ports that hit every slot of the windows of two switch levels (bits 0-3 and 4-7).
SPORTS = [0xC000 | ((i * 5 + 3) % 16) << 4 | i for i in range(16)]


def fabrics() -> list[Fabric]:
    return [fat_tree(4), leaf_spine(4, 3, 3, parallel=2), rail(4, 4, groups=2)]


def driven(fabric: Fabric, engine: str = "ftree", mode: str = "ff") -> CoreDriver:
    """The controller's core started and every switch connected (programmed through real OpenFlow bytes)."""
    d = CoreDriver(fabric, engine=engine, options=MODES[mode])
    d.start()
    d.connect_all()
    return d


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fabric", fabrics(), ids=lambda f: f.name)
def test_every_engine_and_mode_delivers_all_pairs(fabric: Fabric, engine: str, mode: str) -> None:
    d = driven(fabric, engine, mode)
    computation = d.state.current
    assert computation is not None and computation.verification.ok and d.state.in_sync
    options = MODES[mode]
    multipath = options.multipath
    # every path the mode may use is checked for deadlocks (fast failover and multipath use alternatives)
    assert (computation.verification.deadlock_alternatives is not None) == (mode != "static")
    hashes = range(2) if multipath else (0,)  # what a select group (traffic that is not UDP) hashes on
    sports = SPORTS if multipath else [0xC001]  # UDP: the slot tables
    pairs = d.fake.all_pairs()
    delivered = d.fake.assert_delivers(pairs, hashes) + d.fake.assert_delivers(pairs, (0,), sports)
    n = len(fabric.hosts)
    assert delivered == n * (n - 1) * (len(hashes) + len(sports))
    d.assert_holds_desired()
    groups = [g for p in computation.programs.values() for g in p.groups.values()]
    kinds = {g.kind for g in groups}
    if mode == "static":
        assert not groups
    elif not multipath:
        assert groups and kinds == {GroupKind.FAST_FAILOVER}
    else:  # failover groups behind the slots (if on), select groups for traffic that is not UDP
        assert kinds == ({GroupKind.FAST_FAILOVER} if options.fast_failover else set()) | {GroupKind.SELECT}
        assert computation.slot_sets > 0
        assert any(f.table == 1 for p in computation.programs.values() for f in p.flows.values())


def test_fast_failover_protects_upward_hops_before_the_controller_reacts() -> None:
    """Groups hold equal-cost alternatives only, so what a switch can fix alone is an upward hop: every
    source below a cut leaf-agg or agg-core link still reaches everyone.  Downward hops (one way down in a
    tree) wait for the controller, which moves the choice upstream (next test)."""
    fabric = fat_tree(4)
    fake = driven(fabric).fake
    checked = 0
    for index, link in enumerate(fabric.links):
        a, b = fabric.nodes[link.a.node], fabric.nodes[link.b.node]
        if not (a.is_switch and b.is_switch):
            continue
        lower = a if (a.tier or 0) < (b.tier or 0) else b
        sources = [h.name for h in fabric.hosts if h.pod == lower.pod]
        if lower.name.startswith("leaf"):
            sources = [h.name for h in fabric.hosts if (p := fabric.peer(h.name, 1)) and p.node == lower.name]
        assert sources
        fake.set_link(index, up=False)
        checked += fake.assert_delivers((s, d) for s in sources for d in fabric.hosts_names() if s != d)
        fake.set_link(index, up=True)
    assert checked > 0


def test_without_fast_failover_a_cut_link_drops_until_the_controller_reroutes() -> None:
    fabric = fat_tree(4)
    d = driven(fabric, mode="static")
    fake = d.fake
    link = next(
        i for i, lk in enumerate(fabric.links) if lk.a.node.startswith("agg") or lk.b.node.startswith("agg")
    )
    ends = fake.set_link(link, up=False)  # the cable dies; the controller has not heard yet
    with pytest.raises(NotDelivered):
        fake.assert_delivers(fake.all_pairs())
    d.sb.between_phases.append(lambda: fake.assert_delivers(fake.all_pairs()))
    d.feed(PortsChanged(tuple(PortChange(d.sb.dpids[e.node], e.port, False, 1.0) for e in ends)))
    fake.assert_delivers(fake.all_pairs())
    d.assert_holds_desired()


@pytest.mark.parametrize("mode", ["ff", "static"])
@pytest.mark.parametrize("fabric", [fat_tree(4), leaf_spine(4, 4, 2)], ids=lambda f: f.name)
def test_a_cable_restore_delivers_every_pair_while_switches_update(fabric: Fabric, mode: str) -> None:
    """Make before break on a restore: the switches get the paths over the returning cable downstream
    first (`controller.sm.ordering`), so every pair is delivered after every single switch's update, in
    any order within a wave — not only at the end of the make phase.  (All at once, a switch could send
    a destination to a neighbour whose old entry for it still avoided the cable.)"""
    d = driven(fabric, mode=mode)
    fake = d.fake
    waves = [0]

    def all_delivered() -> None:
        waves[0] += 1
        fake.assert_delivers(fake.all_pairs())

    switch_links = [
        i
        for i, lk in enumerate(fabric.links)
        if fabric.nodes[lk.a.node].is_switch and fabric.nodes[lk.b.node].is_switch
    ]
    for index in random.Random(2).sample(switch_links, 6):
        ends = fake.set_link(index, up=False)
        d.feed(PortsChanged(tuple(PortChange(d.sb.dpids[e.node], e.port, False, 1.0) for e in ends)))
        fake.set_link(index, up=True)  # back; the controller has not heard yet: the detour still carries
        fake.assert_delivers(fake.all_pairs())
        d.sb.after_each_switch.append(all_delivered)
        d.feed(PortsChanged(tuple(PortChange(d.sb.dpids[e.node], e.port, True, 2.0) for e in ends)))
        d.sb.after_each_switch.clear()
        d.assert_holds_desired()
    assert waves[0] > 12  # several switches updated per restore


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(3))
def test_random_failures_and_repairs_leave_no_stale_entries(engine: str, seed: int) -> None:
    fabric = fat_tree(4)
    d = driven(fabric, engine)
    fake = d.fake

    def live_pairs_delivered() -> None:  # between make and break of every reroute
        assert d.state.current is not None
        fake.assert_delivers(fake.all_pairs(d.state.current.tables.subnet.fabric.hosts_names()))

    d.sb.between_phases.append(live_pairs_delivered)
    rng = random.Random(seed)
    switch_links = [
        i
        for i, lk in enumerate(fabric.links)
        if fabric.nodes[lk.a.node].is_switch and fabric.nodes[lk.b.node].is_switch
    ]
    down: set[int] = set()
    for step in range(12):
        if down and (len(down) >= 3 or rng.random() < 0.4):
            index, up = rng.choice(sorted(down)), True
            down.discard(index)
        else:
            index, up = rng.choice(sorted(set(switch_links) - down)), False
            down.add(index)
        generation = d.state.generation
        d.now = float(step)
        d.set_link(index, up=up)
        computation = d.state.current
        assert computation is not None and computation.generation == generation + 1  # a reroute happened
        v = computation.verification
        assert (v.unreachable_pairs, v.loop_entries, v.dead_entries) == (0, 0, 0), (
            v
        )  # sssp: no deadlock promise
        live_hosts = computation.tables.subnet.fabric.hosts_names()
        fake.assert_delivers(fake.all_pairs(live_hosts))
        d.assert_holds_desired()


def test_an_unchanged_fabric_recomputes_to_an_empty_delta_and_cookies_carry_generations() -> None:
    fabric = fat_tree(4)
    sm = SubnetManager(fabric, engine="ftree")
    first = sm.recompute()
    second = sm.recompute()
    assert second.generation == first.generation + 1
    for name, program in first.programs.items():
        assert diff(program, second.programs[name]).empty
        cookies = {f.cookie for f in program.flows.values()}
        assert cookies == {COOKIE_MAGIC | first.generation}
        assert {generation_of(c) for c in cookies} == {first.generation}
    assert generation_of(0x1234) is None


def test_engine_change_rewrites_only_what_differs() -> None:
    fabric = fat_tree(4)
    sm = SubnetManager(fabric, engine="ftree")
    before = sm.recompute()
    after = sm.recompute(engine="minhop")
    changed = sum(len(diff(before.programs[n], p).add_flows) for n, p in after.programs.items())
    total = sum(len(p.flows) for p in after.programs.values())
    assert 0 < changed < total


def test_compute_with_an_unknown_engine_changes_nothing() -> None:
    sm = SubnetManager(fat_tree(4), engine="ftree")
    before = sm.recompute()
    with pytest.raises(KeyError, match="unknown routing engine 'nope'"):
        sm.recompute(engine="nope")
    assert sm.current is before and sm.engine == "ftree"
