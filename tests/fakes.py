"""Fake switches with OpenFlow 1.3 table semantics, and a fake fabric that traces packets hop by hop.

Implements what the controller relies on and raises where a real switch would return an error: highest
priority match wins (per table, masked fields compared under their mask), an add with an existing
(priority, match) replaces it, strict deletes, groups that must exist before a flow points at them,
deleting a group deletes the flows that use it (OpenFlow 1.3 §6.5), a pipeline (write-metadata, goto-table
only to a later table; a miss drops), fast-failover buckets chosen by port liveness, select buckets by a
flow hash over live ports.

Like Faucet's FakeOFTable, the fake southbound does not hand intents over: it sends the bytes
`controller.southbound.openflow` really produces (our struct-packed flow-mods, os-ken's group-mods and
barriers), and the fake switch decodes them — flow-mods with os-ken's parser, group-mods with a decoder of
its own written from the OpenFlow 1.3 spec — and applies them in order.  So encoding, message order
(groups before the flows that use them, deletes after every switch confirmed the adds) and table semantics
are tested together, without OVS.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as ofp_parser

from controller.sm.addressing import AddressTable
from controller.sm.intents import FlowIntent, FlowKey, GroupIntent, GroupKind, SwitchDelta
from controller.southbound import openflow
from topologies.model import Fabric, PortRef

ETH_TYPE_IPV4 = 0x0800
_GROUP_MOD = struct.Struct("!HBxI")  # command, type, pad, group_id (after the 8-byte header)
_BUCKET = struct.Struct("!HHII4x")  # len, weight, watch_port, watch_group, pad
_ACTION_OUTPUT = struct.Struct("!HHIH6x")  # type, len, port, max_len, pad
_KINDS = {ofp.OFPGT_FF: GroupKind.FAST_FAILOVER, ofp.OFPGT_SELECT: GroupKind.SELECT}


class WireDatapath:
    """Just enough of an os-ken Datapath to build and serialise messages (no socket)."""

    ofproto = ofp
    ofproto_parser = ofp_parser

    def __init__(self, dpid: int) -> None:
        self.id = dpid
        self.xid = 0

    def set_xid(self, message: object) -> int:
        self.xid += 1
        message.set_xid(self.xid)  # type: ignore[attr-defined]
        return self.xid


def encode(dpid: int, delta: SwitchDelta, phase: str) -> bytes:
    """One phase of a delta as the bytes the controller sends: the messages, then a barrier."""
    dp = WireDatapath(dpid)
    build = openflow.make_messages if phase == "make" else openflow.break_messages
    body, _ = openflow.serialize(dp, [*build(dp, delta), openflow.barrier(dp)])
    return body


def split_messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, length, xid, whole message) for each OpenFlow message in a byte stream."""
    offset = 0
    while offset < len(data):
        version, msg_type, length, xid = ofproto_parser.header(data[offset:])
        if version != ofp.OFP_VERSION or length < 8 or offset + length > len(data):
            raise OpenFlowError(f"malformed OpenFlow stream at byte {offset}")
        yield msg_type, length, xid, data[offset : offset + length]
        offset += length


def decode_group_mod(message: bytes) -> tuple[int, GroupIntent]:
    """An ofp_group_mod (OpenFlow 1.3 §7.3.4.2) decoded independently of os-ken's serialiser."""
    command, kind, group_id = _GROUP_MOD.unpack_from(message, 8)
    ports: list[int] = []
    offset = 16
    while offset < len(message):
        length, _, watch_port, _ = _BUCKET.unpack_from(message, offset)
        action_at = offset + _BUCKET.size
        while action_at < offset + length:
            a_type, a_len, port, _ = _ACTION_OUTPUT.unpack_from(message, action_at)
            if a_type != ofp.OFPAT_OUTPUT or port != watch_port:
                raise OpenFlowError(f"group {group_id}: bucket is not 'output to the watched port'")
            ports.append(port)
            action_at += a_len
        offset += length
    group_kind = _KINDS.get(kind, GroupKind.SELECT)
    return command, GroupIntent(group_id, group_kind, tuple(ports))


class OpenFlowError(RuntimeError):
    pass


class NotDelivered(AssertionError):
    pass


