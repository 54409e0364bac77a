"""Virtual lanes in files: what `route --dump-dir` writes for an engine that assigns lanes (dfsssp), and a
checker that proves every lane deadlock-free from the dump files alone.

* `opensm-sl2vl.dump` — OpenSM's own format (`dump_sl2vl_tbl` of its osm_dump.c): per port, the VL each of
  the 16 SLs maps to, for every (in, out) port pair of a switch.  As OpenSM's dfsssp does, the SL of a route
  is its lane and SL i maps to VL i.
* `opensm-path-sl.dump` — the SL of every route host traffic takes: per ingress switch (its GUID, as in
  `opensm-lfts.dump`), one `0xLID SL` line per host destination.  OpenSM keeps these in memory and answers
  path-record queries with them; there is no OpenSM file to copy, so the format mirrors the LFT dump.

`check_lanes` reads `opensm-subnet.lst` (the cabling), `opensm-lfts.dump` (the tables) and the path-SL dump,
walks every route hop by hop, and looks for a cycle in each lane's channel dependency graph — nothing of the
engine or of `cdg` is used, so a wrong lane assignment or a wrong dump shows as a cycle or an error here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from controller.sm.opensm import DumpError, parse_lfts
from controller.sm.subnet import NO_PORT
from controller.sm.tables import RoutingTables

#: InfiniBand service levels (and data VLs 0-14, VL15 is management).
SLS = 16

_SL2VL_HEADER = "#in out : 0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15"
_SEPARATOR = "#--------------------------------------------------------"


def format_sl2vl(tables: RoutingTables) -> str:
    """opensm-sl2vl.dump with SL i -> VL i on every port (what dfsssp's lanes mean on the wire)."""
    subnet = tables.subnet
    fabric = subnet.fabric
    identity = "".join(f" {sl:<2d}" for sl in range(SLS))
    out: list[str] = []
    for lid, endpoint in subnet.lids.endpoints.items():
        node = fabric.nodes[endpoint.node]
        kind = "Switch" if node.is_switch else "Channel Adapter"
        port = 0 if node.is_switch else endpoint.port
        out.append(
            f'{kind} 0x{node.port_guid(port):016x}, base LID {lid}, "{node.node_description}"\n'
            f"{_SL2VL_HEADER}\n{_SEPARATOR}\n"
        )
        if node.is_switch:
            cabled = [p for p in range(1, node.ports + 1) if fabric.peer(node.name, p) is not None]
            for out_port in cabled:
                for in_port in range(node.ports + 1):
                    out.append(f"{in_port:<3d} {out_port:<3d} :{identity}\n")
        else:
            out.append(f"{0:<3d} {0:<3d} :{identity}\n")
        out.append(f"{_SEPARATOR}\n\n")
    return "".join(out)


def format_path_sl(tables: RoutingTables) -> str:
    """opensm-path-sl.dump: the lane (= SL) of every route host traffic takes, per ingress switch."""
    subnet = tables.subnet
    layers = tables.layers
    host_lids = [int(lid) for lid in subnet.ep_lids.tolist()]
    out = ["# path SLs (SL i uses VL i): per ingress switch, the SL of the route to each host LID\n"]
    for s in np.flatnonzero(subnet.has_hosts).tolist():
        out.append(f"Switch 0x{int(subnet.switch_guids[s]):016x}\n")
        for lid in host_lids:
            sl = int(layers[s, lid]) if layers is not None else 0
            out.append(f"0x{lid:04x} {sl}\n")
    return "".join(out)


_SWITCH = re.compile(r"^Switch 0x([0-9a-fA-F]+)$")
_PATH = re.compile(r"^0x([0-9a-fA-F]+) (\d+)$")
_END = re.compile(
    r"\{ (SW|CA)(?:-SM)? Ports:[0-9A-Fa-f]+ SystemGUID:[0-9a-fA-F]+ NodeGUID:([0-9a-fA-F]+) "
    r"PortGUID:[0-9a-fA-F]+ .*? LID:([0-9A-Fa-f]+) PN:([0-9A-Fa-f]+) \}"
)


def parse_path_sl(text: str) -> dict[int, dict[int, int]]:
    """{ingress switch GUID: {host LID: SL}} from an opensm-path-sl.dump."""
    paths: dict[int, dict[int, int]] = {}
    current: dict[int, int] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if match := _SWITCH.match(line):
            current = paths.setdefault(int(match.group(1), 16), {})
        elif (match := _PATH.match(line)) and current is not None:
            sl = int(match.group(2))
            if sl >= SLS:
                raise DumpError(f"line {number}: SL {sl} (at most {SLS - 1})")
            current[int(match.group(1), 16)] = sl
        else:
            raise DumpError(f"line {number}: not an opensm-path-sl.dump line: {raw!r}")
    return paths


def parse_cabling(text: str) -> tuple[dict[tuple[int, int], tuple[str, int, int]], dict[int, int]]:
    """From opensm-subnet.lst: {(switch GUID, port): (far kind "SW"/"CA", far node GUID, far port)}, and
    {CA LID: the switch GUID it is cabled to}."""
    far: dict[tuple[int, int], tuple[str, int, int]] = {}
    attached: dict[int, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        ends = _END.findall(raw)
        if len(ends) != 2:
            raise DumpError(f"line {number}: not an opensm-subnet.lst line: {raw[:80]!r}")
        (kind_a, guid_a, lid_a, port_a), (kind_b, guid_b, _, port_b) = ends
        if kind_a == "SW":
            far[(int(guid_a, 16), int(port_a, 16))] = (kind_b, int(guid_b, 16), int(port_b, 16))
        elif kind_b == "SW":
            attached[int(lid_a, 16)] = int(guid_b, 16)
    return far, attached


@dataclass(frozen=True)
class LaneCheck:
    routes: int
    #: lane -> dependencies (channel pairs) in it
    dependencies: dict[int, int]
    #: lane -> one cycle of channels "GUID:port", for the lanes that have one
    cycles: dict[int, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def acyclic(self) -> bool:
        return not self.cycles and not self.problems


def check_lanes(subnet_lst: str, lfts: str, path_sl: str) -> LaneCheck:
    """Walk every route of the path-SL dump through the LFT dump over the cabling of the subnet list and
    check each lane's channel dependency graph for a cycle."""
    far, attached = parse_cabling(subnet_lst)
    tables = {guid: entries for _, guid, entries in parse_lfts(lfts)}
    paths = parse_path_sl(path_sl)
    edges: dict[int, set[tuple[tuple[int, int], tuple[int, int]]]] = defaultdict(set)
    problems: list[str] = []
    routes = 0
    for ingress, by_lid in sorted(paths.items()):
        for lid, sl in sorted(by_lid.items()):
            if attached.get(lid) == ingress:
                continue  # delivered by the ingress switch itself: no switch-to-switch channel
            routes += 1
            problem = _walk(ingress, lid, sl, tables, far, edges)
            if problem:
                problems.append(problem)
                if len(problems) >= 10:
                    return LaneCheck(routes, {k: len(v) for k, v in edges.items()}, {}, problems)
    cycles = {lane: cycle for lane, found in sorted(edges.items()) if (cycle := _cycle(found))}
    return LaneCheck(routes, {k: len(v) for k, v in sorted(edges.items())}, cycles, problems)


def _walk(
    ingress: int,
    lid: int,
    sl: int,
    tables: dict[int, dict[int, int]],
    far: dict[tuple[int, int], tuple[str, int, int]],
    edges: dict[int, set[tuple[tuple[int, int], tuple[int, int]]]],
) -> str | None:
    here, previous = ingress, None
    for _ in range(len(tables) + 1):
        port = tables.get(here, {}).get(lid)
        if port is None or port in (0, NO_PORT):
            return f"switch 0x{here:016x} has no entry for LID 0x{lid:04x} (route from 0x{ingress:016x})"
        channel = (here, port)
        nxt = far.get(channel)
        if nxt is None:
            return f"switch 0x{here:016x} port {port} toward LID 0x{lid:04x} is not cabled"
        kind, guid, _ = nxt
        if kind == "CA":
            return None  # delivered
        if previous is not None:
            edges[sl].add((previous, channel))
        here, previous = guid, channel
    return f"the route from 0x{ingress:016x} to LID 0x{lid:04x} loops"


def _cycle(edges: set[tuple[tuple[int, int], tuple[int, int]]]) -> list[str]:
    """One cycle of the graph (empty when acyclic): Kahn's algorithm, then a walk backwards inside what is
    left (every node left has a predecessor left, so the walk must come round)."""
    successors: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    predecessors: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    indegree: dict[tuple[int, int], int] = defaultdict(int)
    for a, b in edges:
        successors[a].append(b)
        predecessors[b].append(a)
        indegree[b] += 1
        indegree.setdefault(a, 0)
    ready = [node for node, degree in indegree.items() if degree == 0]
    while ready:
        node = ready.pop()
        for nxt in successors[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    left = {node for node, degree in indegree.items() if degree > 0}
    if not left:
        return []
    node = min(left)
    seen: dict[tuple[int, int], int] = {}
    trail: list[tuple[int, int]] = []
    while node not in seen:
        seen[node] = len(trail)
        trail.append(node)
        node = min(n for n in predecessors[node] if n in left)
    cycle = trail[seen[node] :][::-1]  # walked against the edges
    return [f"0x{guid:016x}:{port}" for guid, port in cycle]


__all__ = [
    "SLS",
    "LaneCheck",
    "check_lanes",
    "format_path_sl",
    "format_sl2vl",
    "parse_cabling",
    "parse_path_sl",
]
