"""Southbound-neutral intents: what each switch should hold, and the difference to what it holds.

The subnet manager speaks in flows and groups with plain-integer fields; exactly one module
(`controller.southbound.openflow`) turns them into OpenFlow 1.3 messages, and the same intents drive the fake
switches of the unit tests and, later, the flow-level simulator.

Forwarding follows InfiniBand's linear forwarding tables: one flow per destination host port, matched on the
destination MAC (our DLID, see `addressing`), output to the LFT's port.  Where the engine found equally good
alternatives the flow points at a group instead:

* fast failover (default): buckets = LFT port first, then the alternatives; the switch moves to the next
  live port by itself when a port goes down, before the controller has even heard of it;
* select (multipath): the alternatives hashed per flow, dead ports skipped (each bucket watches its port).

Groups are content-addressed (id from kind + ports), so an unchanged group keeps its id across table
generations and unchanged flows never need rewriting.  Cookies carry the table generation that wrote a flow.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from controller.sm.addressing import AddressTable, HostAddress
from controller.sm.subnet import NO_PORT
from controller.sm.tables import RoutingTables

#: Top 16 bits of every fabriclab cookie; the low 48 carry the table generation.
COOKIE_MAGIC = 0xFAB1 << 48
COOKIE_MASK = 0xFFFF << 48
PRIORITY_CONTROL = 1000
PRIORITY_ROUTE = 100
ETH_TYPE_ARP = 0x0806
ETH_TYPE_LLDP = 0x88CC

#: A match is a sorted tuple of (OpenFlow field name, value); values are plain integers.
Match = tuple[tuple[str, int], ...]
#: An action is (kind, argument): ("output", port), ("group", id), ("controller", max_len).
Action = tuple[str, int]


def match(**fields: int) -> Match:
    return tuple(sorted(fields.items()))


def cookie_of(generation: int) -> int:
    return COOKIE_MAGIC | (generation & ((1 << 48) - 1))


def generation_of(cookie: int) -> int | None:
    """The generation in one of our cookies, None for someone else's."""
    if cookie & COOKIE_MASK != COOKIE_MAGIC:
        return None
    return cookie & ((1 << 48) - 1)


class GroupKind(StrEnum):
    FAST_FAILOVER = "ff"
    SELECT = "select"


FlowKey = tuple[int, int, Match]


class FlowIntent(NamedTuple):
    """One flow entry.  A NamedTuple, not a dataclass: a k=8 fabric has 10k of these per computation and
    tuple construction is several times cheaper than a frozen dataclass's."""

    table: int
    priority: int
    match: Match
    actions: tuple[Action, ...]
    cookie: int = 0

    @property
    def key(self) -> FlowKey:
        """What identifies a flow entry on a switch (OpenFlow's strict match)."""
        return (self.table, self.priority, self.match)

    def same_behaviour(self, other: FlowIntent) -> bool:
        return self.key == other.key and self.actions == other.actions


@dataclass(frozen=True, slots=True)
class GroupIntent:
    group_id: int
    kind: GroupKind
    #: One bucket per port: output there, watching that port's liveness.
    ports: tuple[int, ...]


@dataclass(frozen=True)
class SwitchProgram:
    switch: str
    dpid: int
    flows: Mapping[FlowKey, FlowIntent]
    groups: Mapping[int, GroupIntent]

    @classmethod
    def of(
        cls, switch: str, dpid: int, flows: Iterable[FlowIntent], groups: Iterable[GroupIntent]
    ) -> SwitchProgram:
        return cls(switch, dpid, {f.key: f for f in flows}, {g.group_id: g for g in groups})


@dataclass(frozen=True)
class SwitchDelta:
    """Changes for one switch, in make-before-break order: groups and flows to add (an add with an existing
    key replaces that entry atomically), then, once every switch confirmed those, flows and groups to
    delete."""

    switch: str
    dpid: int
    add_groups: tuple[GroupIntent, ...] = ()
    modify_groups: tuple[GroupIntent, ...] = ()
    add_flows: tuple[FlowIntent, ...] = ()
    delete_flows: tuple[FlowIntent, ...] = ()
    delete_groups: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.add_groups or self.modify_groups or self.add_flows or self.delete_flows or self.delete_groups
        )

    @property
    def n_messages(self) -> int:
        return (
            len(self.add_groups)
            + len(self.modify_groups)
            + len(self.add_flows)
            + len(self.delete_flows)
            + len(self.delete_groups)
        )