@dataclass
class FakeSwitch:
    name: str
    flows: dict[FlowKey, FlowIntent] = field(default_factory=dict)
    groups: dict[int, GroupIntent] = field(default_factory=dict)
    ports_down: set[int] = field(default_factory=set)
    messages: int = 0
    #: Packets each flow matched (the flow counters partition drops are counted with).
    packets: dict[FlowKey, int] = field(default_factory=dict)
    #: The last asynchronous configuration set (packet-in, port-status, flow-removed masks), if any.
    async_config: tuple[tuple[int, ...], ...] | None = None
    #: Flows by (table, indexed field, value): lookups check a handful of candidates, not every flow.
    _index: dict[tuple[int, str, int], list[FlowIntent]] | None = field(default=None, repr=False)

    def add_group(self, group: GroupIntent) -> None:
        self.messages += 1
        if group.group_id in self.groups:
            raise OpenFlowError(f"{self.name}: group {group.group_id} exists (OFPGMFC_GROUP_EXISTS)")
        self.groups[group.group_id] = group

    def modify_group(self, group: GroupIntent) -> None:
        self.messages += 1
        if group.group_id not in self.groups:
            raise OpenFlowError(f"{self.name}: group {group.group_id} unknown (OFPGMFC_UNKNOWN_GROUP)")
        self.groups[group.group_id] = group

    def delete_group(self, gid: int) -> None:
        self.messages += 1
        self._index = None
        self.groups.pop(gid, None)
        for key in [k for k, f in self.flows.items() if ("group", gid) in f.actions]:
            del self.flows[key]

    def add_flow(self, flow: FlowIntent) -> None:
        self.messages += 1
        self._index = None
        for kind, arg in flow.actions:
            if kind == "group" and arg not in self.groups:
                raise OpenFlowError(f"{self.name}: flow points at missing group {arg} (OFPBAC_BAD_OUT_GROUP)")
            if kind == "goto" and arg <= flow.table:
                raise OpenFlowError(
                    f"{self.name}: goto table {arg} from table {flow.table} (OFPBIC_BAD_TABLE_ID)"
                )
        self.flows[flow.key] = flow

    def delete_flow_strict(self, flow: FlowIntent) -> None:
        self.messages += 1
        self._index = None
        self.flows.pop(flow.key, None)

    def receive(self, data: bytes) -> int:
        """Decode and apply OpenFlow messages in order; returns how many barriers were answered."""
        barriers = 0
        dp = WireDatapath(0)
        for msg_type, length, xid, message in split_messages(data):
            if msg_type == ofp.OFPT_FLOW_MOD:
                mod = ofproto_parser.msg(dp, ofp.OFP_VERSION, msg_type, length, xid, message)
                flow = openflow.flow_from_stats(mod)
                if mod.command == ofp.OFPFC_ADD:
                    self.add_flow(flow)
                elif mod.command == ofp.OFPFC_DELETE_STRICT:
                    self.delete_flow_strict(flow)
                else:
                    raise OpenFlowError(f"{self.name}: flow-mod command {mod.command} not expected")
            elif msg_type == ofp.OFPT_GROUP_MOD:
                command, group = decode_group_mod(message)
                if command == ofp.OFPGC_ADD:
                    self.add_group(group)
                elif command == ofp.OFPGC_MODIFY:
                    self.modify_group(group)
                elif command == ofp.OFPGC_DELETE:
                    self.delete_group(group.group_id)
                else:
                    raise OpenFlowError(f"{self.name}: group-mod command {command} not expected")
            elif msg_type == ofp.OFPT_BARRIER_REQUEST:
                barriers += 1
            elif msg_type == ofp.OFPT_SET_ASYNC:
                if length != 32:
                    raise OpenFlowError(f"{self.name}: set-async of {length} bytes (OFPBRC_BAD_LEN)")
                masks = struct.unpack("!6I", message[8:32])
                self.async_config = (masks[0:2], masks[2:4], masks[4:6])
            else:
                raise OpenFlowError(f"{self.name}: message type {msg_type} not expected in an update")
        return barriers

    def apply_make(self, delta: SwitchDelta) -> None:
        for group in delta.add_groups:
            self.add_group(group)
        for group in delta.modify_groups:
            self.modify_group(group)
        for flow in delta.add_flows:
            self.add_flow(flow)

    def apply_break(self, delta: SwitchDelta) -> None:
        for flow in delta.delete_flows:
            self.delete_flow_strict(flow)
        for gid in delta.delete_groups:
            self.delete_group(gid)

    def _candidates(self, packet: Mapping[str, int], table: int) -> list[FlowIntent]:
        if self._index is None:
            index: dict[tuple[int, str, int], list[FlowIntent]] = {}
            for flow in self.flows.values():
                fields = dict(flow.match)
                key = next(((n, fields[n]) for n in _INDEXED if n in fields), ("", 0))
                index.setdefault((flow.table, *key), []).append(flow)
            self._index = index
        found = list(self._index.get((table, "", 0), ()))
        for name in _INDEXED:
            if name in packet:
                found += self._index.get((table, name, packet[name]), ())
        return found

    def lookup(self, packet: Mapping[str, int], table: int = 0) -> FlowIntent | None:
        best: FlowIntent | None = None
        for flow in self._candidates(packet, table):
            if _matches(flow, packet):
                if best is None or flow.priority > best.priority:
                    best = flow
                elif flow.priority == best.priority:
                    raise OpenFlowError(f"{self.name}: overlapping flows at priority {flow.priority}")
        return best

    def out_port(self, packet: Mapping[str, int], flow_hash: int) -> int | str | None:
        """Port the packet leaves on, "controller", or None (dropped)."""
        fields = dict(packet)
        fields["metadata"] = 0
        table = 0
        while True:
            flow = self.lookup(fields, table)
            if flow is None:
                return None
            self.packets[flow.key] = self.packets.get(flow.key, 0) + 1
            goto = None
            for kind, arg in flow.actions:
                if kind == "output":
                    return arg if arg not in self.ports_down else None
                if kind == "controller":
                    return "controller"
                if kind == "group":
                    group = self.groups[arg]
                    live = [p for p in group.ports if p not in self.ports_down]
                    if not live:
                        return None
                    if group.kind is GroupKind.FAST_FAILOVER:
                        return live[0]
                    return live[flow_hash % len(live)]
                if kind == "metadata":
                    fields["metadata"] = arg
                elif kind == "goto":
                    goto = arg
            if goto is None:
                return None
            table = goto


