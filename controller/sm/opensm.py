"""OpenSM's file formats: `opensm-lfts.dump` and `opensm-subnet.lst`, written and read.

Written exactly in OpenSM 3.3's line formats (see tests/data/opensm-ft3-k4, produced by the real OpenSM on
ibsim), so fabriclab tables can be diffed line by line with OpenSM's and fed to tools that read them.  The
reader turns an OpenSM dump back into `RoutingTables` over our subnet, so OpenSM's own routing can be put
through the same verification and quality figures as ours.

Pure text in, text out: writing files is the caller's business.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from controller.sm.lids import Endpoint, LidMap, fabric_endpoints
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables, new_lft
from topologies.model import Fabric

#: InfiniBand lane speeds in Gb/s as OpenSM prints them, and link widths.
_SPEEDS = (2.5, 5.0, 10.0, 14.0, 25.0, 50.0, 100.0, 200.0)
_WIDTHS = (4, 1, 2, 8, 12)


def phy_and_speed(bw_gbps: float) -> tuple[str, str]:
    """PHY= and SPD= fields for a link of the given bandwidth (4x preferred, as nearly all links are)."""
    for width in _WIDTHS:
        for speed in _SPEEDS:
            if abs(width * speed - bw_gbps) < 1e-6:
                return f"{width}x", f"{speed:g}"
    return "4x", f"{bw_gbps / 4:g}"


def _kind(subnet: Subnet, lid: int) -> str:
    endpoint = subnet.lids.endpoints[lid]
    return "Switch" if endpoint.is_switch else "Channel Adapter"


def format_lfts(tables: RoutingTables) -> str:
    """opensm-lfts.dump: per switch (in LID order) its routed LIDs, skipping unrouted ones like OpenSM."""
    subnet = tables.subnet
    nodes = subnet.fabric.nodes
    max_lid = subnet.max_lid
    lids = subnet.dest_lids.tolist()
    suffix = {}
    for lid in lids:
        endpoint = subnet.lids.endpoints[lid]
        node = nodes[endpoint.node]
        suffix[lid] = f" # {_kind(subnet, lid)} portguid 0x{endpoint.guid:016x}: '{node.node_description}'\n"
    out: list[str] = []
    for s, name in enumerate(subnet.switch_names):
        node = nodes[name]
        out.append(
            f"Unicast lids [0-{max_lid}] of switch Lid {int(subnet.switch_lids[s])} guid 0x{node.guid:016x} "
            f"('{node.node_description}'):\n"
        )
        row = tables.lft[s]
        for lid in lids:
            port = int(row[lid])
            if port != NO_PORT:
                out.append(f"0x{lid:04x} {port:03d}{suffix[lid]}")
        out.append(f"{max_lid} lids dumped\n")
    return "".join(out)


def format_subnet_lst(subnet: Subnet, sm_node: str | None = None) -> str:
    """opensm-subnet.lst: one line per connected port (each cable from both ends), CAs then switches, in
    LID order.  The node running the SM is marked `-SM` as OpenSM does; by default the lowest-LID host."""
    fabric = subnet.fabric
    if sm_node is None and subnet.endpoints:
        sm_node = subnet.endpoints[0].node
    lid_of: dict[tuple[str, int], int] = {}
    for lid, endpoint in subnet.lids.endpoints.items():
        lid_of[(endpoint.node, endpoint.port)] = lid

    def describe(node_name: str, port: int, wide_vendor: bool) -> str:
        node = fabric.nodes[node_name]
        kind = "SW" if node.is_switch else "CA"
        if node_name == sm_node:
            kind += "-SM"
        lid = lid_of[(node_name, 0)] if node.is_switch else lid_of[(node_name, port)]
        port_guid = node.port_guid(0 if node.is_switch else port)
        vendor = f"{node.vendor_id:08X}" if wide_vendor else f"{node.vendor_id:06X}"
        system = node.system_guid if node.system_guid is not None else node.guid
        return (
            f"{{ {kind} Ports:{node.ports:02X} SystemGUID:{system:016x} NodeGUID:{node.guid:016x} "
            f"PortGUID:{port_guid:016x} VenID:{vendor} DevID:{node.device_id:04X} Rev:{node.revision:08X} "
            f"{{{node.node_description}}} LID:{lid:04X} PN:{port:02X} }}"
        )

    ports: list[tuple[int, int, str, int]] = []  # (is switch, lid, node, port)
    for lid, endpoint in subnet.lids.endpoints.items():
        node = fabric.nodes[endpoint.node]
        if node.is_switch:
            for port in range(1, node.ports + 1):
                if fabric.peer(node.name, port) is not None:
                    ports.append((1, lid, node.name, port))
        else:
            ports.append((0, lid, node.name, endpoint.port))
    out: list[str] = []
    for _, _, name, port in sorted(ports):
        peer = fabric.peer(name, port)
        assert peer is not None
        index, _ = fabric.port_map[(peer)]
        phy, speed = phy_and_speed(fabric.links[index].bw_gbps)
        out.append(
            f"{describe(name, port, False)} {describe(peer.node, peer.port, True)} "
            f"PHY={phy} LOG=ACT SPD={speed}\n"
        )
    return "".join(out)


_HEADER = re.compile(r"^Unicast lids \[0-(\d+)\] of switch Lid (\d+) guid 0x([0-9a-fA-F]+) \('(.*)'\):$")
_ENTRY = re.compile(r"^0x([0-9a-fA-F]+) (\d+)(?: #.*)?$")
_FOOTER = re.compile(r"^\d+ lids dumped$")


class DumpError(ValueError):
    pass


def parse_lfts(text: str) -> Iterator[tuple[int, int, dict[int, int]]]:
    """(switch LID, switch GUID, {LID: port}) per table in an opensm-lfts.dump."""
    current: tuple[int, int, dict[int, int]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        header = _HEADER.match(line)
        if header:
            if current is not None:
                yield current
            current = (int(header.group(2)), int(header.group(3), 16), {})
            continue
        entry = _ENTRY.match(line)
        if entry and current is not None:
            current[2][int(entry.group(1), 16)] = int(entry.group(2))
            continue
        if _FOOTER.match(line):
            continue
        raise DumpError(f"line {number}: not an opensm-lfts.dump line: {raw!r}")
    if current is not None:
        yield current


_ENTRY_GUID = re.compile(r"^0x([0-9a-fA-F]+) \d+ # .* portguid 0x([0-9a-fA-F]+):")


def lids_from_lfts(fabric: Fabric, text: str) -> LidMap:
    """The LID assignment an opensm-lfts.dump was made with, as a `LidMap` over `fabric` (by port GUID).

    OpenSM hands out LIDs in the order of its port table, a map keyed by port GUID in network byte order —
    on a little-endian machine that is the order of the byte-reversed GUID, which differs from fabriclab's
    GUID order on fabrics such as OpenSM's own k=16 (whose GUIDs carry the index low byte first).  Building
    the subnet with these LIDs lets OpenSM's tables be read back and compared entry by entry.
    """
    by_guid: dict[int, int] = {}
    for line in text.splitlines():
        match = _ENTRY_GUID.match(line.strip())
        if match:
            by_guid.setdefault(int(match.group(2), 16), int(match.group(1), 16))
    endpoints: dict[int, Endpoint] = {}
    hosts, switches = fabric_endpoints(fabric)
    for endpoint in hosts + switches:
        lid = by_guid.get(endpoint.guid)
        if lid is None:
            raise DumpError(f"{endpoint.node} (port GUID 0x{endpoint.guid:016x}) has no LID in the dump")
        endpoints[lid] = endpoint
    return LidMap(
        by_guid={e.guid: lid for lid, e in endpoints.items()}, endpoints=dict(sorted(endpoints.items()))
    )


def ca_order_from_dump(subnet: Subnet, text: str) -> npt.NDArray[np.int64]:
    """Endpoint indices in the order of an `opensm-ftree-ca-order.dump` (dummies skipped), so another SM's
    tables can be judged on shift permutations in the order it routed them for."""
    index = {int(lid): i for i, lid in enumerate(subnet.ep_lids.tolist())}
    order: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        lid_text = line.split("\t", 1)[0].strip()
        if not lid_text or lid_text.upper() == "0XFFFF":
            continue
        try:
            order.append(index[int(lid_text, 16)])
        except (KeyError, ValueError):
            raise DumpError(f"line {number}: {lid_text!r} is not a host LID of this subnet") from None
    if sorted(order) != list(range(len(index))):
        raise DumpError("the CA order does not list every host exactly once")
    return np.array(order, dtype=np.int64)


def tables_from_lfts(subnet: Subnet, text: str, engine: str = "opensm") -> RoutingTables:
    """OpenSM's tables as `RoutingTables` over our subnet (same GUIDs and LIDs required)."""
    by_guid = {int(g): i for i, g in enumerate(subnet.switch_guids.tolist())}
    lft = new_lft(subnet)
    for switch_lid, guid, entries in parse_lfts(text):
        s = by_guid.get(guid)
        if s is None:
            raise DumpError(f"switch GUID 0x{guid:016x} is not in the fabric")
        if int(subnet.switch_lids[s]) != switch_lid:
            raise DumpError(
                f"switch {subnet.switch_names[s]} has LID {int(subnet.switch_lids[s])} here "
                f"but {switch_lid} in the dump"
            )
        for lid, port in entries.items():
            if lid > subnet.max_lid:
                raise DumpError(f"LID {lid} in the dump is beyond this fabric's LIDs")
            lft[s, lid] = port
    alt = np.zeros((subnet.n_switches, subnet.n_switches, (subnet.n_ports + 7) // 8), dtype=np.uint8)
    return RoutingTables(engine, subnet, lft, alt, {"source": "opensm-lfts.dump"})


__all__ = [
    "DumpError",
    "ca_order_from_dump",
    "format_lfts",
    "format_subnet_lst",
    "lids_from_lfts",
    "parse_lfts",
    "phy_and_speed",
    "tables_from_lfts",
]
