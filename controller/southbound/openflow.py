"""The one place where intents become OpenFlow 1.3 messages, and switch replies become intents again.

Everything the subnet manager asks for (flows, fast-failover and select groups, deletes) and everything the
controller reads back on (re)connect (flow stats, group descriptions, port descriptions) passes through here,
so the rest of the controller never sees an os-ken message class.  Reading back is the exact inverse of
writing for our own entries; foreign entries still parse (with whatever fields they have) so a reconnect
diff can delete them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller.sm.addressing import ipv4_str, mac_str, parse_mac
from controller.sm.intents import Action, FlowIntent, GroupIntent, GroupKind, SwitchDelta, match

_MAC_FIELDS = frozenset({"eth_dst", "eth_src", "arp_sha", "arp_tha"})
#: IPv4 fields: plain integers in intents, dotted strings in os-ken (partition enforcement matches them).
_IPV4_FIELDS = frozenset({"ipv4_src", "ipv4_dst"})
_MASK = "_mask"
_ALL_ONES_64 = (1 << 64) - 1
_GROUP_TYPES = {GroupKind.FAST_FAILOVER: ofp.OFPGT_FF, GroupKind.SELECT: ofp.OFPGT_SELECT}
_GROUP_KINDS = {v: k for k, v in _GROUP_TYPES.items()}
OFPP_CONTROLLER = ofp.OFPP_CONTROLLER


def _of_match(fields: Iterable[tuple[str, int]]) -> Any:
    """Intent match -> OFPMatch; a `<field>_mask` companion makes `<field>` a masked match."""
    given = dict(fields)
    kwargs: dict[str, Any] = {}
    for name, value in given.items():
        if name.endswith(_MASK):
            continue
        shown: Any = mac_str(value) if name in _MAC_FIELDS else value
        if name in _IPV4_FIELDS:
            shown = ipv4_str(value)
        mask = given.get(name + _MASK)
        kwargs[name] = shown if mask is None else (shown, mask)
    return parser.OFPMatch(**kwargs)


def _of_actions(actions: Sequence[Action]) -> list[Any]:
    result: list[Any] = []
    for kind, arg in actions:
        if kind == "output":
            result.append(parser.OFPActionOutput(arg))
        elif kind == "controller":
            result.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, arg))
        elif kind == "group":
            result.append(parser.OFPActionGroup(arg))
        elif kind not in _INSTRUCTIONS:
            raise ValueError(f"no OpenFlow action for intent {kind!r}")
    return result


#: Intent "actions" that are OpenFlow instructions of their own, in the order they are written.
_INSTRUCTIONS = ("metadata", "goto")


def _of_instructions(actions: Sequence[Action]) -> list[Any]:
    """Apply-actions (if there are any actions), then write-metadata, then goto-table: one canonical order,
    so what is read back compares equal to what was written."""
    applied = _of_actions(actions)
    result: list[Any] = []
    if applied or not any(kind in _INSTRUCTIONS for kind, _ in actions):
        result.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, applied))
    for kind, arg in actions:
        if kind == "metadata":
            result.append(parser.OFPInstructionWriteMetadata(arg, _ALL_ONES_64))
    for kind, arg in actions:
        if kind == "goto":
            result.append(parser.OFPInstructionGotoTable(arg))
    return result


# --- fast flow-mod encoding -----------------------------------------------------------------------------
#
# os-ken serialises a flow-mod in ~70 us of Python; a reroute on a k=8 fat-tree sends hundreds and a first
# install thousands.  Our flow-mods have one shape (a few OXM fields, one apply-actions instruction), so they
# are packed with struct directly.  tests/test_openflow_encoding.py checks the bytes are identical to
# os-ken's for every shape we send; anything else goes through os-ken.

#: OXM field number and width of the fields we write (OpenFlow 1.3 §7.2.3.7).
_OXM = {
    "in_port": (0, 4),
    "metadata": (2, 8),
    "eth_dst": (3, 6),
    "eth_src": (4, 6),
    "eth_type": (5, 2),
    "ip_dscp": (8, 1),
    "ip_proto": (10, 1),
    "ipv4_src": (11, 4),
    "ipv4_dst": (12, 4),
    "udp_src": (15, 2),
}
#: Flags of every flow we add: tell us when it goes (see `flow_add`).
ADD_FLAGS = ofp.OFPFF_SEND_FLOW_REM
_FLOW_MOD = struct.Struct("!QQBBHHHIIIH2x")  # ofp_flow_mod after the header, before the match
_OFPT_FLOW_MOD = 14
_OFPT_GROUP_MOD = 15


#: Matches and action lists repeat across switches (a host's address is matched on every switch) and
#: across reroutes: their bytes are packed once (bounded; keys are the intents' own tuples).
_PACKED_LIMIT = 1 << 16


@lru_cache(maxsize=_PACKED_LIMIT)
def _pack_match(fields: Sequence[tuple[str, int]]) -> bytes:
    given = dict(fields)
    parts = []
    for name, value in sorted(given.items(), key=lambda f: _OXM[f[0].removesuffix(_MASK)][0]):
        if name.endswith(_MASK):
            continue
        number, width = _OXM[name]
        mask = given.get(name + _MASK)
        if mask is None:
            parts.append(struct.pack("!HBB", 0x8000, number << 1, width) + value.to_bytes(width, "big"))
        else:
            parts.append(
                struct.pack("!HBB", 0x8000, number << 1 | 1, 2 * width)
                + value.to_bytes(width, "big")
                + mask.to_bytes(width, "big")
            )
    body = b"".join(parts)
    length = 4 + len(body)
    return struct.pack("!HH", 1, length) + body + bytes((8 - length % 8) % 8)


@lru_cache(maxsize=_PACKED_LIMIT)
def _pack_actions(actions: Sequence[Action]) -> bytes:
    out = []
    for kind, arg in actions:
        if kind == "output":
            out.append(struct.pack("!HHIH6x", 0, 16, arg, ofp.OFPCML_MAX))
        elif kind == "controller":
            out.append(struct.pack("!HHIH6x", 0, 16, ofp.OFPP_CONTROLLER, arg))
        elif kind == "group":
            out.append(struct.pack("!HHI", 22, 8, arg))
    body = b"".join(out)
    instructions = b""
    if body or not any(kind in _INSTRUCTIONS for kind, _ in actions):
        instructions = struct.pack("!HH4x", ofp.OFPIT_APPLY_ACTIONS, 8 + len(body)) + body
    for kind, arg in actions:
        if kind == "metadata":
            instructions += struct.pack("!HH4xQQ", ofp.OFPIT_WRITE_METADATA, 24, arg, _ALL_ONES_64)
    for kind, arg in actions:
        if kind == "goto":
            instructions += struct.pack("!HHB3x", ofp.OFPIT_GOTO_TABLE, 8, arg)
    return instructions


class FastFlowMod:
    """A flow-mod as bytes, duck-typed like an os-ken message for `Datapath.set_xid` and `serialize`."""

    __slots__ = ("body", "buf", "xid")
    msg_type = _OFPT_FLOW_MOD

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.xid: int | None = None
        self.buf = b""

    def set_xid(self, xid: int) -> None:
        self.xid = xid

    def serialize(self) -> None:
        head = struct.pack("!BBHI", ofp.OFP_VERSION, self.msg_type, 8 + len(self.body), self.xid or 0)
        self.buf = head + self.body


class FastGroupMod(FastFlowMod):
    """A group-mod as bytes (a k=16 switch loss sends ~16,000 of them: os-ken's objects were a fifth of
    the encoding).  Keeps `command`, `type` and `group_id` for callers that look."""

    __slots__ = ("command", "group_id", "type")
    msg_type = _OFPT_GROUP_MOD

    def __init__(self, body: bytes, command: int, type_: int, group_id: int) -> None:
        super().__init__(body)
        self.command, self.type, self.group_id = command, type_, group_id


_GROUP_MOD = struct.Struct("!HBxI")  # ofp_group_mod after the header: command, type, pad, group_id
_BUCKET_OUTPUT = struct.Struct("!HHII4xHHIH6x")  # ofp_bucket (len 32) + one output action (len 16)


def _fast_group_mod(
    group_id: int, type_: int, command: int, ports: Sequence[int], weight: int
) -> FastGroupMod:
    buckets = b"".join(
        _BUCKET_OUTPUT.pack(32, weight, port, ofp.OFPG_ANY, ofp.OFPAT_OUTPUT, 16, port, ofp.OFPCML_MAX)
        for port in ports
    )
    return FastGroupMod(_GROUP_MOD.pack(command, type_, group_id) + buckets, command, type_, group_id)


def _fast_ok(flow: FlowIntent) -> bool:
    return _fast_match(flow.match) and _fast_actions(flow.actions)


@lru_cache(maxsize=_PACKED_LIMIT)
def _fast_match(fields: Sequence[tuple[str, int]]) -> bool:
    return all(name.removesuffix(_MASK) in _OXM for name, _ in fields)


@lru_cache(maxsize=_PACKED_LIMIT)
def _fast_actions(actions: Sequence[Action]) -> bool:
    return all(kind in ("output", "controller", "group", *_INSTRUCTIONS) for kind, _ in actions)


def _fast_flow_mod(flow: FlowIntent, command: int) -> FastFlowMod:
    delete = command == ofp.OFPFC_DELETE_STRICT
    fixed = _flow_mod_fixed(0 if delete else flow.cookie, flow.table, command, flow.priority)
    body = fixed + _pack_match(flow.match) + (b"" if delete else _pack_actions(flow.actions))
    return FastFlowMod(body)


@lru_cache(maxsize=_PACKED_LIMIT)
def _flow_mod_fixed(cookie: int, table: int, command: int, priority: int) -> bytes:
    """The fixed part of a flow-mod: a reroute sends thousands with a handful of (cookie, table,
    priority) between them (packing each was a third of the encoding)."""
    delete = command == ofp.OFPFC_DELETE_STRICT
    return _FLOW_MOD.pack(
        cookie,
        0,
        table,
        command,
        0,
        0,
        priority,
        ofp.OFP_NO_BUFFER,
        ofp.OFPP_ANY if delete else 0,
        ofp.OFPG_ANY if delete else 0,
        0 if delete else ADD_FLAGS,
    )


def flow_add(dp: Any, flow: FlowIntent, fast: bool = True) -> Any:
    """OFPFC_ADD: replaces an entry with the same table, priority and match in one step (make-before-break
    per entry: no instant without an entry).  Every entry asks for a flow-removed message (`ADD_FLAGS`),
    so that entries deleted behind the controller's back — `ovs-ofctl del-flows`, a wiped bridge — are
    noticed at once.  `fast=False` builds os-ken's message (benchmark baseline)."""
    if fast and _fast_ok(flow):
        return _fast_flow_mod(flow, ofp.OFPFC_ADD)
    instructions = _of_instructions(flow.actions)
    return parser.OFPFlowMod(
        dp,
        cookie=flow.cookie,
        table_id=flow.table,
        command=ofp.OFPFC_ADD,
        priority=flow.priority,
        buffer_id=ofp.OFP_NO_BUFFER,
        flags=ADD_FLAGS,
        match=_of_match(flow.match),
        instructions=instructions,
    )