@dataclass(frozen=True)
class ForwardingOptions:
    fast_failover: bool = True
    multipath: bool = False


def diff(installed: SwitchProgram | None, desired: SwitchProgram) -> SwitchDelta:
    """What turns `installed` (what the switch holds, as read back or last confirmed) into `desired`."""
    have_flows = installed.flows if installed is not None else {}
    have_groups = installed.groups if installed is not None else {}
    add_groups = tuple(g for gid, g in sorted(desired.groups.items()) if gid not in have_groups)
    modify_groups = tuple(
        g for gid, g in sorted(desired.groups.items()) if gid in have_groups and have_groups[gid] != g
    )
    add_flows = tuple(
        f
        for key, f in desired.flows.items()
        if key not in have_flows or not have_flows[key].same_behaviour(f)
    )
    delete_flows = tuple(f for key, f in have_flows.items() if key not in desired.flows)
    delete_groups = tuple(sorted(gid for gid in have_groups if gid not in desired.groups))
    return SwitchDelta(
        desired.switch, desired.dpid, add_groups, modify_groups, add_flows, delete_flows, delete_groups
    )


def applied(installed: SwitchProgram | None, delta: SwitchDelta) -> SwitchProgram:
    """The switch's contents after `delta` was confirmed: unchanged flows keep the cookie that wrote them."""
    flows = dict(installed.flows) if installed is not None else {}
    groups = dict(installed.groups) if installed is not None else {}
    for group in delta.add_groups + delta.modify_groups:
        groups[group.group_id] = group
    for flow in delta.add_flows:
        flows[flow.key] = flow
    for flow in delta.delete_flows:
        flows.pop(flow.key, None)
    for gid in delta.delete_groups:
        groups.pop(gid, None)
    return SwitchProgram(delta.switch, delta.dpid, flows, groups)


def control_flows(cookie: int) -> list[FlowIntent]:
    """LLDP (link discovery) and ARP (answered by the controller: no flooding in a looped fabric)."""
    to_controller: tuple[Action, ...] = (("controller", 0xFFFF),)
    return [
        FlowIntent(0, PRIORITY_CONTROL, match(eth_type=ETH_TYPE_LLDP), to_controller, cookie),
        FlowIntent(0, PRIORITY_CONTROL, match(eth_type=ETH_TYPE_ARP), to_controller, cookie),
    ]


@dataclass
class _GroupIds:
    """Content-addressed group ids, probing deterministically on (rare) crc collisions."""

    by_content: dict[tuple[GroupKind, tuple[int, ...]], int] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    def get(self, kind: GroupKind, ports: tuple[int, ...]) -> int:
        content = (kind, ports)
        gid = self.by_content.get(content)
        if gid is None:
            gid = (zlib.crc32(f"{kind.value}:{','.join(map(str, ports))}".encode()) & 0x7FFFFFFF) or 1
            while gid in self.taken:
                gid = (gid + 1) & 0x7FFFFFFF or 1
            self.by_content[content] = gid
            self.taken.add(gid)
        return gid


