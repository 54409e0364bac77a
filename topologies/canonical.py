"""A canonical labelling of a fabric: GUIDs and port numbers from the cabling alone.

Routing engines (fabriclab's and OpenSM's alike) break ties by GUID and port number: which top switch comes
first, which of two equal uplinks a switch prefers.  On an intact fat-tree every such choice is equivalent
(the fabric looks the same from every switch of a tier), so any labelling gives the same quality.  On a
damaged one it is not: two labellings of the same damaged cabling can give different max/mean loads.

`canonical_copy` gives a fabric its labels from its structure, so that every labelling of the same cabling
gets the same copy (up to the fabric's own symmetries, which cannot change a figure):

1. colour refinement (1-dimensional Weisfeiler-Leman): a node's colour is refined by the multiset of its
   neighbours' colours and the speeds of the cables to them until no colour class splits;
2. while a class of switches has more than one member, the member with the lowest original GUID is set
   apart and the colours refined again (individualisation) — members of a class that refinement cannot
   tell apart are, in trees and fat-trees, images of each other under a symmetry, so which one is picked
   changes nothing;
3. GUIDs follow the final colours; a switch's ports are numbered 1.. in the order of the nodes they lead
   to (parallel cables and the hosts of one switch are interchangeable, so their original order is kept).

Names are kept, so routes read the same.  Pure and deterministic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from topologies.checks import check_fabric
from topologies.model import Fabric, Link, Node, PortRef
from topologies.relabel import Relabelling

_U64 = np.uint64
_MASK = (1 << 64) - 1


def _mix(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: a multiset of colours summed after mixing tells multisets apart."""
    with np.errstate(over="ignore"):
        x = values + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        result: npt.NDArray[np.uint64] = x ^ (x >> _U64(31))
    return result


def _refine(
    colour: npt.NDArray[np.int64],
    src: npt.NDArray[np.intp],
    dst: npt.NDArray[np.intp],
    edge: npt.NDArray[np.uint64],
) -> npt.NDArray[np.int64]:
    """Colours refined until stable; colours are ranks of structural signatures, so the same for every
    labelling of the same cabling."""
    classes = int(np.unique(colour).size)
    while True:
        with np.errstate(over="ignore"):
            signature = _mix(colour.astype(np.uint64) * _U64(0x100000001B3))
            np.add.at(signature, src, _mix(colour[dst].astype(np.uint64) ^ edge))
        # a node's old colour leads its key, so classes only ever split and keep their relative order
        key = np.stack([colour.astype(np.uint64), signature], axis=1)
        _, refined = np.unique(key, axis=0, return_inverse=True)
        refined = refined.reshape(-1).astype(np.int64)
        count = int(refined.max(initial=-1)) + 1
        if count == classes:
            return refined
        colour, classes = refined, count


def canonical_ranks(fabric: Fabric) -> dict[str, int]:
    """Node name -> rank (0..n-1) in the canonical order (see the module docstring)."""
    names = sorted(fabric.nodes, key=lambda n: (fabric.nodes[n].guid, n))
    index = {name: i for i, name in enumerate(names)}
    src, dst, speed = [], [], []
    for link in fabric.links:
        a, b = index[link.a.node], index[link.b.node]
        code = round((link.bw_gbps or 0) * 1000) * 1_000_003 + round((link.latency_us or 0) * 1000)
        src += [a, b]
        dst += [b, a]
        speed += [code, code]
    s, d = np.array(src, dtype=np.intp), np.array(dst, dtype=np.intp)
    edge = _mix(np.array(speed, dtype=np.uint64) & _U64(_MASK))
    switch = np.array([fabric.nodes[n].is_switch for n in names], dtype=bool)
    colour = _refine(switch.astype(np.int64), s, d, edge)
    while True:
        members = np.flatnonzero(switch)
        counts = np.bincount(colour[members], minlength=int(colour.max()) + 1)
        tied = np.flatnonzero(counts > 1)
        if tied.size == 0:
            break
        cell = int(tied[0])
        chosen = int(members[colour[members] == cell].min())  # lowest original GUID: any member will do
        apart = colour * 2
        apart[chosen] += 1
        colour = _refine(apart, s, d, edge)
    # hosts still tied hang off the same switch by the same kind of cable: keep their original order
    order = np.lexsort((np.arange(len(names)), colour))
    return {names[i]: rank for rank, i in enumerate(order.tolist())}


def canonical_copy(fabric: Fabric) -> Relabelling:
    """The fabric under canonical GUIDs and port numbers (names kept), with the maps back."""
    rank = canonical_ranks(fabric)
    ends: dict[str, list[tuple[int, int]]] = {name: [] for name in fabric.nodes}
    for link in fabric.links:
        ends[link.a.node].append((rank[link.b.node], link.a.port))
        ends[link.b.node].append((rank[link.a.node], link.b.port))
    ports: dict[str, dict[int, int]] = {}
    nodes: dict[str, Node] = {}
    for name in sorted(fabric.nodes, key=rank.__getitem__):
        node = fabric.nodes[name]
        if node.is_switch:
            ports[name] = {old: new for new, (_, old) in enumerate(sorted(ends[name]), start=1)}
            width = max(len(ends[name]), 1)
        else:
            ports[name] = {p: p for _, p in ends[name]}
            width = node.ports
        guid = (rank[name] + 1) << 8  # low byte zero: host port GUIDs (node GUID + port) never collide
        nodes[name] = Node(name, node.kind, guid, width)
    oriented = []
    for link in fabric.links:
        a = PortRef(link.a.node, ports[link.a.node][link.a.port])
        b = PortRef(link.b.node, ports[link.b.node][link.b.port])
        if (rank[b.node], b.port) < (rank[a.node], a.port):
            a, b = b, a
        oriented.append(Link(a, b, link.bw_gbps, link.latency_us))
    links = sorted(oriented, key=lambda lk: (rank[lk.a.node], lk.a.port, rank[lk.b.node], lk.b.port))
    copy = Fabric(fabric.name, nodes, tuple(links))
    check_fabric(copy)
    return Relabelling(copy, {name: name for name in fabric.nodes}, ports)


__all__ = ["canonical_copy", "canonical_ranks"]
