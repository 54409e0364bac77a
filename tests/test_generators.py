"""Generators: sizes, cabling conventions, determinism, bad parameters."""

from __future__ import annotations

from collections import Counter

import pytest

from topologies.checks import check_fabric
from topologies.errors import TopologyError
from topologies.generators import fat_tree, generate, leaf_spine, rail
from topologies.model import PortRef


@pytest.mark.parametrize("k", [2, 4, 6, 8, 12])
def test_fat_tree_sizes_and_cabling(k: int) -> None:
    fabric = fat_tree(k)
    check_fabric(fabric)
    assert len(fabric.hosts) == k**3 // 4
    assert len(fabric.switches) == 5 * k * k // 4
    degree: Counter[str] = Counter()
    for link in fabric.links:
        degree[link.a.node] += 1
        degree[link.b.node] += 1
    # every switch port is cabled: full bisection
    assert all(degree[s.name] == k for s in fabric.switches)
    # edge conventions: hosts on 1..k/2, aggregation switches above
    half = k // 2
    assert fabric.peer("leaf1", 1) == PortRef("h1", 1)
    assert fabric.peer("leaf1", half + 1) == PortRef("agg1", 1)
    assert fabric.peer(f"core{half * half}", k) == PortRef(f"agg{k * half}", k)


def test_generated_names_guids_ports_are_deterministic() -> None:
    a, b = fat_tree(6), fat_tree(6)
    assert list(a.nodes) == list(b.nodes)
    assert a.nodes == b.nodes and a.links == b.links
    guids = [n.guid for n in a.nodes.values()]
    assert len(set(guids)) == len(guids)


def test_leaf_spine_oversubscription_and_parallel_links() -> None:
    fabric = leaf_spine(leaves=4, spines=2, hosts_per_leaf=8, parallel=2)
    check_fabric(fabric)
    assert fabric.meta["oversubscription"] == 2.0
    between = Counter(
        (link.a.node, link.b.node)
        for link in fabric.links
        if link.a.node.startswith("leaf") and link.b.node.startswith("spine")
    )
    assert set(between.values()) == {2}
    assert len(between) == 8


def test_rail_fabric_puts_nic_i_of_every_server_on_rail_leaf_i() -> None:
    fabric = rail(servers=4, gpus=8, groups=2)
    check_fabric(fabric)
    assert len(fabric.hosts) == 64
    assert len(fabric.switches) == 16 + 4
    for host in fabric.hosts:
        ((_, link),) = list(fabric.links_of(host.name))
        leaf = fabric.nodes[link.other(link.a if link.a.node == host.name else link.b).node]
        assert leaf.rail == host.rail and leaf.group == host.group
    # the 8 NICs of one server are on 8 different leaves
    srv1 = [h for h in fabric.hosts if h.server == "srv1"]
    leaves = {fabric.peer(h.name, 1).node for h in srv1}  # type: ignore[union-attr]
    assert len(srv1) == 8 and len(leaves) == 8


@pytest.mark.parametrize(
    ("kind", "params", "field", "text"),
    [
        ("fat-tree", {"k": 5}, "generator.k", "even integer"),
        ("fat-tree", {"k": 0}, "generator.k", "even integer"),
        ("fat-tree", {"k": 256}, "generator", "at most 254"),
        (
            "leaf-spine",
            {"leaves": 2, "spines": 0, "hosts_per_leaf": 2},
            "generator.spines",
            "spines must be >= 1",
        ),
        ("rail", {"servers": 6, "parallel": 4}, "generator.parallel", "does not divide"),
        ("hypercube", {}, "generator.kind", "unknown generator"),
    ],
)
def test_impossible_parameters_are_rejected(kind: str, params: dict[str, int], field: str, text: str) -> None:
    with pytest.raises(TopologyError) as info:
        generate(kind, **params)
    assert info.value.field == field
    assert text in str(info.value)
