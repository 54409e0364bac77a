"""Engines read the cabling, not the labels: arbitrary names, GUIDs and port numbers route the same way.

An imported fabric has switch names like "S-248a0703005c1e60", GUIDs in no useful order and whatever port
numbering the cabling crew used.  ftree must still find the tree and stay congestion-free.
"""

from __future__ import annotations

import random

import pytest

from controller.sm.engines import default_registry
from controller.sm.quality import quality
from controller.sm.subnet import Subnet
from controller.sm.verify import verify
from topologies.checks import check_fabric
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.model import Fabric, Link, Node, PortRef


def relabel(fabric: Fabric, seed: int) -> Fabric:
    """Same cabling; switches get random names and GUIDs, each switch's ports are renumbered at random,
    and tier/pod/rail metadata is dropped.  Hosts keep their GUIDs (so their LID order, the order of the
    shift pattern, is unchanged)."""
    rng = random.Random(seed)
    names: dict[str, str] = {}
    ports: dict[str, list[int]] = {}
    nodes: dict[str, Node] = {}
    switches = list(fabric.switches)
    rng.shuffle(switches)
    for node in switches:
        new = f"S-{rng.getrandbits(48):012x}"
        names[node.name] = new
        numbers = list(range(1, node.ports + 1))
        rng.shuffle(numbers)
        ports[node.name] = numbers
        nodes[new] = Node(new, node.kind, rng.getrandbits(60) | 1 << 60, node.ports)
    for node in fabric.hosts:
        names[node.name] = node.name
        nodes[node.name] = Node(node.name, node.kind, node.guid, node.ports)

    def end(ref: PortRef) -> PortRef:
        if ref.node in ports:
            return PortRef(names[ref.node], ports[ref.node][ref.port - 1])
        return ref

    links = tuple(Link(end(link.a), end(link.b), link.bw_gbps) for link in fabric.links)
    result = Fabric(fabric.name + "-relabelled", nodes, links)
    check_fabric(result)
    return result


@pytest.mark.parametrize(
    "fabric",
    [fat_tree(4), fat_tree(8), leaf_spine(6, 3, 6, parallel=2), rail(8, 8, groups=2)],
    ids=lambda f: f.name,
)
@pytest.mark.parametrize("seed", [1, 2])
def test_ftree_finds_the_tree_without_names_or_port_conventions(fabric: Fabric, seed: int) -> None:
    tables = default_registry().create("ftree").route(Subnet.build(relabel(fabric, seed)))
    assert verify(tables).ok
    figures = quality(tables)
    assert figures.shift is not None and figures.shift.worst_max_flows == 1
    assert all(t.max_over_mean == pytest.approx(1.0) for t in figures.all_to_all)


@pytest.mark.parametrize("engine", default_registry().names())
def test_every_engine_verifies_on_relabelled_fabrics(engine: str) -> None:
    tables = default_registry().create(engine).route(Subnet.build(relabel(fat_tree(6), 7)))
    result = verify(tables)
    assert result.ok and result.max_extra_hops == 0


def test_node_order_in_the_file_does_not_matter() -> None:
    fabric = fat_tree(4)
    reordered = Fabric(fabric.name, dict(reversed(list(fabric.nodes.items()))), tuple(reversed(fabric.links)))
    for engine in default_registry().names():
        a = default_registry().create(engine).route(Subnet.build(fabric))
        b = default_registry().create(engine).route(Subnet.build(reordered))
        assert a.digest() == b.digest(), engine
