"""Southbound-neutral intents: what each switch should hold, and the difference to what it holds.

The subnet manager speaks in flows and groups with plain-integer fields; exactly one module
(`controller.southbound.openflow`) turns them into OpenFlow 1.3 messages, and the same intents drive the fake
switches of the unit tests and, later, the flow-level simulator.

Forwarding follows InfiniBand's linear forwarding tables: one flow per destination host port, matched on the
destination MAC (our DLID, see `addressing`), output to the LFT's port.  Where the engine found equally good
alternatives, what the flow does depends on the routing policy (`controller.sm.policies`):

* ``static``: a fast-failover group (default) — buckets = LFT port first, then the alternatives; the switch
  moves to the next live port by itself when a port goes down, before the controller has even heard of it;
* multipath (``ecmp``, ``spray``, ``adaptive``): the flow tags the packet with its *set* of equal-cost ports
  (OpenFlow metadata) and continues in table 1, the slot table: for UDP, 16 flows per set match a 4-bit
  window of the source port (masked match) and send each slot to the port the assignment gives it — through
  a fast-failover group that falls back to the set's other ports; other traffic (ICMP, TCP) takes a select
  group over the set (OVS hashes those on addresses), whose buckets watch their ports.

Per traffic class (DSCP) a fabric can keep some traffic static while the rest is multipath: a flow per
(destination, DSCP) overrides the destination's flow one priority higher.

Groups and sets are content-addressed (id from kind + ports), so an unchanged group keeps its id across
table generations and unchanged flows never need rewriting.  Cookies carry the table generation that wrote
a flow.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from controller.sm.addressing import AddressTable, HostAddress
from controller.sm.policies import SLOTS, Assignment, even_assignment, slot_shift
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables

#: Top 16 bits of every fabriclab cookie; the low 48 carry the table generation.
COOKIE_MAGIC = 0xFAB1 << 48
COOKIE_MASK = 0xFFFF << 48
#: The largest table generation a cookie can carry.
MAX_GENERATION = (1 << 48) - 1


class GenerationExhausted(ValueError):
    """The table generation counter reached the top of the cookie's 48 bits."""


PRIORITY_CONTROL = 1000
PRIORITY_ROUTE = 100
#: Per-class overrides of a destination's flow (one priority above it).
PRIORITY_CLASS = 110
#: Slot flows in table 1, and the set's fallback for traffic that is not UDP.
PRIORITY_SLOT = 100
PRIORITY_SET_FALLBACK = 10
SLOT_TABLE = 1
ETH_TYPE_ARP = 0x0806
ETH_TYPE_LLDP = 0x88CC
ETH_TYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17

#: A match is a sorted tuple of (OpenFlow field name, value); values are plain integers.  A masked field
#: has a companion ``<field>_mask`` entry (``udp_src=0x30, udp_src_mask=0xF0``).
Match = tuple[tuple[str, int], ...]
#: An action is (kind, argument): ("output", port), ("group", id), ("controller", max_len); and two that
#: become OpenFlow instructions: ("metadata", value) (write all 64 bits) and ("goto", table).
Action = tuple[str, int]


def match(**fields: int) -> Match:
    return tuple(sorted(fields.items()))


def cookie_of(generation: int) -> int:
    """The cookie of a generation's flows.  Never wraps: a wrapped cookie would look older than flows that
    are already on the switches, and reconciliation would keep stale ones or delete fresh ones."""
    if not 0 <= generation <= MAX_GENERATION:
        raise GenerationExhausted(f"generation {generation} does not fit the cookie's 48 bits")
    return COOKIE_MAGIC | generation


def generation_of(cookie: int) -> int | None:
    """The generation in one of our cookies, None for someone else's."""
    if cookie & COOKIE_MASK != COOKIE_MAGIC:
        return None
    return cookie & ((1 << 48) - 1)


