"""Cross-checks of a fabric (layer 3 of validation), shared by topology files, generators and imports.

Each check raises a `TopologyError` that says where the problem was written, through a `Locator` supplied by
whoever parsed the input (a YAML file knows lines of nodes and links, an ibnetdiscover dump knows lines of
port records).  The same checks run whatever the source, so a fabric that passes them is one every engine,
the emulator and the simulator can use.
"""

from __future__ import annotations

import math
from collections import defaultdict

from topologies.errors import TopologyError
from topologies.model import MAX_PORTS, Fabric, PortRef


class Locator:
    """Where things were written; the base class knows only names (for generated fabrics)."""

    file: str | None = None

    def node(self, name: str) -> tuple[int | None, str]:
        return None, f"nodes.{name}"

    def link(self, index: int, end: int | None = None) -> tuple[int | None, str]:
        field = f"links[{index}]"
        if end is not None:
            field += f".endpoints[{end}]"
        return None, field


def _fail(locator: Locator, where: tuple[int | None, str], message: str) -> TopologyError:
    line, field = where
    return TopologyError(message, file=locator.file, line=line, field=field)


def check_fabric(fabric: Fabric, locator: Locator | None = None) -> None:
    """Raise on the first problem found, in file order where possible."""
    loc = locator or Locator()
    if not fabric.switches:
        raise TopologyError("a fabric needs at least one switch", file=loc.file, field="nodes")
    if not fabric.hosts:
        raise TopologyError("a fabric needs at least one host", file=loc.file, field="nodes")

    for node in fabric.nodes.values():
        if node.ports < 1 or node.ports > MAX_PORTS:
            raise _fail(loc, loc.node(node.name), f"ports must be 1..{MAX_PORTS}, got {node.ports}")

    used: dict[PortRef, int] = {}
    for index, link in enumerate(fabric.links):
        for end, ref in enumerate((link.a, link.b)):
            far = fabric.nodes.get(ref.node)
            if far is None:
                raise _fail(loc, loc.link(index, end), f"unknown node {ref.node!r} in endpoint {ref}")
            if not 1 <= ref.port <= far.ports:
                raise _fail(
                    loc,
                    loc.link(index, end),
                    f"port {ref.port} does not exist on {ref.node} (ports 1..{far.ports})",
                )
            if ref in used:
                first_line, first_field = loc.link(used[ref])
                where = f"{first_field}" + (f" (line {first_line})" if first_line else "")
                raise _fail(loc, loc.link(index, end), f"port {ref} is already used by {where}")
            used[ref] = index
        if link.a.node == link.b.node:
            raise _fail(loc, loc.link(index), f"link connects {link.a.node} to itself")
        if fabric.nodes[link.a.node].is_host and fabric.nodes[link.b.node].is_host:
            raise _fail(loc, loc.link(index), f"link {link} connects two hosts; hosts attach to switches")
        if not (math.isfinite(link.bw_gbps) and link.bw_gbps > 0):
            raise _fail(loc, loc.link(index), f"bw_gbps must be a finite number > 0, got {link.bw_gbps}")

    linked = {ref.node for ref in used}
    for node in fabric.nodes.values():
        if node.name not in linked:
            raise _fail(loc, loc.node(node.name), f"{node.kind.value} {node.name} has no link")

    ports_of: dict[str, list[int]] = defaultdict(list)
    for ref in used:
        ports_of[ref.node].append(ref.port)
    owners: dict[int, str] = {}
    for node in fabric.nodes.values():
        guids = {node.guid}
        if node.is_host:
            guids |= {node.port_guid(port) for port in ports_of[node.name]}
        for guid in sorted(guids):
            other = owners.get(guid)
            if other is not None and other != node.name:
                raise _fail(
                    loc, loc.node(node.name), f"GUID 0x{guid:016x} of {node.name} is already used by {other}"
                )
            owners[guid] = node.name

    _check_connected(fabric, loc)


def _check_connected(fabric: Fabric, loc: Locator) -> None:
    parent = {name: name for name in fabric.nodes}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in fabric.links:
        ra, rb = find(link.a.node), find(link.b.node)
        if ra != rb:
            parent[ra] = rb
    parts: dict[str, list[str]] = defaultdict(list)
    for name in fabric.nodes:
        parts[find(name)].append(name)
    if len(parts) > 1:
        ordered = sorted(parts.values(), key=len, reverse=True)
        stray = ordered[1]
        sample = ", ".join(stray[:5]) + (", ..." if len(stray) > 5 else "")
        raise _fail(
            loc,
            loc.node(stray[0]),
            f"fabric is not connected: {len(parts)} separate parts; {len(stray)} node(s) ({sample}) "
            f"cannot reach {ordered[0][0]}",
        )


__all__ = ["Locator", "check_fabric"]