#: Exact-match fields flows are indexed by (a flow that matches neither is checked for every packet).
_INDEXED = ("eth_dst", "metadata")


def _matches(flow: FlowIntent, packet: Mapping[str, int]) -> bool:
    fields = dict(flow.match)
    for name, value in fields.items():
        if name.endswith("_mask"):
            continue
        have = packet.get(name)
        if have is None:
            return False
        mask = fields.get(name + "_mask")
        if (have & mask if mask is not None else have) != value:
            return False
    return True


class FakeFabric:
    def __init__(self, fabric: Fabric, addresses: AddressTable) -> None:
        self.fabric = fabric
        self.addresses = addresses
        self.switches = {s.name: FakeSwitch(s.name) for s in fabric.switches}

    def set_link(self, index: int, up: bool) -> list[PortRef]:
        """Cut or restore a cable: both ends lose carrier.  Returns the switch ports affected."""
        link = self.fabric.links[index]
        affected = []
        for end in (link.a, link.b):
            if end.node in self.switches:
                ports = self.switches[end.node].ports_down
                (ports.discard if up else ports.add)(end.port)
                affected.append(end)
        return affected

    def trace(
        self,
        src: str,
        dst: str,
        flow_hash: int = 0,
        udp_src: int | None = None,
        dscp: int = 0,
        forge: str | None = None,
        eth_type: int = ETH_TYPE_IPV4,
    ) -> list[str]:
        """Send an IPv4 frame from host `src` to host `dst`'s MAC and IP (a UDP datagram from source port
        `udp_src` when given; with `forge`, claiming that host's source MAC and IP); returns the ports
        visited.  Raises NotDelivered (with the path so far) on a drop, a loop or a wrong receiver."""
        dst_address = self.addresses.of_host(dst)
        src_address = self.addresses.of_host(src)
        claimed = self.addresses.of_host(forge) if forge is not None else src_address
        packet = {"eth_dst": dst_address.mac, "eth_type": ETH_TYPE_IPV4, "ip_dscp": dscp, "ip_proto": 1,
                  "eth_src": claimed.mac, "ipv4_src": claimed.ipv4, "ipv4_dst": dst_address.ipv4}  # fmt: skip
        if eth_type != ETH_TYPE_IPV4:  # e.g. RoCE v1 (0x8915): no IP header
            packet = {"eth_dst": dst_address.mac, "eth_src": claimed.mac, "eth_type": eth_type}
        if udp_src is not None:
            packet.update(ip_proto=17, udp_src=udp_src)
        at = self.fabric.peer(src, src_address.port)
        path = [f"{src}:{src_address.port}"]
        for _ in range(64):
            if at is None:
                raise NotDelivered(f"{src}->{dst}: fell off the fabric after {' '.join(path)}")
            node = self.fabric.nodes[at.node]
            if node.is_host:
                path.append(str(at))
                if at.node != dst:
                    raise NotDelivered(f"{src}->{dst}: delivered to {at.node} via {' '.join(path)}")
                return path
            switch = self.switches[at.node]
            if at.port in switch.ports_down:
                raise NotDelivered(f"{src}->{dst}: arrived on dead port {at} via {' '.join(path)}")
            packet["in_port"] = at.port
            out = switch.out_port(packet, flow_hash)
            if out is None or out == "controller":
                raise NotDelivered(f"{src}->{dst}: dropped ({out}) at {at.node} via {' '.join(path)}")
            assert isinstance(out, int)
            path.append(f"{at.port}>{at.node}>{out}")
            at = self.fabric.peer(at.node, out)
        raise NotDelivered(f"{src}->{dst}: loop: {' '.join(path[:20])} ...")

    def assert_delivers(
        self,
        pairs: Iterable[tuple[str, str]],
        hashes: Iterable[int] = (0,),
        sports: Iterable[int | None] = (None,),
    ) -> int:
        hash_list, sport_list = list(hashes), list(sports)
        count = 0
        for src, dst in pairs:
            for h in hash_list:
                for sport in sport_list:
                    self.trace(src, dst, h, sport)
                    count += 1
        return count

    def delivers(self, src: str, dst: str, **kwargs: Any) -> bool:
        """Whether `trace` gets the packet there (False on a drop; a loop or a wrong receiver still raise)."""
        try:
            self.trace(src, dst, **kwargs)
        except NotDelivered as exc:
            if "dropped" in str(exc):
                return False
            raise
        return True

    def all_pairs(self, hosts: Iterable[str] | None = None) -> list[tuple[str, str]]:
        names = list(hosts) if hosts is not None else [h.name for h in self.fabric.hosts]
        return [(a, b) for a in names for b in names if a != b]


