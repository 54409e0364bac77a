"""Partition enforcement as southbound-neutral flows, at the ingress edge switch.

InfiniBand switches may check P_Keys on their ports ("partition enforcement"); on this Ethernet fabric the
edge switch a host is cabled to does the equivalent, before a packet reaches the fabric:

* **allow** (priority `PRIORITY_PKEY_ALLOW`): one flow per permitted (source, destination) pair, matched on
  the ingress port *and* the addresses the SM assigned the source (MAC and IPv4) *and* the destination's —
  with the same actions as the destination's forwarding flow on that switch (per-class overrides too, one
  priority higher).  A host that forges another host's MAC or IP matches no allow flow of its port.
* **IPv4 guard** (`PRIORITY_PKEY_GUARD_IP`), then **L2 allow** (`PRIORITY_PKEY_ALLOW_L2`): IPv4 that no allow
  flow matched is dropped; other frames of a permitted pair (RoCE v1, raw Ethernet) pass on the ingress
  port and both MACs.
* **deny** (`PRIORITY_PKEY_DENY`): one flow per denied pair (ingress port, destination MAC), no actions: the
  drop is counted per pair, so per partition (see `drop_owner`).
* **guard** (`PRIORITY_PKEY_GUARD`): one flow per host port, no actions: forged source MACs, unknown
  destinations.

ARP and LLDP go to the controller above all of these (`PRIORITY_CONTROL`), and its ARP answers follow
`Partitions.permitted`, so no host learns another tenant's address either.

The layer is a pure transform over compiled programs: partition flows are stripped and derived again from
the switch's own forwarding flows, so it composes with every routing policy and with program reuse, and a
membership change touches only the pairs that changed (the diff of two programs).  Cost: each edge switch
holds hosts-on-switch × (hosts − 1) allow/deny flows — fine for the emulated fabrics (k=4: 30 per leaf),
quadratic at the thousands of hosts the flow-level simulator models, where it is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.sm.addressing import AddressTable, HostAddress
from controller.sm.intents import (
    ETH_TYPE_IPV4,
    PRIORITY_CLASS,
    PRIORITY_ROUTE,
    FlowIntent,
    SwitchProgram,
    match,
)
from controller.sm.partitions import Partitions
from topologies.model import Fabric

PRIORITY_PKEY_GUARD = 115
#: Non-IPv4 frames (RoCE v1's 0x8915, other L2 protocols) of a permitted pair: MACs and ingress port.
PRIORITY_PKEY_ALLOW_L2 = 116
#: IPv4 from a host port that no allow flow matched: a forged or unknown IP address.
PRIORITY_PKEY_GUARD_IP = 118
PRIORITY_PKEY_DENY = 120
PRIORITY_PKEY_ALLOW = 130
#: An allow flow of a per-class (DSCP) override: one above the plain allow flows.
PRIORITY_PKEY_ALLOW_CLASS = 131
PARTITION_PRIORITIES = frozenset(
    {PRIORITY_PKEY_GUARD, PRIORITY_PKEY_ALLOW_L2, PRIORITY_PKEY_GUARD_IP, PRIORITY_PKEY_DENY,
     PRIORITY_PKEY_ALLOW, PRIORITY_PKEY_ALLOW_CLASS}
)  # fmt: skip
#: The flows that drop (their counters are the isolation evidence).
DROP_PRIORITIES = frozenset({PRIORITY_PKEY_GUARD, PRIORITY_PKEY_GUARD_IP, PRIORITY_PKEY_DENY})


@dataclass(frozen=True)
class Attachment:
    """A host port and the edge switch port it is cabled to."""

    address: HostAddress
    switch: str
    port: int


def attachments(fabric: Fabric, addresses: AddressTable) -> tuple[Attachment, ...]:
    found = []
    for address in addresses:
        peer = fabric.peer(address.host, address.port)
        if peer is not None and fabric.nodes[peer.node].is_switch:
            found.append(Attachment(address, peer.node, peer.port))
    return tuple(found)


def is_partition_flow(flow: FlowIntent) -> bool:
    return flow.table == 0 and flow.priority in PARTITION_PRIORITIES


def enforce(
    programs: Mapping[str, SwitchProgram],
    partitions: Partitions | None,
    attached: tuple[Attachment, ...],
    cookie: int,
) -> dict[str, SwitchProgram]:
    """`programs` with the partition layer of `partitions` (none when None or OpenSM's no-file default).
    Idempotent: a program that already has a partition layer gets it replaced."""
    enforcing = partitions is not None and partitions.configured
    by_switch: dict[str, list[Attachment]] = {}
    for a in attached:
        by_switch.setdefault(a.switch, []).append(a)
    out: dict[str, SwitchProgram] = {}
    for name, program in programs.items():
        mine = by_switch.get(name, []) if enforcing else []
        has_layer = not program.priorities.isdisjoint(PARTITION_PRIORITIES)
        if not mine and not has_layer:
            out[name] = program
            continue
        flows = [f for f in program.flows.values() if not is_partition_flow(f)]
        if mine:
            assert partitions is not None
            flows += _layer(flows, partitions, mine, attached, cookie)
        out[name] = SwitchProgram.of(name, program.dpid, flows, program.groups.values())
    return out


def _layer(
    flows: list[FlowIntent],
    partitions: Partitions,
    mine: list[Attachment],
    attached: tuple[Attachment, ...],
    cookie: int,
) -> list[FlowIntent]:
    routes: dict[int, FlowIntent] = {}
    classes: dict[int, list[FlowIntent]] = {}
    for f in flows:
        if f.table != 0:
            continue
        fields = dict(f.match)
        if f.priority == PRIORITY_ROUTE and len(fields) == 1 and "eth_dst" in fields:
            routes[fields["eth_dst"]] = f
        elif f.priority == PRIORITY_CLASS and "ip_dscp" in fields:
            classes.setdefault(fields["eth_dst"], []).append(f)
    layer: list[FlowIntent] = []
    peers = partitions.peers
    for src in mine:
        s = src.address
        mine_peers = peers.get(s.host, frozenset())
        for dst in attached:
            d = dst.address
            if d.host == s.host:
                continue
            if d.host not in mine_peers or d.mac not in routes:
                deny = (("eth_dst", d.mac), ("in_port", src.port))  # = match(...): fields in name order
                layer.append(FlowIntent(0, PRIORITY_PKEY_DENY, deny, (), cookie))
                continue
            allow = (("eth_dst", d.mac), ("eth_src", s.mac), ("eth_type", ETH_TYPE_IPV4),
                     ("in_port", src.port), ("ipv4_dst", d.ipv4), ("ipv4_src", s.ipv4))  # fmt: skip
            layer.append(FlowIntent(0, PRIORITY_PKEY_ALLOW, allow, routes[d.mac].actions, cookie))
            l2 = (("eth_dst", d.mac), ("eth_src", s.mac), ("in_port", src.port))
            layer.append(FlowIntent(0, PRIORITY_PKEY_ALLOW_L2, l2, routes[d.mac].actions, cookie))
            for c in classes.get(d.mac, ()):
                dscp = dict(c.match)["ip_dscp"]
                key = match(**dict(allow), ip_dscp=dscp)
                layer.append(FlowIntent(0, PRIORITY_PKEY_ALLOW_CLASS, key, c.actions, cookie))
        guard_ip = (("eth_type", ETH_TYPE_IPV4), ("in_port", src.port))
        layer.append(FlowIntent(0, PRIORITY_PKEY_GUARD_IP, guard_ip, (), cookie))
        layer.append(FlowIntent(0, PRIORITY_PKEY_GUARD, match(in_port=src.port), (), cookie))
    return layer


def arp_allowed(
    partitions: Partitions | None, attached: tuple[Attachment, ...], switch: str | None, in_port: int,
    target_host: str,
) -> bool:  # fmt: skip
    """May the controller answer an ARP request that arrived on `switch`:`in_port` for `target_host`'s
    address?  The asker is whoever is cabled to that port (not whoever the request claims to be), so a host
    forging another's sender address learns nothing more than its own partitions allow."""
    if partitions is None or not partitions.configured:
        return True
    asker = next((a.address.host for a in attached if a.switch == switch and a.port == in_port), None)
    return asker is not None and partitions.permitted(asker, target_host)


def drop_owner(
    flow: FlowIntent, switch: str, partitions: Partitions, attached: tuple[Attachment, ...]
) -> tuple[str, tuple[int, ...]] | None:
    """Whose drop a partition flow's counter is: ("denied", P_Keys of the destination's partitions) for a
    deny flow — the tenants it protected — ("forged", ()) for a guard flow; None for other flows."""
    if flow.table != 0 or flow.priority not in DROP_PRIORITIES:
        return None
    if flow.priority != PRIORITY_PKEY_DENY:
        return ("forged", ())
    mac = dict(flow.match).get("eth_dst")
    host = next((a.address.host for a in attached if a.address.mac == mac), None)
    keys = tuple(k for k, _ in partitions.keys_of(host)) if host is not None else ()
    return ("denied", keys)


__all__ = [
    "DROP_PRIORITIES",
    "PARTITION_PRIORITIES",
    "PRIORITY_PKEY_ALLOW",
    "PRIORITY_PKEY_ALLOW_CLASS",
    "PRIORITY_PKEY_ALLOW_L2",
    "PRIORITY_PKEY_DENY",
    "PRIORITY_PKEY_GUARD",
    "PRIORITY_PKEY_GUARD_IP",
    "Attachment",
    "arp_allowed",
    "attachments",
    "drop_owner",
    "enforce",
    "is_partition_flow",
]