def flow_delete(dp: Any, flow: FlowIntent) -> Any:
    if _fast_ok(flow):
        return _fast_flow_mod(flow, ofp.OFPFC_DELETE_STRICT)
    return parser.OFPFlowMod(
        dp,
        table_id=flow.table,
        command=ofp.OFPFC_DELETE_STRICT,
        priority=flow.priority,
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
        match=_of_match(flow.match),
    )


def group_mod(dp: Any, group: GroupIntent, command: int, fast: bool = True) -> Any:
    """One bucket per port, watching that port (fast failover picks the first live one); `fast=False`
    builds os-ken's message (the byte-identity tests' reference)."""
    weight = 1 if group.kind is GroupKind.SELECT else 0
    if fast:
        return _fast_group_mod(group.group_id, _GROUP_TYPES[group.kind], command, group.ports, weight)
    buckets = [
        parser.OFPBucket(
            weight=1 if group.kind is GroupKind.SELECT else 0,
            watch_port=port,
            watch_group=ofp.OFPG_ANY,
            actions=[parser.OFPActionOutput(port)],
        )
        for port in group.ports
    ]
    return parser.OFPGroupMod(dp, command, _GROUP_TYPES[group.kind], group.group_id, buckets)


def group_delete(dp: Any, group_id: int, fast: bool = True) -> Any:
    if fast:
        return _fast_group_mod(group_id, ofp.OFPGT_ALL, ofp.OFPGC_DELETE, (), 0)
    return parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_ALL, group_id, [])


