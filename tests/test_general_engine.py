"""The balanced general engine (sssp, dfsssp) on fat-trees and on fabrics that are not trees, and ftree's
refusal of the latter.

* On 3-tier fat-trees — fabriclab's layout, OpenSM's, relabelled — sssp keeps all-to-all max/mean within
  1.10 (OpenSM's sssp: 1.79-1.83 on k=24) and dfsssp needs one virtual lane.
* On a 2-D torus, a dragonfly and a random regular graph shortest paths close dependency cycles; dfsssp
  spreads routes over virtual lanes until every lane is acyclic, reports how many, and verification checks
  each lane (a wrong lane assignment is caught).
* ftree says why a fabric is not a tree, in one line, and suggests the general engines.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.sm.engines import EngineNotApplicable, default_registry, select_engine
from controller.sm.quality import quality
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from topologies.direct import dragonfly, random_regular, torus
from topologies.errors import InputError
from topologies.generators import fat_tree, leaf_spine, opensm_fat_tree
from topologies.model import Fabric, Link, Node, NodeKind, PortRef, make_guid
from topologies.relabel import relabel


def _route(fabric: Fabric, engine: str) -> RoutingTables:
    return default_registry().create(engine).route(Subnet.build(fabric))


FAT_TREES = [fat_tree(8), opensm_fat_tree(8), opensm_fat_tree(12), relabel(fat_tree(8), 5).fabric]


@pytest.mark.parametrize("fabric", FAT_TREES, ids=lambda f: f.name)
@pytest.mark.parametrize("engine", ["sssp", "dfsssp"])
def test_general_engine_balances_three_tier_fat_trees(fabric: Fabric, engine: str) -> None:
    tables = _route(fabric, engine)
    result = verify(tables)
    assert result.ok and result.max_extra_hops == 0
    figures = quality(tables, shifts=False)
    assert figures.switch_links.max_over_mean <= 1.10
    assert all(t.max_over_mean <= 1.05 for t in figures.all_to_all)
    if engine == "dfsssp":
        assert tables.info["layers"] == 1
        assert tables.layers is not None and not tables.layers.any()


DIRECT = [
    torus(6, 6, hosts_per_switch=2),
    torus(5, 4),
    dragonfly(9, 4, 2, hosts_per_switch=2),
    random_regular(32, 4, hosts_per_switch=2, seed=1),
    random_regular(24, 5, hosts_per_switch=1, seed=7),
]


@pytest.mark.parametrize("fabric", DIRECT, ids=lambda f: f.name)
def test_dfsssp_makes_direct_networks_deadlock_free_with_layers(fabric: Fabric) -> None:
    sssp = _route(fabric, "sssp")
    plain = verify(sssp)
    assert plain.unreachable_pairs == 0 and plain.loop_entries == 0
    assert plain.deadlock is not None and not plain.deadlock.acyclic  # shortest paths close cycles here

    tables = _route(fabric, "dfsssp")
    assert np.array_equal(tables.lft, sssp.lft)  # same routes, now with lanes
    result = verify(tables)
    assert result.ok, result.deadlock
    assert result.max_extra_hops == 0
    assert result.deadlock is not None and result.deadlock.acyclic
    layers = int(tables.info["layers"])
    assert 2 <= layers <= 8
    assert result.deadlock.layers_used == layers
    assert tables.layers is not None
    leaves = np.flatnonzero(tables.subnet.has_hosts)
    used = np.unique(tables.layers[np.ix_(leaves, tables.subnet.ep_lids)])
    assert used.tolist() == list(range(layers))


@pytest.mark.parametrize("fabric", DIRECT[:3], ids=lambda f: f.name)
def test_verification_checks_each_lane(fabric: Fabric) -> None:
    tables = _route(fabric, "dfsssp")
    assert tables.layers is not None
    collapsed = replace(tables, layers=np.zeros_like(tables.layers))
    result = verify(collapsed)
    assert result.deadlock is not None and not result.deadlock.acyclic and result.deadlock.cycles
    assert not result.ok
    # moving one lane's routes into another must break it too
    merged = tables.layers.copy()
    merged[merged == 1] = 0
    assert not verify(replace(tables, layers=merged)).ok


@pytest.mark.parametrize("fabric", DIRECT, ids=lambda f: f.name)
def test_general_engine_balances_better_than_minhop(fabric: Fabric) -> None:
    ours = quality(_route(fabric, "dfsssp"), shifts=False).switch_links.max_over_mean
    minhop = quality(_route(fabric, "minhop"), shifts=False).switch_links.max_over_mean
    assert ours <= minhop + 1e-9


def _with_extra_link(fabric: Fabric, a: str, b: str) -> Fabric:
    """The fabric plus a cable between two switches, on a new port of each."""
    nodes = dict(fabric.nodes)
    pa, pb = nodes[a].ports + 1, nodes[b].ports + 1
    nodes[a], nodes[b] = replace(nodes[a], ports=pa), replace(nodes[b], ports=pb)
    return replace(fabric, nodes=nodes, links=(*fabric.links, Link(PortRef(a, pa), PortRef(b, pb), 400.0)))


def _host_on(fabric: Fabric, switch: str) -> Fabric:
    nodes = dict(fabric.nodes)
    port = nodes[switch].ports + 1
    nodes[switch] = replace(nodes[switch], ports=port)
    nodes["stray"] = Node("stray", NodeKind.HOST, make_guid(NodeKind.HOST, 9999), 1)
    return replace(
        fabric, nodes=nodes, links=(*fabric.links, Link(PortRef("stray", 1), PortRef(switch, port), 400.0))
    )


def _unequal_tiers() -> Fabric:
    """Two leaves under one spine, one of them a level lower (behind an extra switch)."""
    nodes = {
        "h1": Node("h1", NodeKind.HOST, make_guid(NodeKind.HOST, 0), 1),
        "h2": Node("h2", NodeKind.HOST, make_guid(NodeKind.HOST, 1), 1),
    }
    for i, name in enumerate(("spine", "mid", "leaf1", "leaf2")):
        nodes[name] = Node(name, NodeKind.SWITCH, make_guid(NodeKind.SWITCH, i), 4)
    links = (
        Link(PortRef("h1", 1), PortRef("leaf1", 1), 400.0),
        Link(PortRef("h2", 1), PortRef("leaf2", 1), 400.0),
        Link(PortRef("leaf1", 2), PortRef("spine", 1), 400.0),
        Link(PortRef("leaf2", 2), PortRef("mid", 1), 400.0),
        Link(PortRef("mid", 2), PortRef("spine", 2), 400.0),
    )
    return Fabric("unequal", nodes, links)


@pytest.mark.parametrize(
    ("fabric", "reason"),
    [
        (
            _with_extra_link(fat_tree(4), "leaf1", "leaf3"),
            "leaf1:5--leaf3:5 is a cable between two switches with hosts",
        ),
        (
            _host_on(leaf_spine(4, 2, 2), "spine1"),
            "host stray is on switch spine1, which is cabled to 4 other",
        ),
        (_unequal_tiers(), "unequal tiers"),
        (
            _with_extra_link(fat_tree(4), "agg1", "agg3"),
            "agg1:5--agg3:5 connects two switches of the same tier",
        ),
        (torus(4, 4), "hosts must all hang off the bottom tier"),
    ],
    ids=["leaf-leaf", "host-on-spine", "unequal-tiers", "cross-link", "torus"],
)
def test_ftree_names_why_a_fabric_is_not_a_tree(fabric: Fabric, reason: str) -> None:
    subnet = Subnet.build(fabric)
    registry = default_registry()
    with pytest.raises(EngineNotApplicable) as caught:
        select_engine(registry, "ftree", subnet)
    message = str(caught.value)
    assert isinstance(caught.value, InputError) and "\n" not in message
    assert message.startswith("engine: ftree cannot route this fabric: not a fat-tree: ")
    assert reason in message
    assert "use --engine sssp or dfsssp (any topology), or --fallback sssp" in message
    engine, note = select_engine(registry, "ftree", subnet, fallback="dfsssp")
    assert engine.name == "dfsssp" and note is not None and "falling back to dfsssp" in note
    assert verify(engine.route(subnet)).unreachable_pairs == 0


@pytest.mark.parametrize(
    "fabric",
    [fat_tree(4), opensm_fat_tree(6), leaf_spine(5, 2, 3, parallel=3), relabel(fat_tree(6), 2).fabric],
    ids=lambda f: f.name,
)
def test_trees_and_degraded_trees_are_trees(fabric: Fabric) -> None:
    from topologies.faults import degrade

    ftree = default_registry().create("ftree")
    assert ftree.problem(Subnet.build(fabric)) is None
    for seed in range(5):
        broken = degrade(fabric, fail_links=1 + 2 * seed, fail_switches=seed % 2, seed=seed).fabric
        assert ftree.problem(Subnet.build(broken)) is None, seed


def test_subnet_manager_falls_back_like_opensm() -> None:
    from controller.sm.manager import SubnetManager

    lenient = SubnetManager(torus(4, 4), engine="ftree").recompute()
    assert lenient.tables.engine == "ftree" and lenient.fallback is None  # single root, still routes
    manager = SubnetManager(torus(4, 4), engine="ftree", fallback="dfsssp")
    computation = manager.recompute()
    assert computation.engine == "ftree" and computation.tables.engine == "dfsssp"
    assert computation.fallback is not None and "falling back to dfsssp" in computation.fallback
    assert computation.verification.ok
    tree = SubnetManager(fat_tree(4), engine="ftree", fallback="dfsssp").recompute()
    assert tree.tables.engine == "ftree" and tree.fallback is None