def compile_programs(
    tables: RoutingTables,
    addresses: AddressTable,
    dpids: Mapping[str, int],
    options: ForwardingOptions,
    generation: int,
    previous: tuple[RoutingTables, Mapping[str, SwitchProgram]] | None = None,
) -> dict[str, SwitchProgram]:
    """Forwarding tables + addresses -> the flows and groups of every switch in the routed subnet.

    With `previous` (the last tables and their programs), a switch whose table row and alternatives are
    unchanged keeps its program object: after a single failure most switches are untouched, and
    compiling only the changed ones keeps reroutes off the critical path."""
    subnet = tables.subnet
    cookie = cookie_of(generation)
    ep_of_lid = {int(lid): i for i, lid in enumerate(subnet.ep_lids)}
    present = [(a, ep_of_lid[a.lid]) for a in addresses if a.lid in ep_of_lid]
    ep_target = subnet.ep_switch.tolist()
    reusable = previous is not None and _same_shape(previous[0], tables)
    programs: dict[str, SwitchProgram] = {}
    for s, name in enumerate(subnet.switch_names):
        if reusable and previous is not None and name in previous[1]:
            old = previous[0]
            if np.array_equal(old.lft[s], tables.lft[s]) and np.array_equal(old.alt[s], tables.alt[s]):
                programs[name] = previous[1][name]
                continue
        programs[name] = _compile_switch(tables, s, name, dpids[name], present, ep_target, options, cookie)
    return programs


def _same_shape(old: RoutingTables, new: RoutingTables) -> bool:
    a, b = old.subnet, new.subnet
    return (
        a.switch_names == b.switch_names
        and old.lft.shape == new.lft.shape
        and old.alt.shape == new.alt.shape
        and np.array_equal(a.ep_lids, b.ep_lids)
        and np.array_equal(a.ep_switch, b.ep_switch)
    )


def _compile_switch(
    tables: RoutingTables,
    s: int,
    name: str,
    dpid: int,
    present: list[tuple[HostAddress, int]],
    ep_target: list[int],
    options: ForwardingOptions,
    cookie: int,
) -> SwitchProgram:
    n_ports = tables.subnet.n_ports
    row = tables.lft[s].tolist()
    alt_rows: list[list[int]] | None = None
    flows = control_flows(cookie)
    groups: dict[int, GroupIntent] = {}
    ids = _GroupIds()
    actions: dict[tuple[int, int], Action] = {}
    use_groups = options.multipath or options.fast_failover
    for address, ep in present:
        port = row[address.lid]
        if port in (NO_PORT, 0):
            continue
        target = ep_target[ep]
        action = actions.get((port, target))
        if action is None:
            action = ("output", port)
            if target != s and use_groups:
                if alt_rows is None:
                    alt_rows = np.unpackbits(tables.alt[s], axis=1, count=n_ports).tolist()
                alternatives = [p for p, bit in enumerate(alt_rows[target]) if bit]
                if len(alternatives) > 1:
                    if options.multipath:
                        kind, ports = GroupKind.SELECT, tuple(sorted(alternatives))
                    else:
                        kind = GroupKind.FAST_FAILOVER
                        ports = (port, *sorted(p for p in alternatives if p != port))
                    gid = ids.get(kind, ports)
                    groups[gid] = GroupIntent(gid, kind, ports)
                    action = ("group", gid)
            actions[(port, target)] = action
        flows.append(FlowIntent(0, PRIORITY_ROUTE, (("eth_dst", address.mac),), (action,), cookie))
    return SwitchProgram.of(name, dpid, flows, groups.values())


def rollout(
    installed: Mapping[str, SwitchProgram | None], desired: Mapping[str, SwitchProgram]
) -> dict[str, SwitchDelta]:
    """Non-empty deltas for the switches in `installed` (the ones connected).  Apply every delta's adds
    on every switch, confirm, then the deletes: no packet meets a half-updated path that drops it."""
    deltas: dict[str, SwitchDelta] = {}
    for switch, have in sorted(installed.items()):
        want = desired.get(switch)
        if want is None:
            continue
        delta = diff(have, want)
        if not delta.empty:
            deltas[switch] = delta
    return deltas


__all__ = [
    "COOKIE_MAGIC",
    "COOKIE_MASK",
    "ETH_TYPE_ARP",
    "ETH_TYPE_LLDP",
    "PRIORITY_CONTROL",
    "PRIORITY_ROUTE",
    "Action",
    "FlowIntent",
    "FlowKey",
    "ForwardingOptions",
    "GroupIntent",
    "GroupKind",
    "Match",
    "SwitchDelta",
    "SwitchProgram",
    "applied",
    "compile_programs",
    "control_flows",
    "cookie_of",
    "diff",
    "generation_of",
    "match",
    "rollout",
]