def make_messages(dp: Any, delta: SwitchDelta) -> list[Any]:
    """Phase 1 of an update: groups first (flows may point at them), then flow adds/replacements, later
    tables first (a flow may continue in a later table: what it continues to must be there)."""
    messages = [group_mod(dp, g, ofp.OFPGC_ADD) for g in delta.add_groups]
    messages += [group_mod(dp, g, ofp.OFPGC_MODIFY) for g in delta.modify_groups]
    messages += [flow_add(dp, f) for f in sorted(delta.add_flows, key=lambda f: -f.table)]
    return messages


#: What the controller asks switches to tell it (OpenFlow 1.3's asynchronous configuration), as masks of
#: reasons for (master/equal, slave): packet-ins sent by a flow's action and table misses, every port
#: change, every flow removal.  The spec's and Open vSwitch's default; set explicitly around deletes.
PACKET_IN_MASK = ((1 << ofp.OFPR_NO_MATCH) | (1 << ofp.OFPR_ACTION), 0)
PORT_STATUS_MASK = ((1 << ofp.OFPPR_ADD) | (1 << ofp.OFPPR_DELETE) | (1 << ofp.OFPPR_MODIFY),) * 2
FLOW_REMOVED_ALL = (
    (1 << ofp.OFPRR_IDLE_TIMEOUT) | (1 << ofp.OFPRR_HARD_TIMEOUT) | (1 << ofp.OFPRR_DELETE)
    | (1 << ofp.OFPRR_GROUP_DELETE), 0,
)  # fmt: skip
#: ... without removals by a flow-mod delete: what the controller's own deletes would cause.
FLOW_REMOVED_QUIET = (FLOW_REMOVED_ALL[0] & ~(1 << ofp.OFPRR_DELETE), 0)


