"""Relabelled copies of a fabric: the same cabling under other names, GUIDs, port numbers and orders.

A routing engine that reads the structure of a fabric must give the same quality whatever the labels; one
that leans on a generator's conventions (port numbering, GUID order, names) does not.  `relabel` produces
the copies that tell the two apart, together with the maps back to the original so routes can be compared
entry by entry:

* `ports`: each switch's cabled ports get new numbers — `"shuffle"` (any order, spread over a switch that may
  have more ports than before), `"monotone"` (new numbers in the same order, with gaps) or `"keep"`;
* `guids`: new node GUIDs — `"shuffle"` (random order), `"monotone"` (random values in the same order) or
  `"keep"`; the low byte stays zero so host port GUIDs (node GUID + port) never collide;
* `names`: anonymised, `S-<guid>` / `H-<guid>` as ibnetdiscover prints unnamed nodes;
* `order`: node order and cable order in the file shuffled, each cable's two ends swapped at random.

Placement metadata (tier, pod, rail, server, ...) is dropped, as an imported fabric has none.  Everything is
a function of the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from topologies.checks import check_fabric
from topologies.model import MAX_PORTS, Fabric, Link, Node, PortRef

Mode = Literal["shuffle", "monotone", "keep"]


@dataclass(frozen=True)
class Relabelling:
    fabric: Fabric
    #: original node name -> new name
    names: dict[str, str]
    #: original node name -> {original port -> new port}
    ports: dict[str, dict[int, int]]

    def port(self, node: str, port: int) -> PortRef:
        """Where an original (node, port) is in the relabelled fabric."""
        return PortRef(self.names[node], self.ports[node].get(port, port))


def _new_ports(rng: random.Random, ports: int, cabled: list[int], mode: Mode) -> tuple[dict[int, int], int]:
    if mode == "keep" or not cabled:
        return {p: p for p in cabled}, ports
    width = min(MAX_PORTS, max(ports, len(cabled) + rng.randint(0, len(cabled))))
    numbers = sorted(rng.sample(range(1, width + 1), len(cabled)))
    if mode == "shuffle":
        rng.shuffle(numbers)
    return dict(zip(sorted(cabled), numbers, strict=True)), width


def _new_guids(rng: random.Random, nodes: list[Node], mode: Mode) -> dict[str, int]:
    if mode == "keep":
        return {n.name: n.guid for n in nodes}
    values: set[int] = set()
    while len(values) < len(nodes):
        values.add(rng.getrandbits(56) << 8 | 0)
    fresh = sorted(values)
    if mode == "shuffle":
        rng.shuffle(fresh)
    by_old = sorted(nodes, key=lambda n: n.guid)
    return {n.name: g for n, g in zip(by_old, fresh, strict=True)}


def relabel(
    fabric: Fabric,
    seed: int,
    *,
    ports: Mode = "shuffle",
    guids: Mode = "shuffle",
    names: bool = True,
    order: bool = True,
) -> Relabelling:
    rng = random.Random(seed)
    cabled: dict[str, list[int]] = {name: [] for name in fabric.nodes}
    for link in fabric.links:
        cabled[link.a.node].append(link.a.port)
        cabled[link.b.node].append(link.b.port)
    guid_of = _new_guids(rng, list(fabric.nodes.values()), guids)
    port_map: dict[str, dict[int, int]] = {}
    new_nodes: dict[str, Node] = {}
    name_map: dict[str, str] = {}
    for node in fabric.nodes.values():
        mode: Mode = ports if node.is_switch else "keep"
        mapping, width = _new_ports(rng, node.ports, cabled[node.name], mode)
        port_map[node.name] = mapping
        guid = guid_of[node.name]
        new = (f"S-{guid:016x}" if node.is_switch else f"H-{guid:016x}") if names else node.name
        name_map[node.name] = new
        new_nodes[new] = Node(new, node.kind, guid, width)
    items = list(new_nodes.items())
    links = [
        Link(
            PortRef(name_map[link.a.node], port_map[link.a.node][link.a.port]),
            PortRef(name_map[link.b.node], port_map[link.b.node][link.b.port]),
            link.bw_gbps,
            link.latency_us,
        )
        for link in fabric.links
    ]
    if order:
        rng.shuffle(items)
        rng.shuffle(links)
        links = [
            Link(link.b, link.a, link.bw_gbps, link.latency_us) if rng.random() < 0.5 else link
            for link in links
        ]
    result = Fabric(f"{fabric.name}-relabelled-{seed}", dict(items), tuple(links))
    check_fabric(result)
    return Relabelling(result, name_map, port_map)


__all__ = ["Mode", "Relabelling", "relabel"]
