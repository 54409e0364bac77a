"""The fabric model: one description of a cluster network, realised by every other part of fabriclab.

Routing engines, the Mininet realisation, the fake switches of the unit tests and the flow-level simulator all
read this model, so it stays small and neutral: nodes (hosts and switches) with stable GUIDs and numbered
ports, and links between ports with a bandwidth and an optional latency.  Placement metadata (tier, pod, rail,
group, server) is carried for humans, reports and traffic mapping only; routing engines must never depend on
it, because an imported fabric does not have it.

A `Fabric` is immutable once built: changes (a failed link, a removed switch) produce a new fabric, so a
routing result can always say exactly which fabric it was computed for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx

#: Largest port number a switch may have.  InfiniBand switches have at most 254 external ports and linear
#: forwarding tables store ports in one byte (255 means "no route"); fabriclab keeps the same limit so that
#: tables fit in uint8 arrays and can be written in OpenSM's formats.
MAX_PORTS = 254

#: Organisationally-unique prefix of GUIDs that fabriclab invents (0x02 = locally administered EUI-64).
GUID_PREFIX = 0x02FAB1 << 40
GUID_KIND_HOST = 0x01
GUID_KIND_SWITCH = 0x02


class NodeKind(StrEnum):
    HOST = "host"
    SWITCH = "switch"


def make_guid(kind: NodeKind, index: int) -> int:
    """GUID for the index-th generated node of a kind: prefix | kind | index | 00.

    The low byte is left zero so that a host's port GUIDs (node GUID + port number, as ibsim and most HCAs
    do) never collide with another node's GUID.
    """
    if not 0 <= index < 1 << 24:
        raise ValueError(f"node index {index} out of range for a generated GUID")
    code = GUID_KIND_HOST if kind is NodeKind.HOST else GUID_KIND_SWITCH
    return GUID_PREFIX | (code << 32) | (index << 8)


def guid_from_name(name: str) -> int:
    """Stable GUID for a hand-written node without one: a hash of its name, so adding or reordering other
    nodes in a file never changes it.  Collisions are possible in principle and are rejected by validation."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return GUID_PREFIX | (0x80 << 32) | (digest << 8)


@dataclass(frozen=True, slots=True)
class Node:
    """A host (one network adapter, an InfiniBand CA) or a switch."""

    name: str
    kind: NodeKind
    guid: int
    ports: int
    tier: int | None = None
    pod: int | None = None
    rail: int | None = None
    group: int | None = None
    server: str | None = None
    description: str | None = None
    system_guid: int | None = None
    vendor_id: int = 0
    device_id: int = 0
    revision: int = 0
    #: Explicit port GUIDs (port number -> GUID), e.g. from ibnetdiscover; others follow `port_guid()`'s rule.
    port_guids: tuple[tuple[int, int], ...] = ()

    @property
    def is_switch(self) -> bool:
        return self.kind is NodeKind.SWITCH

    @property
    def is_host(self) -> bool:
        return self.kind is NodeKind.HOST

    @property
    def node_description(self) -> str:
        """What InfiniBand calls NodeDescription: what tools print for this node."""
        return self.description if self.description is not None else self.name

    def port_guid(self, port: int) -> int:
        """GUID of a port: switches have one (port 0's, equal to the node GUID); CA ports each have their own,
        node GUID + port number unless given explicitly."""
        for number, guid in self.port_guids:
            if number == port:
                return guid
        if self.is_switch:
            return self.guid
        return self.guid + port


@dataclass(frozen=True, slots=True, order=True)
class PortRef:
    node: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


@dataclass(frozen=True, slots=True)
class Link:
    """A cable between two ports.  Bandwidth is the nominal signalling rate of one direction."""

    a: PortRef
    b: PortRef
    bw_gbps: float
    latency_us: float | None = None

    def other(self, end: PortRef) -> PortRef:
        if end == self.a:
            return self.b
        if end == self.b:
            return self.a
        raise KeyError(f"{end} is not an end of link {self.a}--{self.b}")

    def __str__(self) -> str:
        return f"{self.a}--{self.b}"


@dataclass(frozen=True)
class Fabric:
    """A whole fabric.  Node order is significant only for output (files are written in the order read)."""

    name: str
    nodes: Mapping[str, Node]
    links: tuple[Link, ...]
    description: str | None = None
    #: Free-form provenance, e.g. {"generator": {...}} for generated fabrics.  Never read by engines.
    meta: Mapping[str, Any] = field(default_factory=dict)

    # --- derived views (computed once; the fabric is immutable) -------------------------------------------

    @cached_property
    def switches(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes.values() if n.is_switch)

    @cached_property
    def hosts(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes.values() if n.is_host)

    def hosts_names(self) -> list[str]:
        return [n.name for n in self.hosts]

    @cached_property
    def port_map(self) -> Mapping[PortRef, tuple[int, PortRef]]:
        """(node, port) -> (link index, far end).  Assumes a valid fabric (each port used once)."""
        result: dict[PortRef, tuple[int, PortRef]] = {}
        for index, link in enumerate(self.links):
            result[link.a] = (index, link.b)
            result[link.b] = (index, link.a)
        return result

    def peer(self, node: str, port: int) -> PortRef | None:
        entry = self.port_map.get(PortRef(node, port))
        return entry[1] if entry else None

    def links_of(self, node: str) -> Iterator[tuple[int, Link]]:
        for index, link in enumerate(self.links):
            if node in (link.a.node, link.b.node):
                yield index, link

    @cached_property
    def graph(self) -> nx.MultiGraph:
        """The fabric as a networkx MultiGraph: node attributes are the `Node`, edges are keyed by link index
        and carry ports and bandwidth.  Parallel cables stay distinct edges."""
        import networkx as nx  # noqa: PLC0415 - 0.2 s to import; only some callers need the graph

        graph = nx.MultiGraph(name=self.name)
        for node in self.nodes.values():
            graph.add_node(node.name, node=node, kind=node.kind.value)
        for index, link in enumerate(self.links):
            graph.add_edge(
                link.a.node,
                link.b.node,
                key=index,
                ports={link.a.node: link.a.port, link.b.node: link.b.port}
                if link.a.node != link.b.node
                else {},
                bw_gbps=link.bw_gbps,
                latency_us=link.latency_us,
            )
        return graph

    def summary(self) -> str:
        switch_links = sum(
            1
            for link in self.links
            if self.nodes[link.a.node].is_switch and self.nodes[link.b.node].is_switch
        )
        return (
            f"{self.name}: {len(self.switches)} switches, {len(self.hosts)} hosts, "
            f"{len(self.links)} links ({switch_links} between switches)"
        )

    # --- derived fabrics ----------------------------------------------------------------------------------

    def without(self, links: Iterable[int] = (), nodes: Iterable[str] = ()) -> Fabric:
        """A copy with some links (by index) and nodes (with their links) removed: failures, maintenance."""
        drop_nodes = set(nodes)
        drop_links = set(links)
        unknown = drop_nodes - set(self.nodes)
        if unknown:
            raise KeyError(f"unknown node(s): {', '.join(sorted(unknown))}")
        kept_links = tuple(
            link
            for index, link in enumerate(self.links)
            if index not in drop_links and link.a.node not in drop_nodes and link.b.node not in drop_nodes
        )
        kept_nodes = {name: node for name, node in self.nodes.items() if name not in drop_nodes}
        return replace(self, nodes=kept_nodes, links=kept_links)


__all__ = [
    "GUID_PREFIX",
    "MAX_PORTS",
    "Fabric",
    "Link",
    "Node",
    "NodeKind",
    "PortRef",
    "guid_from_name",
    "make_guid",
]