class GroupKind(StrEnum):
    FAST_FAILOVER = "ff"
    SELECT = "select"
    #: Not a group: the content-addressed id of a set of equal-cost ports, carried in OpenFlow metadata.
    PORT_SET = "set"


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
    """How tables become flows.  `policy` names a routing policy; `multipath` is derived from it (True for
    every policy but ``static``) and, given alone, is the legacy switch: True means ``ecmp``.  `classes`
    are per-DSCP exceptions (see `PolicyChoice`)."""

    fast_failover: bool = True
    multipath: bool = False
    policy: str = ""
    classes: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        policy = self.policy or ("ecmp" if self.multipath else "static")
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "multipath", policy != "static")

    @property
    def slot_tables(self) -> bool:
        """Some traffic uses the slot tables (the fabric's policy or a class's)."""
        return self.multipath or any(name != "static" for _, name in self.classes)

    @property
    def tables_key(self) -> tuple[object, ...]:
        """What the switches' programs depend on: ecmp, spray and adaptive compile alike (with even
        weights), so a change among them reprograms nothing."""
        return (self.fast_failover, self.multipath, tuple((d, p != "static") for d, p in self.classes))


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


#: Per switch: each set of equal-cost ports its slot table serves -> the slot assignment installed.
Weights = Mapping[str, Mapping[tuple[int, ...], Assignment]]
#: Per switch: each set -> its 16 slot flows' keys, in slot order.
SlotKeys = dict[str, dict[tuple[int, ...], tuple[FlowKey, ...]]]


def compile_programs(
    tables: RoutingTables,
    addresses: AddressTable,
    dpids: Mapping[str, int],
    options: ForwardingOptions,
    generation: int,
    previous: tuple[RoutingTables, Mapping[str, SwitchProgram]] | None = None,
    weights: Weights | None = None,
    previous_weights: Weights | None = None,
    previous_keys: SlotKeys | None = None,
) -> tuple[dict[str, SwitchProgram], dict[str, dict[tuple[int, ...], Assignment]], SlotKeys]:
    """Forwarding tables + addresses -> the flows and groups of every switch in the routed subnet, the
    slot assignment of every set (from `weights` where given, else even) and its slot flows' keys.

    With `previous` (the last tables and their programs), a switch whose table row, alternatives and
    weights are unchanged keeps its program object: after a single failure most switches are untouched,
    and compiling only the changed ones keeps reroutes off the critical path."""
    subnet = tables.subnet
    cookie = cookie_of(generation)
    ep_of_lid = {int(lid): i for i, lid in enumerate(subnet.ep_lids)}
    present = [(a, ep_of_lid[a.lid]) for a in addresses if a.lid in ep_of_lid]
    ep_target = subnet.ep_switch.tolist()
    reusable = previous is not None and _same_shape(previous[0], tables)
    levels = switch_levels(subnet) if options.slot_tables else None
    weights = weights or {}
    programs: dict[str, SwitchProgram] = {}
    assignments: dict[str, dict[tuple[int, ...], Assignment]] = {}
    keys: SlotKeys = {}
    for s, name in enumerate(subnet.switch_names):
        mine = weights.get(name, {})
        if reusable and previous is not None and name in previous[1]:
            old = previous[0]
            same_weights = _skewed((previous_weights or {}).get(name, {})) == _skewed(mine)
            if (
                same_weights
                and np.array_equal(old.lft[s], tables.lft[s])
                and np.array_equal(old.alt[s], tables.alt[s])
            ):
                programs[name] = previous[1][name]
                installed = (previous_weights or {}).get(name) or mine  # what that program was compiled with
                if installed:
                    assignments[name] = dict(installed)
                    keys[name] = (previous_keys or {}).get(name, {})
                continue
        shift = slot_shift(int(levels[s])) if levels is not None else 0
        programs[name], used, slot_keys = _compile_switch(
            tables, s, name, dpids[name], present, ep_target, options, cookie, shift, mine
        )
        if used:
            assignments[name] = used
            keys[name] = slot_keys
    return programs, assignments, keys


def _skewed(sets: Mapping[tuple[int, ...], Assignment]) -> dict[tuple[int, ...], Assignment]:
    """The sets whose assignment is not the even one (what makes two programs differ)."""
    return {ports: a for ports, a in sets.items() if a != even_assignment(ports)}


def switch_levels(subnet: Subnet) -> npt.NDArray[np.int64]:
    """Hops from each switch to the nearest switch with hosts (leaves 0, aggregation 1, ...): which window
    of the source port the switch's slot table reads."""
    n = subnet.n_switches
    level = np.where(subnet.has_hosts, 0, -1).astype(np.int64)
    frontier: npt.NDArray[np.intp] = np.flatnonzero(subnet.has_hosts)
    depth = 0
    while frontier.size:
        depth += 1
        nbrs = subnet.nbr[frontier]
        nxt = np.unique(nbrs[nbrs >= 0]).astype(np.intp)
        nxt = nxt[level[nxt] < 0]
        level[nxt] = depth
        frontier = nxt
    level[level < 0] = 0  # switches no host reaches: never on a path
    assert level.shape == (n,)
    return level


