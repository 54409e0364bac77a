"""ftree on damaged fat-trees (issue: after a core or aggregation switch is lost the traffic that used it must
spread over the survivors, not fold onto one link), and relabelling invariance of every damaged figure.

Fabrics: OpenSM's own k=16 (ibnetdiscover, read through the importer) and fabriclab's; damage named by tier
(`core:1`, `agg:1`), so the same damage on any labelling.  Balance: all-to-all flows per switch-to-switch
link, max over mean; the worst shift (CA order) is the most flows one link carries in any shift permutation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.sm.engines import default_registry
from controller.sm.engines.ftree import designed_uplinks
from controller.sm.incremental import reroute
from controller.sm.quality import quality
from controller.sm.report import build_report, render_report
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from tests.conftest import DATA
from tests.test_relabelling_properties import _figures, _round_trip
from topologies.faults import SwitchFailures, degrade
from topologies.generators import fat_tree, opensm_fat_tree
from topologies.ibnet import load_ibnet
from topologies.model import Fabric
from topologies.relabel import relabel


def _route(fabric: Fabric, engine: str = "ftree") -> RoutingTables:
    return default_registry().create(engine).route(Subnet.build(fabric))


@pytest.fixture(scope="module")
def opensm_k16() -> Fabric:
    return load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz")


@pytest.mark.parametrize("spec", ["core:1", "agg:1", "core:2"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_lost_switch_spreads_over_the_survivors_on_opensms_k16(
    opensm_k16: Fabric, spec: str, seed: int
) -> None:
    """One core gone: 7 of a group's 8 cores carry its traffic, 8/7 = 1.14 at best (was 1.928: the digit
    taken modulo the 7 uplinks left folded two onto one link).  Target <= 1.25, worst shift <= 2."""
    damaged = degrade(opensm_k16, fail_switches=SwitchFailures.parse(spec), seed=seed)
    tables = _route(damaged.fabric)
    result = verify(tables, vls=1)
    assert result.ok and result.unreachable_pairs == 0 and result.deadlock is not None
    assert result.deadlock.acyclic  # one VL
    figures = quality(tables)
    assert figures.switch_links.max_over_mean <= 1.25, (spec, seed, figures.switch_links.max_over_mean)
    assert figures.shift is not None and figures.shift.worst_max_flows <= (2 if spec != "agg:2" else 3)
    repair = tables.info["repair"]
    assert (
        isinstance(repair, dict) and repair["switches_short_of_uplinks"] > 0 and repair["entries_moved"] > 0
    )


def test_the_old_fold_is_gone_and_sssp_is_beaten(opensm_k16: Fabric) -> None:
    """The same damage through sssp (shortest paths, balanced greedily) for scale: ftree must do better."""
    damaged = degrade(opensm_k16, fail_switches=SwitchFailures.parse("core:1"), seed=1).fabric
    ftree, sssp = quality(_route(damaged)), quality(_route(damaged, "sssp"))
    assert ftree.switch_links.max_over_mean < 1.2
    assert sssp.switch_links.max_over_mean > 1.8


@pytest.mark.parametrize("seed", range(1, 11))
def test_five_percent_of_cables_cut_is_rebalanced_below_shortest_paths(opensm_k16: Fabric, seed: int) -> None:
    """5 % of OpenSM's k=16 cables cut (102 of 2,048): ftree's repairs are rebalanced by load and end at or
    below fabriclab's sssp on the same file, every pair reachable, deadlock-free on one VL.  Before the
    rebalancing ftree was above sssp on seeds 5 and 6 (1.985 vs 1.908, 1.970 vs 1.893) and at 1.78-1.99
    on the others; now 1.32-1.57 where sssp gives 1.85-1.95."""
    damaged = degrade(opensm_k16, fail_links=102, seed=seed).fabric
    tables = _route(damaged)
    result = verify(tables, vls=1)
    assert result.ok and result.unreachable_pairs == 0 and result.deadlock is not None
    assert result.deadlock.acyclic
    repair = tables.info["repair"]
    assert isinstance(repair, dict) and isinstance(repair["entries_rebalanced_by_load"], int)
    assert repair["entries_rebalanced_by_load"] > 0
    assert repair["switches_that_lost_an_uplink_of_their_own"] > 3
    ftree = quality(tables, shifts=False).switch_links.max_over_mean
    sssp = quality(_route(damaged, "sssp"), shifts=False).switch_links.max_over_mean
    assert ftree <= sssp, (seed, ftree, sssp)
    assert ftree <= 1.6, (seed, ftree)


def test_a_few_cut_cables_keep_the_formulas_repair() -> None:
    """Up to three switches with a lost uplink of their own: no rebalancing (a cut stays an incremental,
    cheap reroute); the fourth engages it."""
    base = opensm_fat_tree(8)
    ups = [i for i, link in enumerate(base.links) if {link.a.node[:3], link.b.node[:3]} == {"agg", "cor"}]
    cut_switches: list[str] = []
    chosen: list[int] = []
    for i in ups:  # one uplink each of four different aggregation switches
        link = base.links[i]
        agg = link.a.node if link.a.node.startswith("agg") else link.b.node
        if agg not in cut_switches:
            cut_switches.append(agg)
            chosen.append(i)
    for cuts, wide in ((1, False), (3, False), (4, True)):
        tables = _route(base.without(links=chosen[:cuts]))
        repair = tables.info["repair"]
        assert isinstance(repair, dict) and repair["switches_that_lost_an_uplink_of_their_own"] == cuts
        assert isinstance(repair["entries_rebalanced_by_load"], int) is wide, (cuts, repair)
        text = render_report(build_report(tables, verify(tables), None, 0.0))
        assert ("chosen again by measured load" in text) is wide, text


def test_a_cut_on_a_widely_damaged_fabric_reroutes_as_a_full_recomputation(opensm_k16: Fabric) -> None:
    """The rebalancing weighs every destination's flows, so a routing of some destinations must give the
    same columns as a full one: the incremental reroute after one more cut takes exactly the full
    recomputation's columns for every affected destination."""
    engine = default_registry().create("ftree")
    damaged = degrade(opensm_k16, fail_links=102, seed=3).fabric
    previous = engine.route(Subnet.build(damaged))
    used = previous.lft[:, previous.subnet.dest_lids]
    # one more cable: the first aggregation-core cable that carries routes
    index = next(
        i
        for i, link in enumerate(damaged.links)
        if {link.a.node[:3], link.b.node[:3]} == {"agg", "cor"}
        and (used[previous.subnet.switch_index[link.a.node]] == link.a.port).any()
    )
    step = reroute(previous, damaged.without(links=[index]), engine)
    full = engine.route(step.tables.subnet)
    affected = np.array(sorted(step.affected_lids), dtype=np.intp)
    assert affected.size > 0
    repair = full.info["repair"]
    assert isinstance(repair, dict) and isinstance(repair["entries_rebalanced_by_load"], int)
    assert np.array_equal(step.tables.lft[:, affected], full.lft[:, affected])
    assert verify(step.tables, vls=1).ok


