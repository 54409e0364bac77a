"""Invariants every engine must keep, checked on many generated and degraded fabrics.

Exact tables are not asserted (engines may change their tie-breaking); what a fabric operator relies on is:
every host reaches every other, tables have no loops or dead ends, engines that promise deadlock freedom
deliver it, the alternatives behind each entry are genuine equal-cost choices, and the balance promises hold.
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.sm.engines import default_registry
from controller.sm.paths import hop_distances
from controller.sm.quality import quality
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from tests.conftest import degraded_fabrics, full_bisection_fabrics, pristine_fabrics
from topologies.model import Fabric

ENGINES = default_registry().names()
PRISTINE = pristine_fabrics()
DEGRADED = degraded_fabrics()


def _route(fabric: Fabric, engine: str) -> RoutingTables:
    return default_registry().create(engine).route(Subnet.build(fabric))


def _assert_alternatives_are_consistent(tables: RoutingTables) -> None:
    """The chosen port is among the alternatives; every alternative leads to a switch that is itself routed
    (so multipath never black-holes); shortest-path engines' alternatives all shorten the distance."""
    subnet = tables.subnet
    dist = hop_distances(subnet).astype(np.int64)
    shortest_engine = tables.engine in ("minhop", "sssp")
    for lid, target in zip(subnet.dest_lids.tolist(), subnet.dest_switch.tolist(), strict=True):
        for s in range(subnet.n_switches):
            if s == target:
                continue
            chosen = int(tables.lft[s, lid])
            options = tables.alternatives(s, lid)
            assert chosen in options, (subnet.switch_names[s], lid, chosen, options)
            for port in options:
                far = int(subnet.nbr[s, port])
                assert far >= 0
                assert tables.lft[far, lid] != NO_PORT
                if shortest_engine:
                    assert dist[far, target] == dist[s, target] - 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fabric", PRISTINE, ids=lambda f: f.name)
def test_pristine_fabrics_route_completely_and_deadlock_free(fabric: Fabric, engine: str) -> None:
    tables = _route(fabric, engine)
    result = verify(tables)
    assert result.unreachable_pairs == 0
    assert result.loop_entries == 0 and result.dead_entries == 0
    # on trees, shortest paths are up*/down* paths, so every engine is deadlock-free with one VL
    assert result.deadlock is not None
    assert result.deadlock.acyclic, result.deadlock.cycles
    assert result.max_extra_hops == 0, "tree routes must be shortest"
    _assert_alternatives_are_consistent(tables)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("fabric", "case"), DEGRADED, ids=[case for _, case in DEGRADED])
def test_degraded_fabrics_stay_fully_reachable(fabric: Fabric, case: str, engine: str) -> None:
    tables = _route(fabric, engine)
    result = verify(tables)
    assert result.unreachable_pairs == 0, case
    assert result.loop_entries == 0 and result.dead_entries == 0, case
    if engine in ("updn", "ftree"):
        assert result.deadlock is not None
        assert result.deadlock.acyclic, (case, result.deadlock.cycles)
    _assert_alternatives_are_consistent(tables)


FULL_BISECTION = full_bisection_fabrics()


@pytest.mark.parametrize("fabric", FULL_BISECTION, ids=lambda f: f.name)
def test_ftree_is_shift_congestion_free_and_perfectly_balanced(fabric: Fabric) -> None:
    figures = quality(_route(fabric, "ftree"))
    assert figures.shift is not None
    assert figures.shift.worst_max_flows == 1, figures.shift
    assert figures.shift.shifts_evaluated == len(fabric.hosts) - 1
    for tier in figures.all_to_all:
        assert tier.max_over_mean == pytest.approx(1.0), tier


def test_ftree_on_oversubscribed_leaf_spine_shares_uplinks_evenly() -> None:
    fabric = next(f for f in PRISTINE if f.meta.get("oversubscription") == 2.0)
    figures = quality(_route(fabric, "ftree"))
    assert figures.shift is not None and figures.shift.worst_max_flows == 2  # 16 hosts over 8 uplinks
    assert all(t.max_over_mean == pytest.approx(1.0) for t in figures.all_to_all)


@pytest.mark.parametrize(
    "fabric", [f for f in PRISTINE if f.name.startswith("fat-tree")], ids=lambda f: f.name
)
def test_sssp_balances_fat_trees(fabric: Fabric) -> None:
    figures = quality(_route(fabric, "sssp"))
    assert figures.switch_links.max_over_mean <= 1.10
    assert all(t.max_over_mean <= 1.05 for t in figures.all_to_all)


@pytest.mark.parametrize("fabric", [f for f in PRISTINE if f.name.startswith("rail")], ids=lambda f: f.name)
def test_sssp_balances_rail_fabrics_where_minhop_does_not(fabric: Fabric) -> None:
    sssp = quality(_route(fabric, "sssp"), shifts=False).switch_links.max_over_mean
    minhop = quality(_route(fabric, "minhop"), shifts=False).switch_links.max_over_mean
    assert sssp <= 1.10
    assert sssp <= minhop


def test_degraded_ftree_moves_only_routes_that_used_the_failed_link() -> None:
    """A failure must not reshuffle the fabric: entries toward hosts that did not cross the dead link stay."""
    from topologies.generators import fat_tree

    fabric = fat_tree(8)
    intact = _route(fabric, "ftree")
    index = next(i for i, link in enumerate(fabric.links) if str(link) == "agg1:5--core1:1")
    broken = _route(fabric.without(links=[index]), "ftree")
    subnet = intact.subnet
    host_lids = subnet.ep_lids
    same = intact.lft[:, host_lids] == broken.lft[:, host_lids]
    changed = int((~same).sum())
    assert 0 < changed <= 0.02 * same.size, changed
    assert verify(broken).ok


@pytest.mark.parametrize("engine", ENGINES)
def test_ftree_and_others_are_deterministic(engine: str) -> None:
    fabric = PRISTINE[3]
    assert _route(fabric, engine).digest() == _route(fabric, engine).digest()
