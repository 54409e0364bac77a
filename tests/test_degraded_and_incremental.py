"""Degraded fabrics (5% of switch links failed, a whole spine or core removed) and incremental recomputation.

* Every pair still connected is reachable, tables are loop-free and deadlock-free (ftree on one VL, dfsssp
  lane by lane), on fabriclab's and OpenSM's layouts and on relabelled copies.
* After one failure, `incremental.reroute` changes only the destinations whose routes used the failed link
  or switch — exactly those, column for column — and the subnet manager reports how many moved.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from controller.sm.engines import default_registry
from controller.sm.incremental import NotIncremental, failures, reroute
from controller.sm.manager import SubnetManager
from controller.sm.quality import quality
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from topologies.faults import degrade
from topologies.generators import fat_tree, leaf_spine, opensm_fat_tree, rail
from topologies.model import Fabric, PortRef
from topologies.relabel import relabel

BASES = [
    fat_tree(8),
    opensm_fat_tree(8),
    relabel(fat_tree(8), 11).fabric,
    leaf_spine(8, 4, 8, parallel=2),
    rail(8, 8, groups=2),
]


def _switch_links(fabric: Fabric) -> int:
    return sum(
        1
        for link in fabric.links
        if fabric.nodes[link.a.node].is_switch and fabric.nodes[link.b.node].is_switch
    )


def _top_switch(fabric: Fabric) -> str:
    """A switch of the top tier (a core or a spine): the farthest from the hosts."""
    from controller.sm.hostorder import top_tier

    subnet = Subnet.build(fabric)
    return subnet.switch_names[int(np.flatnonzero(top_tier(subnet))[0])]


def _degraded_cases() -> list[tuple[Fabric, str]]:
    cases = []
    for base in BASES:
        five_percent = round(0.05 * _switch_links(base))
        for seed in (1, 2):
            cases.append((degrade(base, fail_links=five_percent, seed=seed).fabric, f"{base.name}-5%-{seed}"))
        cases.append((base.without(nodes=[_top_switch(base)]), f"{base.name}-top-switch"))
    return cases


DEGRADED = _degraded_cases()


@pytest.mark.parametrize(("fabric", "case"), DEGRADED, ids=[c for _, c in DEGRADED])
@pytest.mark.parametrize("engine", ["ftree", "dfsssp"])
def test_degraded_fabrics_stay_reachable_and_deadlock_free(fabric: Fabric, case: str, engine: str) -> None:
    tables = default_registry().create(engine).route(Subnet.build(fabric))
    result = verify(tables)
    assert result.unreachable_pairs == 0, case
    assert result.loop_entries == 0 and result.dead_entries == 0, case
    assert result.deadlock is not None
    assert result.deadlock.acyclic, (case, result.deadlock.cycles)
    if engine == "ftree":
        assert result.deadlock.vls == 1
    figures = quality(tables, shifts=False)
    assert figures.switch_links.max_over_mean < 3.0, case


def _changed_columns(before: RoutingTables, after: RoutingTables) -> set[int]:
    old, new = before.subnet, after.subnet
    rows = [old.switch_index[name] for name in new.switch_names]
    return {
        int(lid)
        for lid in new.dest_lids
        if lid <= old.max_lid and not np.array_equal(before.lft[rows, lid], after.lft[:, lid])
    }


def _users_of(tables: RoutingTables, switch: str, port: int) -> set[int]:
    row = tables.lft[tables.subnet.switch_index[switch]]
    return {int(lid) for lid in tables.subnet.dest_lids if row[lid] == port}


@pytest.mark.parametrize("engine", default_registry().names())
@pytest.mark.parametrize(
    "fabric", [fat_tree(8), opensm_fat_tree(6), rail(4, 4, groups=2)], ids=lambda f: f.name
)
def test_one_failed_link_moves_only_the_destinations_that_used_it(engine: str, fabric: Fabric) -> None:
    router = default_registry().create(engine)
    before = router.route(Subnet.build(fabric))
    switch_links = [
        i
        for i, cable in enumerate(fabric.links)
        if fabric.nodes[cable.a.node].is_switch and fabric.nodes[cable.b.node].is_switch
    ]
    for index in switch_links[:: max(1, len(switch_links) // 5)]:
        link = fabric.links[index]
        result = reroute(before, fabric.without(links=[index]), router)
        users = _users_of(before, link.a.node, link.a.port) | _users_of(before, link.b.node, link.b.port)
        assert result.affected_lids == users
        assert result.failed_links == (str(link),) and not result.removed_lids
        assert result.changed_lids <= result.affected_lids
        assert _changed_columns(before, result.tables) == result.changed_lids
        assert result.changed_lids, "a link that carried routes must move some"
        assert verify(result.tables).ok, (engine, str(link))
        assert result.tables.info["incremental"]["changed"] == len(result.changed_lids)


@pytest.mark.parametrize("engine", ["ftree", "dfsssp"])
def test_a_failed_core_moves_only_the_destinations_routed_through_it(engine: str) -> None:
    fabric = opensm_fat_tree(8)
    router = default_registry().create(engine)
    before = router.route(Subnet.build(fabric))
    core = "core5"
    subnet = before.subnet
    through = set()
    for link in fabric.links:
        if core in (link.a.node, link.b.node):
            far = link.b if link.a.node == core else link.a
            through |= _users_of(before, far.node, far.port)
    result = reroute(before, fabric.without(nodes=[core]), router)
    assert result.failed_switches == (core,)
    assert result.removed_lids == {subnet.lids.lid(core)}
    assert result.affected_lids == through - result.removed_lids
    assert _changed_columns(before, result.tables) == result.changed_lids <= result.affected_lids
    assert verify(result.tables).ok
    # the full recomputation would have moved far more: that is what incremental saves
    assert len(_changed_columns(before, result.full)) > len(result.changed_lids)


def test_added_links_are_not_incremental() -> None:
    fabric = fat_tree(4)
    router = default_registry().create("ftree")
    broken = fabric.without(links=[20])
    before = router.route(Subnet.build(broken))
    with pytest.raises(NotIncremental, match="is new"):
        reroute(before, fabric, router)


def test_subnet_manager_reroutes_incrementally_and_counts_the_moves() -> None:
    fabric = fat_tree(8)
    manager = SubnetManager(fabric, engine="ftree")
    first = manager.recompute()
    assert not first.incremental and first.changed_destinations is None
    link = next(cable for cable in fabric.links if str(cable) == "agg1:5--core1:1")
    assert manager.set_port_state("agg1", 5, up=False, now=1.0)
    second = manager.recompute()
    assert second.incremental and second.verification.ok
    users = _users_of(first.tables, "agg1", 5) | _users_of(first.tables, "core1", 1)
    assert second.changed_lids is not None and 0 < len(second.changed_lids) <= len(users)
    assert second.changed_destinations == len(second.changed_lids)
    unchanged = [lid for lid in first.tables.subnet.dest_lids.tolist() if lid not in second.changed_lids]
    assert np.array_equal(first.tables.lft[:, unchanged], second.tables.lft[:, unchanged])
    assert (second.tables.lft[second.tables.subnet.switch_index["agg1"]] != 5).all()
    assert str(link) in second.down_links
    # a link coming back is not a failure: full recomputation
    assert manager.set_port_state("agg1", 5, up=True, now=2.0)
    third = manager.recompute()
    assert not third.incremental and third.changed_destinations is None
    assert np.array_equal(third.tables.lft, first.tables.lft)
    # another engine: full
    fourth = manager.recompute(engine="sssp")
    assert not fourth.incremental


def test_removed_hosts_are_reported_not_rerouted() -> None:
    fabric = leaf_spine(4, 2, 2)
    router = default_registry().create("ftree")
    before = router.route(Subnet.build(fabric))
    host_link = next(i for i, cable in enumerate(fabric.links) if "h1" in (cable.a.node, cable.b.node))
    live = fabric.without(links=[host_link], nodes=["h1"])
    result = reroute(before, live, router)
    lid = before.subnet.lids.lid("h1")
    assert result.removed_lids == {lid}
    assert not result.affected_lids and not result.changed_lids
    assert lid not in result.tables.subnet.dest_lids.tolist()
    others = [other for other in before.subnet.dest_lids.tolist() if other != lid]
    assert np.array_equal(result.tables.lft[:, others], before.lft[:, others])


def _first_parent_cables(fabric: Fabric) -> list[int]:
    """Per switch with an uplink: the cable to its lowest-positioned parent (the one whose loss reordered
    switches when positions followed each switch's own first parent)."""
    from controller.sm.hostorder import switch_positions
    from controller.sm.orientation import orient

    subnet = Subnet.build(fabric)
    o = orient(subnet, "exclude")
    pos = switch_positions(subnet, o.rank, o.ud.up)
    cables = []
    for s, name in enumerate(subnet.switch_names):
        ups = np.flatnonzero(o.ud.up[s])
        if ups.size:
            port = int(ups[np.argmin(pos[subnet.nbr[s, ups]])])
            cables.append(fabric.port_map[PortRef(name, port)][0])
    return cables


@pytest.mark.parametrize(
    "fabric",
    [opensm_fat_tree(8), relabel(fat_tree(8), 5).fabric, rail(4, 4, groups=2)],
    ids=lambda f: f.name,
)
def test_a_cut_cable_renumbers_nothing_and_moves_only_its_users(fabric: Fabric) -> None:
    """Losing any uplink — the cable to a switch's first parent too — keeps every switch position and host
    number (the first parent's cable renumbered a whole pod before) and every other uplink's place in the
    digit rule (the uplinks after a lost one shifted before), so even ftree's full recomputation moves
    only the hosts whose routes used the cable.  (Routes toward switch LIDs are spread over the candidates
    that reach the switch, which a cut can change: they are not held to this.)"""
    from controller.sm.hostorder import host_order

    router = default_registry().create("ftree")
    subnet = Subnet.build(fabric)
    before = router.route(subnet)
    order = host_order(subnet)
    cables = [
        i
        for i, cable in enumerate(fabric.links)
        if fabric.nodes[cable.a.node].is_switch and fabric.nodes[cable.b.node].is_switch
    ]
    firsts = _first_parent_cables(fabric)
    assert firsts
    for index in sorted(set(firsts) | set(cables[::7])):
        link = fabric.links[index]
        live = Subnet.build(fabric.without(links=[index]), subnet.lids)
        after = host_order(live)
        assert np.array_equal(after.position, order.position), str(link)
        assert np.array_equal(after.slot, order.slot), str(link)
        full = router.route(live)
        users = _users_of(before, link.a.node, link.a.port) | _users_of(before, link.b.node, link.b.port)
        hosts = {int(lid) for lid in subnet.ep_lids}
        assert _changed_columns(before, full) & hosts <= users, str(link)


def test_failures_are_the_same_whether_links_are_shared_or_copied() -> None:
    """The controller's live fabrics share Link objects with the declared one (identity says what is
    gone); a fabric read again from a file does not (keys do): both name the same failures, and a link that
    was not there before is refused either way."""
    fabric = fat_tree(4)
    live = fabric.without(links=[3, 17], nodes=["core2"])
    shared = failures(fabric, live)
    copied = dataclasses.replace(live, links=tuple(dataclasses.replace(link) for link in live.links))
    assert [str(link) for link in failures(fabric, copied)[0]] == [str(link) for link in shared[0]]
    assert shared[1] == failures(fabric, copied)[1] == ["core2"]
    assert {str(fabric.links[3]), str(fabric.links[17])} <= {str(link) for link in shared[0]}
    with pytest.raises(NotIncremental):
        failures(live, fabric)  # links (and a switch) that the previous fabric did not have