def async_config(dp: Any, flow_removed: tuple[int, int]) -> Any:
    return parser.OFPSetAsync(dp, list(PACKET_IN_MASK), list(PORT_STATUS_MASK), list(flow_removed))


def break_messages(dp: Any, delta: SwitchDelta) -> list[Any]:
    """Phase 2, after every switch confirmed phase 1: flows no longer wanted, then groups nothing uses
    (deleting a group first would delete the flows pointing at it).

    Every flow we add asks for a flow-removed message (`ADD_FLAGS`), and a delete we send would bring one
    back per flow — parsed by os-ken at ~70 us each ahead of the barrier reply, they held deletes to
    13,000/s (adds: 135,000/s).  So the deletes go between two asynchronous-configuration messages that
    mute, then restore, removals by delete.  Open vSwitch sends some removals after an RCU grace period,
    after the restore: 5-40 % of them still arrive, behind the barrier reply (harmless: the core ignores
    the removal of an entry it did not want).  Deletes: 126,000-153,000/s (`benchmarks/controlplane.py`).
    A flow deleted behind the controller's back in that window of a few milliseconds is found by the
    audit instead of at once.
    """
    messages = [flow_delete(dp, f) for f in delta.delete_flows]
    if messages:
        messages = [async_config(dp, FLOW_REMOVED_QUIET), *messages, async_config(dp, FLOW_REMOVED_ALL)]
    messages += [group_delete(dp, gid) for gid in delta.delete_groups]
    return messages


def barrier(dp: Any) -> Any:
    return parser.OFPBarrierRequest(dp)


def packet_out(dp: Any, port: int, data: bytes) -> Any:
    return parser.OFPPacketOut(
        dp,
        buffer_id=ofp.OFP_NO_BUFFER,
        in_port=ofp.OFPP_CONTROLLER,
        actions=[parser.OFPActionOutput(port)],
        data=data,
    )


def flow_stats_request(dp: Any) -> Any:
    return parser.OFPFlowStatsRequest(
        dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch()
    )


def table_stats_request(dp: Any, table: int) -> Any:
    """Flow statistics (with byte counters) of one table: the slot table's per-slot load."""
    return parser.OFPFlowStatsRequest(dp, 0, table, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())


def group_desc_request(dp: Any) -> Any:
    return parser.OFPGroupDescStatsRequest(dp, 0)


def port_desc_request(dp: Any) -> Any:
    return parser.OFPPortDescStatsRequest(dp, 0)


def port_stats_request(dp: Any) -> Any:
    return parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY)


