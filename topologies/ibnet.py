"""ibnetdiscover / ibsim "net" files: a real InfiniBand fabric dump becomes a fabric, and back.

Accepted input is what `ibnetdiscover` prints and the subset that ibsim reads:

    # comments, blank lines
    vendid=0x2c9                    (optional, kept)
    devid=0xd2f0                    (optional, kept)
    sysimgguid=0x248a0703005c1e60   (optional, kept)
    switchguid=0x248a0703005c1e60(248a0703005c1e60)      or  caguid=0x0c42a10300b5d950
    Switch  36 "S-248a0703005c1e60"  # "MF0;sw-01:MQM8700/U1" enhanced port 0 lid 3 lmc 0
    [1]     "H-0c42a10300b5d950"[1](c42a10300b5d951)  # "node01 HCA-1" lid 12 4xHDR
    [2][ext 3]  "S-..."[7]
    Ca      1 "H-0c42a10300b5d950"   # "node01 HCA-1"
    [1](c42a10300b5d951)  "S-248a0703005c1e60"[1]  # lid 12 lmc 0 "MF0;sw-01:MQM8700/U1" lid 3 4xHDR

Node names are the quoted identifiers; the quoted text of the node line's comment is the node description.
GUIDs and port numbers are preserved.  A link's bandwidth comes from the width and speed at the end of a
port line's comment (`4xHDR` = 200 Gb/s); without one it is `default_bw_gbps` (10: ibsim's links are 4x
SDR).  Every cable is normally listed from both ends; the two records must agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from topologies.checks import Locator, check_fabric
from topologies.errors import TopologyError, read_input_file
from topologies.model import MAX_PORTS, Fabric, Link, Node, NodeKind, PortRef

#: Per-lane signalling rate in Gb/s by InfiniBand speed name (FDR is 14.0625 nominal; 14 as OpenSM prints).
LANE_GBPS = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}

_GUID_LINE = re.compile(r"^(switchguid|caguid|rtguid)=(0x[0-9a-fA-F]+)(?:\(([0-9a-fA-F]+)\))?\s*$")
_ATTR_LINE = re.compile(r"^(vendid|devid|sysimgguid)=(0x[0-9a-fA-F]+)\s*$")
_NODE_LINE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([^"]*)"\s*(?:#\s*(.*))?$')
_PORT_LINE = re.compile(
    r'^\[(\d+)\](?:\[ext\s+\d+\])?(?:\(([0-9a-fA-F]+)\))?\s+"([^"]*)"\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*(?:#\s*(.*))?$'
)
_SPEED = re.compile(r"\b(\d+)x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")
_QUOTED = re.compile(r'"([^"]*)"')


@dataclass
class _NodeRecord:
    kind: NodeKind
    name: str
    ports: int
    guid: int
    line: int
    description: str | None
    system_guid: int | None
    vendor_id: int
    device_id: int
    port_guids: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _PortRecord:
    node: str
    port: int
    peer: str
    peer_port: int
    bw_gbps: float | None
    line: int


class _IbnetLocator(Locator):
    def __init__(self, file: str, node_lines: dict[str, int], link_lines: list[int]) -> None:
        self.file = file
        self.node_lines = node_lines
        self.link_lines = link_lines

    def node(self, name: str) -> tuple[int | None, str]:
        return self.node_lines.get(name), f'node "{name}"'

    def link(self, index: int, end: int | None = None) -> tuple[int | None, str]:
        return self.link_lines[index], "port record"


def _bandwidth(comment: str | None) -> float | None:
    if not comment:
        return None
    found = _SPEED.findall(comment)
    if not found:
        return None
    width, speed = found[-1]  # the last one describes the link (the first may be the node's description)
    return int(width) * LANE_GBPS[speed]


def parse_ibnet(
    text: str, file: str = "<ibnet>", default_bw_gbps: float = 10.0, name: str | None = None
) -> Fabric:
    records: dict[str, _NodeRecord] = {}
    port_records: list[_PortRecord] = []
    pending_guid: tuple[str, int, int | None, int] | None = None  # (kind word, guid, port0 guid, line)
    attrs: dict[str, int] = {}
    current: _NodeRecord | None = None

    def fail(line: int, message: str, where: str | None = None) -> TopologyError:
        return TopologyError(message, file=file, line=line, field=where)

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if match := _ATTR_LINE.match(line):
            attrs[match.group(1)] = int(match.group(2), 16)
            continue
        if match := _GUID_LINE.match(line):
            if match.group(1) == "rtguid":
                raise fail(number, "routers are not supported (only switches and CAs)")
            port0 = int(match.group(3), 16) if match.group(3) else None
            pending_guid = (match.group(1), int(match.group(2), 16), port0, number)
            current = None
            continue
        if match := _NODE_LINE.match(line):
            word, ports, node_name, comment = match.groups()
            if word == "Rt":
                raise fail(number, "routers are not supported (only switches and CAs)", f'node "{node_name}"')
            kind = NodeKind.SWITCH if word == "Switch" else NodeKind.HOST
            expected = "switchguid" if kind is NodeKind.SWITCH else "caguid"
            if pending_guid is None or pending_guid[0] != expected:
                raise fail(number, f"{word} line without a preceding {expected}= line", f'node "{node_name}"')
            if node_name in records:
                other = records[node_name].line
                raise fail(number, f"node {node_name!r} is declared twice (first at line {other})")
            count = int(ports)
            if not 1 <= count <= MAX_PORTS:
                raise fail(number, f"port count must be 1..{MAX_PORTS}, got {count}", f'node "{node_name}"')
            quoted = _QUOTED.search(comment or "")
            current = _NodeRecord(
                kind=kind,
                name=node_name,
                ports=count,
                guid=pending_guid[1],
                line=number,
                description=quoted.group(1) if quoted else None,
                system_guid=attrs.get("sysimgguid"),
                vendor_id=attrs.get("vendid", 0),
                device_id=attrs.get("devid", 0),
            )
            if pending_guid[2] is not None and pending_guid[2] != pending_guid[1]:
                current.port_guids[0] = pending_guid[2]
            records[node_name] = current
            pending_guid = None
            attrs = {}
            continue
        if match := _PORT_LINE.match(line):
            if current is None:
                raise fail(number, "port record outside a Switch/Ca block")
            port, own_guid, peer, peer_port, peer_guid, comment = match.groups()
            where = f'{current.kind.value} "{current.name}" port {port}'
            port_no = int(port)
            if not 1 <= port_no <= current.ports:
                raise fail(number, f"port {port_no} is beyond the node's {current.ports} ports", where)
            if own_guid and current.kind is NodeKind.HOST:
                guid = int(own_guid, 16)
                if guid != current.guid + port_no:
                    current.port_guids[port_no] = guid
            del peer_guid  # the peer's own record carries it
            port_records.append(
                _PortRecord(current.name, port_no, peer, int(peer_port), _bandwidth(comment), number)
            )
            continue
        context = f'{current.kind.value} "{current.name}"' if current else None
        raise fail(number, f"not an ibnetdiscover line: {raw.strip()[:60]!r}", context)

    links, link_lines = _links(port_records, records, file, default_bw_gbps)
    nodes = {
        r.name: Node(
            name=r.name,
            kind=r.kind,
            guid=r.guid,
            ports=r.ports,
            description=r.description,
            system_guid=r.system_guid,
            vendor_id=r.vendor_id,
            device_id=r.device_id,
            port_guids=tuple(sorted(r.port_guids.items())),
        )
        for r in records.values()
    }
    fabric = Fabric(
        name=name or Path(file.removesuffix(".gz")).stem or "ibnet", nodes=nodes, links=tuple(links)
    )
    check_fabric(fabric, _IbnetLocator(file, {r.name: r.line for r in records.values()}, link_lines))
    return fabric


def _links(
    port_records: list[_PortRecord], records: dict[str, _NodeRecord], file: str, default_bw_gbps: float
) -> tuple[list[Link], list[int]]:
    """One link per cable; both ends' records must agree."""
    claims: dict[tuple[str, int], _PortRecord] = {}
    links: list[Link] = []
    lines: list[int] = []
    for record in port_records:
        where = f'"{record.node}" port {record.port}'
        if record.peer not in records:
            raise TopologyError(
                f"unknown peer node {record.peer!r}", file=file, line=record.line, field=where
            )
        peer_node = records[record.peer]
        if not 1 <= record.peer_port <= peer_node.ports:
            raise TopologyError(
                f"peer port {record.peer_port} is beyond {record.peer!r}'s {peer_node.ports} ports",
                file=file,
                line=record.line,
                field=where,
            )
        mine = (record.node, record.port)
        theirs = (record.peer, record.peer_port)
        if mine in claims:
            first = claims[mine]
            if (first.node, first.port) == mine:
                raise TopologyError(
                    f"port listed twice (first at line {first.line})",
                    file=file,
                    line=record.line,
                    field=where,
                )
            if (first.node, first.port) != theirs:
                raise TopologyError(
                    f"{record.peer}[{record.peer_port}] disagrees: line {first.line} says "
                    f"{first.node}[{first.port}] is on the other end of {record.node}[{record.port}]",
                    file=file,
                    line=record.line,
                    field=where,
                )
            continue  # the second record of a cable already seen
        if theirs in claims:
            first = claims[theirs]
            raise TopologyError(
                f"{record.peer}[{record.peer_port}] is already cabled to {first.node}[{first.port}] "
                f"(line {first.line})",
                file=file,
                line=record.line,
                field=where,
            )
        claims[mine] = record
        claims[theirs] = record
        bw = record.bw_gbps if record.bw_gbps is not None else default_bw_gbps
        links.append(Link(PortRef(record.node, record.port), PortRef(record.peer, record.peer_port), bw))
        lines.append(record.line)
    return links, lines


def load_ibnet(path: str | Path, name: str | None = None, default_bw_gbps: float = 10.0) -> Fabric:
    return parse_ibnet(read_input_file(path, TopologyError), str(path), default_bw_gbps, name)


def dump_ibnet(fabric: Fabric, header: str | None = None) -> str:
    """The ibsim subset, laid out like ibsim's own net files: one block per node in fabric order, every
    cabled port in port order, both ends of each cable."""
    out: list[str] = []
    if header:
        out.extend(f"# {line}".rstrip() for line in header.splitlines())
        out.append("")
    for node in fabric.nodes.values():
        word = "Switch" if node.is_switch else "Ca"
        guid_word = "switchguid" if node.is_switch else "caguid"
        out.append(f"{guid_word}=0x{node.guid:016x}")
        out.append(f'{word}\t{node.ports} "{node.name}"')
        for port in range(1, node.ports + 1):
            peer = fabric.peer(node.name, port)
            if peer is not None:
                out.append(f'[{port}]\t"{peer.node}"[{peer.port}]')
        out.append("")
    return "\n".join(out) + "\n"


__all__ = ["LANE_GBPS", "dump_ibnet", "load_ibnet", "parse_ibnet"]