def _same_shape(old: RoutingTables, new: RoutingTables) -> bool:
    a, b = old.subnet, new.subnet
    return (
        a.switch_names == b.switch_names
        and old.lft.shape == new.lft.shape
        and old.alt.shape == new.alt.shape
        and np.array_equal(a.ep_lids, b.ep_lids)
        and np.array_equal(a.ep_switch, b.ep_switch)
    )


def failover_ports(first: int, ports: tuple[int, ...]) -> tuple[int, ...]:
    """Buckets of a fast-failover group led by `first`: then the set's other ports in rotation after it, so
    the slots of different dead ports fall back to different neighbours."""
    if first not in ports:
        return (first, *ports)
    i = ports.index(first)
    return ports[i:] + ports[:i]


def slot_match(set_id: int, slot: int, shift: int) -> Match:
    mask = (SLOTS - 1) << shift
    return match(
        metadata=set_id,
        eth_type=ETH_TYPE_IPV4,
        ip_proto=IP_PROTO_UDP,
        udp_src=(slot << shift) & mask,
        udp_src_mask=mask,
    )


class _Builder:
    """One switch's program under construction: flows, groups, sets."""

    def __init__(self, options: ForwardingOptions, cookie: int, shift: int,
                 weights: Mapping[tuple[int, ...], Assignment]) -> None:  # fmt: skip
        self.options, self.cookie, self.shift, self.weights = options, cookie, shift, weights
        self.flows = control_flows(cookie)
        self.groups: dict[int, GroupIntent] = {}
        self.ids = _GroupIds()
        self.sets: dict[tuple[int, ...], int] = {}
        self.used: dict[tuple[int, ...], Assignment] = {}
        #: Each set's slot flows, in slot order (their byte counters are adaptive routing's per-slot load).
        self.slot_keys: dict[tuple[int, ...], tuple[FlowKey, ...]] = {}

    def group(self, kind: GroupKind, ports: tuple[int, ...]) -> Action:
        gid = self.ids.get(kind, ports)
        self.groups[gid] = GroupIntent(gid, kind, ports)
        return ("group", gid)

    def to_port(self, port: int, ports: tuple[int, ...]) -> Action:
        """Out of `port`, through a fast-failover group over `ports` when failover is on."""
        if self.options.fast_failover and len(ports) > 1:
            return self.group(GroupKind.FAST_FAILOVER, failover_ports(port, ports))
        return ("output", port)

    def static(self, port: int, alternatives: tuple[int, ...]) -> Action:
        """The LFT's port: a fast-failover group leading with it, then the sorted alternatives."""
        if self.options.fast_failover and len(alternatives) > 1:
            others = sorted(p for p in alternatives if p != port)
            return self.group(GroupKind.FAST_FAILOVER, (port, *others))
        return ("output", port)

    def slot_set(self, ports: tuple[int, ...]) -> int:
        """The set's id, compiling its slot table the first time (table 1)."""
        set_id = self.sets.get(ports)
        if set_id is not None:
            return set_id
        set_id = self.ids.get(GroupKind.PORT_SET, ports)
        self.sets[ports] = set_id
        assignment = self.weights.get(ports)
        if assignment is None or len(assignment) != SLOTS or not set(assignment) <= set(ports):
            assignment = even_assignment(ports)
        self.used[ports] = assignment
        keys = []
        for slot, port in enumerate(assignment):
            action = self.to_port(port, ports)
            flow = FlowIntent(SLOT_TABLE, PRIORITY_SLOT, slot_match(set_id, slot, self.shift), (action,),
                              self.cookie)  # fmt: skip
            self.flows.append(flow)
            keys.append(flow.key)
        self.slot_keys[ports] = tuple(keys)
        fallback = self.group(GroupKind.SELECT, ports)
        self.flows.append(
            FlowIntent(SLOT_TABLE, PRIORITY_SET_FALLBACK, match(metadata=set_id), (fallback,), self.cookie)
        )
        return set_id

    def multipath(self, ports: tuple[int, ...]) -> tuple[Action, ...]:
        return (("metadata", self.slot_set(ports)), ("goto", SLOT_TABLE))


