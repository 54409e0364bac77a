"""LID assignment: every switch and every connected host port gets a 16-bit local identifier.

Why it is done this way:

* Deterministic: a fresh fabric gets host ports first, then switches, each in GUID order — what OpenSM does
  on a fabric it sweeps for the first time from a host (and what the reference dump shows).
* Stable across re-sweeps: a LID, once given to a GUID, stays with it.  `assign_lids(fabric, previous)` keeps
  every known GUID's LID, remembers LIDs of GUIDs that disappeared (like OpenSM's guid2lid cache) so a
  switch that comes back after a failure gets its old LID, and gives new GUIDs the lowest free LIDs.  Hosts
  keep their addresses through failures, so forwarding entries for unaffected destinations never change.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from topologies.model import Fabric

#: Unicast LIDs are 1..0xBFFF; 0xC000 and up are multicast.
MAX_UNICAST_LID = 0xBFFF


class LidSpaceExhausted(ValueError):
    pass


@dataclass(frozen=True)
class Endpoint:
    """Something a LID points at: a switch (port 0) or one connected port of a host."""

    node: str
    port: int
    guid: int  # port GUID
    is_switch: bool


@dataclass(frozen=True)
class LidMap:
    """LID of every endpoint present now, plus LIDs remembered for GUIDs that are gone."""

    by_guid: Mapping[int, int]
    endpoints: Mapping[int, Endpoint]  # LID -> endpoint, present ones only
    remembered: Mapping[int, int] = field(default_factory=dict)

    @cached_property
    def max_lid(self) -> int:
        """Computed once (a scan of every LID): hot paths ask for it per destination."""
        return max(self.endpoints, default=0)

    def lid(self, node: str, port: int = 0) -> int:
        """LID of a switch, or of a host port (port 0 = the host's first connected port)."""
        index = self._index
        lid = index.get((node, port))
        if lid is None and port == 0:
            lid = index.get((node, -1))
        if lid is None:
            raise KeyError(f"no LID for {node}" + (f":{port}" if port else ""))
        return lid

    @cached_property
    def _index(self) -> dict[tuple[str, int], int]:
        index: dict[tuple[str, int], int] = {}
        for lid, endpoint in sorted(self.endpoints.items(), reverse=True):
            index[(endpoint.node, endpoint.port)] = lid
            if not endpoint.is_switch:
                index[(endpoint.node, -1)] = lid  # ends up as the lowest LID of the host
        return index

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.endpoints))

    def __len__(self) -> int:
        return len(self.endpoints)


def fabric_endpoints(fabric: Fabric) -> tuple[list[Endpoint], list[Endpoint]]:
    """Connected host ports and switches, each sorted by port GUID."""
    hosts: list[Endpoint] = []
    for link in fabric.links:
        for ref in (link.a, link.b):
            node = fabric.nodes[ref.node]
            if node.is_host:
                hosts.append(Endpoint(node.name, ref.port, node.port_guid(ref.port), False))
    switches = [Endpoint(node.name, 0, node.guid, True) for node in fabric.switches]
    hosts.sort(key=lambda e: e.guid)
    switches.sort(key=lambda e: e.guid)
    return hosts, switches


def assign_lids(fabric: Fabric, previous: LidMap | None = None) -> LidMap:
    hosts, switches = fabric_endpoints(fabric)
    memory: dict[int, int] = {}
    if previous is not None:
        memory.update(previous.remembered)
        memory.update(previous.by_guid)
    present = {e.guid for e in hosts} | {e.guid for e in switches}
    by_guid: dict[int, int] = {}
    taken: set[int] = set()
    ordered = hosts + switches
    for endpoint in ordered:
        lid = memory.get(endpoint.guid)
        if lid is not None and lid not in taken:
            by_guid[endpoint.guid] = lid
            taken.add(lid)
    # LIDs remembered for absent GUIDs stay reserved, so a returning node finds its LID free.
    reserved = {lid for guid, lid in memory.items() if guid not in present}
    next_lid = 1
    for endpoint in ordered:
        if endpoint.guid in by_guid:
            continue
        while next_lid in taken or next_lid in reserved:
            next_lid += 1
        if next_lid > MAX_UNICAST_LID and reserved:
            reserved.clear()  # out of space: forget departed nodes' LIDs rather than fail
            next_lid = 1
            while next_lid in taken:
                next_lid += 1
        if next_lid > MAX_UNICAST_LID:
            raise LidSpaceExhausted(
                f"more than {MAX_UNICAST_LID} unicast LIDs needed ({len(ordered)} endpoints)"
            )
        by_guid[endpoint.guid] = next_lid
        taken.add(next_lid)
    endpoints = {by_guid[e.guid]: e for e in ordered}
    remembered = {guid: lid for guid, lid in memory.items() if guid not in present}
    return LidMap(by_guid=by_guid, endpoints=dict(sorted(endpoints.items())), remembered=remembered)


__all__ = ["MAX_UNICAST_LID", "Endpoint", "LidMap", "LidSpaceExhausted", "assign_lids", "fabric_endpoints"]