def serialize(dp: Any, messages: Iterable[Any]) -> tuple[bytes, int]:
    """Messages as one buffer (one socket write instead of one queue hand-off each) and the last xid."""
    chunks: list[bytes] = []
    xid = 0
    for message in messages:
        xid = dp.set_xid(message)
        message.serialize()
        chunks.append(bytes(message.buf))
    return b"".join(chunks), xid


# --- reading back --------------------------------------------------------------------------------------


def _intent_match(of_match: Any) -> dict[str, int]:
    fields: dict[str, int] = {}
    for name, value in of_match.items():
        if isinstance(value, tuple):  # masked
            if name in _OXM and name not in _MAC_FIELDS | _IPV4_FIELDS:
                fields[name], fields[name + _MASK] = int(value[0]), int(value[1])
            else:  # not something we write; keep it distinct from ours
                fields[name] = hash(value) & 0x7FFFFFFF
        elif name in _MAC_FIELDS:
            fields[name] = parse_mac(value)
        elif name in _IPV4_FIELDS:
            fields[name] = int.from_bytes(bytes(int(b) for b in str(value).split(".")), "big")
        else:
            fields[name] = int(value)
    return fields


def flow_from_stats(stat: Any) -> FlowIntent:
    fields = _intent_match(stat.match)
    actions: list[Action] = []
    extra: list[Action] = []
    for instruction in stat.instructions:
        for action in getattr(instruction, "actions", []):
            if isinstance(action, parser.OFPActionOutput):
                if action.port == ofp.OFPP_CONTROLLER:
                    actions.append(("controller", action.max_len))
                else:
                    actions.append(("output", action.port))
            elif isinstance(action, parser.OFPActionGroup):
                actions.append(("group", action.group_id))
            else:
                actions.append((type(action).__name__, 0))
        if isinstance(instruction, parser.OFPInstructionWriteMetadata):
            full = instruction.metadata_mask == _ALL_ONES_64
            extra.append(("metadata", instruction.metadata) if full else ("WriteMetadataMasked", 0))
        elif isinstance(instruction, parser.OFPInstructionGotoTable):
            extra.append(("goto", instruction.table_id))
    extra.sort(key=lambda a: a[0] == "goto")  # canonical: metadata before goto
    return FlowIntent(stat.table_id, stat.priority, match(**fields), (*actions, *extra), stat.cookie)


def flow_removed(msg: Any) -> FlowIntent:
    """An OFPT_FLOW_REMOVED message as the entry it removed (no actions: the key and cookie identify it)."""
    return FlowIntent(msg.table_id, msg.priority, match(**_intent_match(msg.match)), (), msg.cookie)


_REMOVED_REASONS = {
    ofp.OFPRR_IDLE_TIMEOUT: "idle_timeout",
    ofp.OFPRR_HARD_TIMEOUT: "hard_timeout",
    ofp.OFPRR_DELETE: "delete",
    ofp.OFPRR_GROUP_DELETE: "group_delete",
}


def removed_reason(msg: Any) -> str:
    return _REMOVED_REASONS.get(msg.reason, f"reason {msg.reason}")


def group_from_desc(stat: Any) -> GroupIntent:
    kind = _GROUP_KINDS.get(stat.type)
    ports = tuple(
        action.port
        for bucket in stat.buckets
        for action in bucket.actions
        if isinstance(action, parser.OFPActionOutput)
    )
    # A group type we never write reads back as an impossible GroupIntent so the diff replaces it.
    return GroupIntent(stat.group_id, kind if kind is not None else GroupKind.SELECT, ports if kind else ())


def port_is_live(port: Any) -> bool:
    return not (int(port.state) & ofp.OFPPS_LINK_DOWN) and not (int(port.config) & ofp.OFPPC_PORT_DOWN)


def is_physical(port_no: int) -> bool:
    return 0 < port_no <= int(ofp.OFPP_MAX)


__all__ = [
    "ADD_FLAGS",
    "OFPP_CONTROLLER",
    "async_config",
    "barrier",
    "break_messages",
    "flow_add",
    "flow_delete",
    "flow_from_stats",
    "flow_removed",
    "flow_stats_request",
    "group_delete",
    "group_desc_request",
    "group_from_desc",
    "group_mod",
    "is_physical",
    "make_messages",
    "packet_out",
    "port_desc_request",
    "port_is_live",
    "port_stats_request",
    "removed_reason",
    "serialize",
    "table_stats_request",
]