@dataclass
class FakeSnapshot:
    ports: dict[int, bool]
    flows: list[FlowIntent]
    groups: list[GroupIntent]


class FakeSouthbound:
    """The service's southbound over a FakeFabric: pushes apply OpenFlow semantics, LLDP probes are
    answered by the cabling, and a switch can be told to fail its next update."""

    def __init__(self, fake: FakeFabric, listener: object) -> None:
        self.fake = fake
        self.listener = listener
        self.dpids = {s.name: s.guid for s in fake.fabric.switches}
        self.names = {d: n for n, d in self.dpids.items()}
        self.up: set[int] = set()
        self.fail_next: set[int] = set()
        self.pushes = 0
        #: Called after every switch confirmed a "make" phase, before "break": make-before-break checks.
        #: Checks run when the make phase is confirmed everywhere, before the break phase is applied.
        self.between_phases: list[Callable[[], object]] = []
        #: Checks run after every wave of a make phase (`controller.sm.ordering`).
        self.after_each_wave: list[Callable[[], object]] = []
        #: Checks run after every switch of a make phase applied its changes; with any, a wave's switches
        #: apply in a seeded random order (real switches confirm in any order).
        self.after_each_switch: list[Callable[[], object]] = []
        self._order_rng = random.Random(1)

    def connected(self) -> set[int]:
        return set(self.up)

    def read_switch(self, dpid: int, timeout_s: float = 10.0) -> FakeSnapshot:
        switch = self.fake.switches[self.names[dpid]]
        ports = {
            ref.port: ref.port not in switch.ports_down
            for ref in self.fake.fabric.port_map
            if ref.node == switch.name
        }
        return FakeSnapshot(ports, list(switch.flows.values()), list(switch.groups.values()))

    def push(self, deltas: Mapping[int, SwitchDelta], phase: str, timeout_s: float = 10.0) -> dict[int, str]:
        problems: dict[int, str] = {}
        self.pushes += 1
        if phase == "break":  # the make phase is confirmed on every switch (all its waves)
            for check in self.between_phases:
                check()
        order = list(deltas.items())
        if phase == "make" and self.after_each_switch:  # switches apply in any order: try another one
            self._order_rng.shuffle(order)
        for dpid, delta in order:
            if dpid not in self.up:
                problems[dpid] = "not connected"
                continue
            if dpid in self.fail_next:
                self.fail_next.discard(dpid)
                problems[dpid] = "injected failure"
                continue
            switch = self.fake.switches[self.names[dpid]]
            assert switch.receive(encode(dpid, delta, phase)) == 1
            if phase == "make":
                for check in self.after_each_switch:
                    check()
        if phase == "make":
            for check in self.after_each_wave:
                check()
        return problems

    def probe_links(self, dpids: Iterable[int]) -> int:
        sent = 0
        for dpid in dpids:
            name = self.names[dpid]
            for ref, (_, far) in self.fake.fabric.port_map.items():
                if ref.node != name or far.node not in self.dpids or self.dpids[far.node] not in self.up:
                    continue
                if ref.port in self.fake.switches[name].ports_down:
                    continue
                sent += 1
                self.listener.link_seen(dpid, ref.port, self.dpids[far.node], far.port, time.time())  # type: ignore[attr-defined]
        return sent

    def slot_stats(self, timeout_s: float = 2.0) -> dict[tuple[int, FlowKey], int]:
        """No traffic flows through fake switches: every slot flow has matched nothing."""
        return {
            (self.dpids[name], key): 0
            for name, switch in self.fake.switches.items()
            for key, flow in switch.flows.items()
            if flow.table == 1
        }

    def port_stats(self, timeout_s: float = 2.0) -> dict[tuple[int, int], dict[str, int]]:
        return {
            (self.dpids[r.node], r.port): {"rx_packets": 0, "tx_packets": 0}
            for r in self.fake.fabric.port_map
            if r.node in self.dpids
        }
