"""Our fast flow-mod encoder writes exactly the bytes os-ken's serializer writes, for every shape we send;
and what we write reads back (flow stats) as the same intent."""

from __future__ import annotations

from typing import Any

import pytest
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller.sm.addressing import mac_str
from controller.sm.intents import COOKIE_MAGIC, FlowIntent, GroupIntent, GroupKind, match
from controller.southbound import openflow


class FakeDatapath:
    """What os-ken messages need of a datapath to serialize."""

    ofproto = ofp
    ofproto_parser = parser

    def __init__(self) -> None:
        self.xid = 100

    def set_xid(self, msg: Any) -> int:
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid


FLOWS = [
    FlowIntent(0, 100, match(eth_dst=0x02FAB1000001), (("output", 3),), COOKIE_MAGIC | 7),
    FlowIntent(0, 100, match(eth_dst=0x02FAB100BFFF), (("group", 0x7FFFFFFF),), COOKIE_MAGIC | 1),
    FlowIntent(0, 1000, match(eth_type=0x88CC), (("controller", 0xFFFF),), COOKIE_MAGIC),
    FlowIntent(3, 7, match(in_port=5, eth_dst=0x0200000000AA, eth_type=0x0800), (("output", 254),), 42),
    FlowIntent(0, 0, (), (("output", 1), ("group", 9)), 0),
    # multipath policies: a destination continuing in the slot table, a slot flow (masked source port), the
    # set's fallback, and a per-class (DSCP) override
    FlowIntent(
        0, 100, match(eth_dst=0x02FAB1000003), (("metadata", 0x5A5A5A5A), ("goto", 1)), COOKIE_MAGIC | 2
    ),
    FlowIntent(
        1,
        100,
        match(metadata=0x5A5A5A5A, eth_type=0x0800, ip_proto=17, udp_src=0x0030, udp_src_mask=0x00F0),
        (("group", 77),),
        COOKIE_MAGIC | 2,
    ),
    FlowIntent(1, 10, match(metadata=(1 << 64) - 1), (("output", 4),), COOKIE_MAGIC | 2),
    FlowIntent(0, 110, match(eth_dst=0x02FAB1000003, eth_type=0x0800, ip_dscp=26), (("group", 5),), 9),
    FlowIntent(2, 1, match(udp_src=0xFFFF, eth_type=0x0800, ip_proto=17), (("output", 1), ("goto", 3)), 1),
    # partition enforcement: allow (ingress port + assigned source and destination addresses), deny, guard
    FlowIntent(
        0,
        130,
        match(
            in_port=3,
            eth_src=0x02FAB1000001,
            eth_dst=0x02FAB1000002,
            eth_type=0x0800,
            ipv4_src=0x0A000001,
            ipv4_dst=0x0A00BFFF,
            ip_dscp=26,
        ),
        (("group", 5),),
        COOKIE_MAGIC | 3,
    ),
    FlowIntent(0, 120, match(in_port=3, eth_dst=0x02FAB1000002), (), COOKIE_MAGIC | 3),
    FlowIntent(0, 115, match(in_port=4), (), COOKIE_MAGIC | 3),
]


def _slow(dp: FakeDatapath, flow: FlowIntent, delete: bool) -> bytes:
    """The same message built with os-ken's classes only (masks as os-ken takes them: (value, mask))."""
    given = dict(flow.match)
    fields: dict[str, Any] = {}
    for n, v in given.items():
        if n.endswith("_mask"):
            continue
        value = mac_str(v) if n.startswith("eth_") and n != "eth_type" else v
        if n.startswith("ipv4_"):
            value = ".".join(str((v >> s) & 0xFF) for s in (24, 16, 8, 0))
        fields[n] = (value, given[n + "_mask"]) if n + "_mask" in given else value
    if delete:
        msg = parser.OFPFlowMod(
            dp, table_id=flow.table, command=ofp.OFPFC_DELETE_STRICT, priority=flow.priority,
            out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch(**fields),
        )  # fmt: skip
    else:
        actions = [
            parser.OFPActionOutput(a) if k == "output"
            else parser.OFPActionOutput(ofp.OFPP_CONTROLLER, a) if k == "controller"
            else parser.OFPActionGroup(a)
            for k, a in flow.actions if k not in ("metadata", "goto")
        ]  # fmt: skip
        instructions: list[Any] = []
        if actions or all(k not in ("metadata", "goto") for k, _ in flow.actions):
            instructions.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions))
        instructions += [
            parser.OFPInstructionWriteMetadata(a, (1 << 64) - 1) for k, a in flow.actions if k == "metadata"
        ]
        instructions += [parser.OFPInstructionGotoTable(a) for k, a in flow.actions if k == "goto"]
        msg = parser.OFPFlowMod(
            dp, cookie=flow.cookie, table_id=flow.table, command=ofp.OFPFC_ADD, priority=flow.priority,
            buffer_id=ofp.OFP_NO_BUFFER, flags=openflow.ADD_FLAGS, match=parser.OFPMatch(**fields),
            instructions=instructions,
        )  # fmt: skip
    dp.set_xid(msg)
    msg.serialize()
    return bytes(msg.buf)