def _compile_switch(
    tables: RoutingTables,
    s: int,
    name: str,
    dpid: int,
    present: list[tuple[HostAddress, int]],
    ep_target: list[int],
    options: ForwardingOptions,
    cookie: int,
    shift: int = 0,
    weights: Mapping[tuple[int, ...], Assignment] | None = None,
) -> tuple[SwitchProgram, dict[tuple[int, ...], Assignment], dict[tuple[int, ...], tuple[FlowKey, ...]]]:
    n_ports = tables.subnet.n_ports
    row = tables.lft[s].tolist()
    alt_rows: list[list[int]] | None = None
    build = _Builder(options, cookie, shift, weights or {})
    fabric_multipath = options.multipath
    overrides = [(dscp, policy != "static") for dscp, policy in options.classes]
    overrides = [(dscp, mp) for dscp, mp in overrides if mp != fabric_multipath]
    use_alternatives = options.slot_tables or options.fast_failover
    actions: dict[tuple[int, int], tuple[tuple[Action, ...], tuple[tuple[int, tuple[Action, ...]], ...]]] = {}
    for address, ep in present:
        port = row[address.lid]
        if port in (NO_PORT, 0):
            continue
        target = ep_target[ep]
        found = actions.get((port, target))
        if found is None:
            main: tuple[Action, ...] = (("output", port),)
            per_class: tuple[tuple[int, tuple[Action, ...]], ...] = ()
            if target != s and use_alternatives:
                if alt_rows is None:
                    alt_rows = np.unpackbits(tables.alt[s], axis=1, count=n_ports).tolist()
                alternatives = tuple(p for p, bit in enumerate(alt_rows[target]) if bit)
                if len(alternatives) > 1:
                    static = (build.static(port, alternatives),)
                    spread = build.multipath(alternatives) if options.slot_tables else static
                    main = spread if fabric_multipath else static
                    per_class = tuple((dscp, spread if mp else static) for dscp, mp in overrides)
            found = actions[(port, target)] = (main, per_class)
        main, per_class = found
        flows = build.flows
        flows.append(FlowIntent(0, PRIORITY_ROUTE, (("eth_dst", address.mac),), main, cookie))
        for dscp, class_actions in per_class:
            key = match(eth_dst=address.mac, eth_type=ETH_TYPE_IPV4, ip_dscp=dscp)
            flows.append(FlowIntent(0, PRIORITY_CLASS, key, class_actions, cookie))
    program = SwitchProgram.of(name, dpid, build.flows, build.groups.values())
    return program, build.used, build.slot_keys


def rollout(
    installed: Mapping[str, SwitchProgram | None],
    desired: Mapping[str, SwitchProgram],
    skip: Collection[str] = (),
) -> dict[str, SwitchDelta]:
    """Non-empty deltas for the switches in `installed` (the ones connected), but none for those in
    `skip` (known to hold `desired` already).  Apply every delta's adds on every switch, confirm, then the
    deletes: no packet meets a half-updated path that drops it."""
    deltas: dict[str, SwitchDelta] = {}
    for switch, have in sorted(installed.items()):
        want = desired.get(switch)
        if want is None or switch in skip:
            continue
        delta = diff(have, want)
        if not delta.empty:
            deltas[switch] = delta
    return deltas


__all__ = [
    "COOKIE_MAGIC",
    "COOKIE_MASK",
    "ETH_TYPE_ARP",
    "ETH_TYPE_IPV4",
    "ETH_TYPE_LLDP",
    "IP_PROTO_UDP",
    "MAX_GENERATION",
    "PRIORITY_CLASS",
    "PRIORITY_CONTROL",
    "PRIORITY_ROUTE",
    "PRIORITY_SET_FALLBACK",
    "PRIORITY_SLOT",
    "SLOT_TABLE",
    "Action",
    "FlowIntent",
    "FlowKey",
    "ForwardingOptions",
    "GenerationExhausted",
    "GroupIntent",
    "GroupKind",
    "Match",
    "SlotKeys",
    "SwitchDelta",
    "SwitchProgram",
    "Weights",
    "applied",
    "compile_programs",
    "control_flows",
    "cookie_of",
    "diff",
    "failover_ports",
    "generation_of",
    "match",
    "rollout",
    "slot_match",
    "switch_levels",
]