def test_an_intact_fabric_has_no_repair_and_every_tier_its_own_count() -> None:
    for fabric in (fat_tree(8), opensm_fat_tree(8)):
        tables = _route(fabric)
        assert "repair" not in tables.info
    n_up = np.array([4, 4, 4, 3, 8, 8, 2, 2], dtype=np.int64)
    rank = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    # tier 0: 3 of 4 have 4 -> the one with 3 lost one; tier 1: uniform; tier 2 uniform
    assert designed_uplinks(n_up, rank).tolist() == [4, 4, 4, 4, 8, 8, 2, 2]
    uneven = np.array([4, 4, 2, 2], dtype=np.int64)  # a tier built uneven is taken as it is
    assert designed_uplinks(uneven, np.zeros(4, dtype=np.int64)).tolist() == [4, 4, 2, 2]
    # more than half keep the common count: the others lost uplinks (5 % of k=16's cables cut leaves ~60 %
    # of the aggregation switches whole; a 3/4 threshold took the rest as built with fewer)
    damaged = np.array([8, 8, 8, 7, 6], dtype=np.int64)
    assert designed_uplinks(damaged, np.zeros(5, dtype=np.int64)).tolist() == [8] * 5


DAMAGE = st.sampled_from(["core:1", "agg:1", "links:3", "links:8", "core:1,agg:1"])


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    k=st.sampled_from([4, 8]),
    layout=st.sampled_from(["fabriclab", "opensm"]),
    damage=DAMAGE,
    seed=st.integers(0, 2**31),
    engine=st.sampled_from(["ftree", "sssp", "dfsssp"]),
)
def test_an_order_preserving_relabelling_of_a_damaged_fabric_changes_no_figure(
    k: int, layout: str, damage: str, seed: int, engine: str
) -> None:
    """Damage first, then relabel keeping the order of GUIDs and of each switch's ports (new values, new
    names, shuffled file order) and go through ibnet export and import: every figure of ftree, sssp and
    dfsssp is the same.  (An arbitrary relabelling does change figures on a damaged fabric — engines break
    ties by GUID, and damage breaks the symmetry that makes that harmless on an intact one: measured in
    docs/routing.md.)"""
    base = fat_tree(k) if layout == "fabriclab" else opensm_fat_tree(k)
    if damage.startswith("links:"):
        damaged = degrade(base, fail_links=int(damage[6:]), seed=seed % 1000).fabric
    else:
        damaged = degrade(base, fail_switches=SwitchFailures.parse(damage), seed=seed % 1000).fabric
    original = _figures(_route(damaged, engine))
    assert original["ok"] and original["unreachable"] == 0
    foreign = _round_trip(relabel(damaged, seed, ports="monotone", guids="monotone").fabric)
    assert _figures(_route(foreign, engine)) == original