@pytest.mark.parametrize("delete", [False, True])
@pytest.mark.parametrize("flow", FLOWS, ids=range(len(FLOWS)))
def test_fast_flow_mods_are_byte_identical_to_os_kens(flow: FlowIntent, delete: bool) -> None:
    dp = FakeDatapath()
    fast = openflow.flow_delete(dp, flow) if delete else openflow.flow_add(dp, flow)
    assert isinstance(fast, openflow.FastFlowMod)
    buf, xid = openflow.serialize(dp, [fast])
    assert xid == 101
    assert buf == _slow(FakeDatapath(), flow, delete)


GROUPS = [
    GroupIntent(5, GroupKind.FAST_FAILOVER, (3, 1, 2)),
    GroupIntent(6, GroupKind.SELECT, (1, 2)),
    GroupIntent(0xFFFFFF00, GroupKind.SELECT, tuple(range(1, 33))),
    GroupIntent(7, GroupKind.FAST_FAILOVER, (0xFFFFFF00,)),
]


@pytest.mark.parametrize("command", [ofp.OFPGC_ADD, ofp.OFPGC_MODIFY])
@pytest.mark.parametrize("group", GROUPS, ids=range(len(GROUPS)))
def test_fast_group_mods_are_byte_identical_to_os_kens(group: GroupIntent, command: int) -> None:
    fast, _ = openflow.serialize(FakeDatapath(), [openflow.group_mod(FakeDatapath(), group, command)])
    slow, _ = openflow.serialize(
        FakeDatapath(), [openflow.group_mod(FakeDatapath(), group, command, fast=False)]
    )
    assert fast == slow
    # and the fake switches' decoder (written from the spec, not from os-ken) reads the group back
    from tests.fakes import decode_group_mod

    assert decode_group_mod(fast) == (command, group)


def test_fast_group_deletes_are_byte_identical_to_os_kens() -> None:
    fast, _ = openflow.serialize(FakeDatapath(), [openflow.group_delete(FakeDatapath(), 77)])
    slow, _ = openflow.serialize(FakeDatapath(), [openflow.group_delete(FakeDatapath(), 77, fast=False)])
    assert fast == slow and len(fast) == 16


def test_written_flows_and_groups_read_back_as_the_same_intents() -> None:
    dp = FakeDatapath()
    for flow in FLOWS:
        buf, _ = openflow.serialize(dp, [openflow.flow_add(dp, flow)])
        msg = parser.OFPFlowMod.parser(dp, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(buf), 0, buf)
        stat = parser.OFPFlowStats(
            table_id=msg.table_id, priority=msg.priority, cookie=msg.cookie, match=msg.match,
            instructions=msg.instructions,
        )  # fmt: skip
        assert openflow.flow_from_stats(stat) == flow
    for group in (
        GroupIntent(5, GroupKind.FAST_FAILOVER, (3, 1, 2)),
        GroupIntent(6, GroupKind.SELECT, (1, 2)),
    ):
        mod = openflow.group_mod(dp, group, ofp.OFPGC_ADD, fast=False)
        desc = parser.OFPGroupDescStats(type_=mod.type, group_id=mod.group_id, buckets=mod.buckets)
        assert openflow.group_from_desc(desc) == group


def test_our_deletes_go_between_a_muting_and_a_restoring_async_config() -> None:
    """The break phase mutes flow-removed messages for deletes, deletes, restores (in that order: the switch
    applies messages in order), and deletes groups after flows.  The masks are the spec's defaults less
    one bit, as a fake switch decodes them from the bytes."""
    from controller.sm.intents import SwitchDelta
    from tests.fakes import FakeSwitch

    dp = FakeDatapath()
    delta = SwitchDelta("s", 1, delete_flows=tuple(FLOWS[:3]), delete_groups=(77,))
    messages = openflow.break_messages(dp, delta)
    kinds = [type(m).__name__ for m in messages]
    assert kinds[0] == kinds[-2] == "OFPSetAsync" and kinds[-1] == "FastGroupMod"
    quiet, restore = messages[0], messages[-2]
    assert quiet.flow_removed_mask[0] == restore.flow_removed_mask[0] & ~(1 << ofp.OFPRR_DELETE)
    assert restore.flow_removed_mask[0] & (1 << ofp.OFPRR_GROUP_DELETE)
    switch = FakeSwitch("s", flows={f.key: f for f in FLOWS[:3]})
    switch.groups[77] = GroupIntent(77, GroupKind.SELECT, (1, 2))
    buf, _ = openflow.serialize(dp, messages)
    switch.receive(buf)
    assert switch.flows == {} and switch.groups == {}
    assert switch.async_config == (
        openflow.PACKET_IN_MASK,
        openflow.PORT_STATUS_MASK,
        openflow.FLOW_REMOVED_ALL,
    )  # restored
    assert openflow.break_messages(dp, SwitchDelta("s", 1, delete_groups=(5,)))[0].__class__.__name__ == (
        "FastGroupMod"
    )  # nothing to mute without flow deletes
