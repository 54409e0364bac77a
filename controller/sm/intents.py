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
a flow.  Tables become programs in `controller.sm.compile`.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import NamedTuple

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

    @cached_property
    def priorities(self) -> frozenset[int]:
        """The priorities its flows use: asked of every program on every change (has it a partition
        layer?), and a program object outlives many changes, so it is counted once."""
        return frozenset(priority for _, priority, _ in self.flows)

    @cached_property
    def group_users(self) -> Counter[int]:
        """How many of its flows send to each group (a group no flow uses is deleted)."""
        return Counter(int(a[1]) for f in self.flows.values() for a in f.actions if a[0] == "group")

    def patched(
        self,
        flows: Mapping[FlowKey, FlowIntent],
        groups: Mapping[int, GroupIntent],
        priorities: frozenset[int] | None = None,
        group_users: Counter[int] | None = None,
        touched: tuple[FlowKey, ...] | None = None,
    ) -> SwitchProgram:
        """This switch with other flows and groups; `priorities` and `group_users`, when the caller knows
        them from this program's and what it changed (a patch touches a few flows of thousands), are not
        counted again.  `touched`: every flow key whose entry may differ from this program's (replaced,
        added or removed; every other entry is this program's own object) — then `diff` from a switch
        known to hold this program looks at those keys only."""
        program = SwitchProgram(self.switch, self.dpid, flows, groups)
        if priorities is not None:
            program.__dict__["priorities"] = priorities
        if group_users is not None:
            program.__dict__["group_users"] = group_users
        if touched is not None:
            # a weak reference: a chain of patches must not keep every past program alive
            program.__dict__["_patch"] = (weakref.ref(self), touched)
        return program


def holding(
    installed: Mapping[str, SwitchProgram | None], desired: Mapping[str, SwitchProgram], names: Iterable[str]
) -> dict[str, SwitchProgram]:
    """The switches of `names`, which need no change toward `desired`, noted as holding it exactly (their
    entries shared, not copied) — where not noted already — so that the next patch of their program is
    diffed along the patch."""
    noted: dict[str, SwitchProgram] = {}
    for name in names:
        have, want = installed.get(name), desired[name]
        if have is not None and have.__dict__.get("_holds") is not want:
            noted[name] = SwitchProgram(have.switch, have.dpid, have.flows, have.groups)
            noted[name].__dict__["_holds"] = want
    return noted


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
    #: The program this delta turns the switch into (`applied` notes it: see `diff`).
    target: weakref.ref[SwitchProgram] | None = field(default=None, compare=False, repr=False)

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
    """What turns `installed` (what the switch holds, as read back or last confirmed) into `desired`.

    When the switch is known to hold, entry for entry, the program `desired` was patched from (`applied`
    after a delta toward it), only the keys the patch touched can differ: they alone are looked at.  At
    k=16 a cable cut patches ~120 switches of ~1,400 entries each, and scanning them all was most of the
    rollout's time."""
    have_flows = installed.flows if installed is not None else {}
    have_groups = installed.groups if installed is not None else {}
    want_groups = desired.groups
    add_groups = tuple(want_groups[gid] for gid in sorted(want_groups.keys() - have_groups.keys()))
    # `is` first: a patched program shares its unchanged groups with the one it was patched from
    modify_groups = tuple(
        g
        for gid, g in sorted(want_groups.items())
        if (h := have_groups.get(gid)) is not None and h is not g and h != g
    )
    want_flows = desired.flows
    have = have_flows.get
    touched = _touched_since(installed, desired)
    delete_flows: tuple[FlowIntent, ...] = ()
    # (wanted, installed under the same key) where they are not the same object
    differing: list[tuple[FlowIntent, FlowIntent | None]]
    if touched is not None:
        wanted = [(f, have(key)) for key in touched if (f := want_flows.get(key)) is not None]
        differing = [(f, old) for f, old in wanted if old is not f]
        delete_flows = tuple(f for key in touched if key not in want_flows and (f := have(key)) is not None)
    else:
        # `is` first: a patched program shares its unchanged entries with what the switch was last given
        differing = [(f, old) for key, f in want_flows.items() if (old := have(key)) is not f]
        new_keys = sum(1 for _, old in differing if old is None)
        # every installed key is wanted when as many are shared as installed: no scan for deletes then
        if len(want_flows) - new_keys != len(have_flows):
            delete_flows = tuple(f for key, f in have_flows.items() if key not in want_flows)
    # same key: the same behaviour iff the same actions (`same_behaviour` less the key it was found by)
    add_flows = tuple(f for f, old in differing if old is None or old.actions != f.actions)
    delete_groups = tuple(sorted(have_groups.keys() - want_groups.keys()))
    return SwitchDelta(
        desired.switch, desired.dpid, add_groups, modify_groups, add_flows, delete_flows, delete_groups,
        target=weakref.ref(desired),
    )  # fmt: skip


def _touched_since(installed: SwitchProgram | None, desired: SwitchProgram) -> tuple[FlowKey, ...] | None:
    """The keys `desired`'s patch touched, if `installed` holds exactly the program it was patched from."""
    patch = desired.__dict__.get("_patch")
    holds = installed.__dict__.get("_holds") if installed is not None else None
    if patch is None or holds is None:
        return None
    return patch[1] if patch[0]() is holds else None


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
    result = SwitchProgram(delta.switch, delta.dpid, flows, groups)
    target = delta.target() if delta.target is not None else None
    if target is not None:
        # the switch now holds, entry for entry, what the delta was computed toward (cookies aside); a
        # strong reference, so that the next patch of that program can find it (one program per switch:
        # usually the current computation's own)
        result.__dict__["_holds"] = target
    return result


def control_flows(cookie: int) -> list[FlowIntent]:
    """LLDP (link discovery) and ARP (answered by the controller: no flooding in a looped fabric)."""
    to_controller: tuple[Action, ...] = (("controller", 0xFFFF),)
    return [
        FlowIntent(0, PRIORITY_CONTROL, match(eth_type=ETH_TYPE_LLDP), to_controller, cookie),
        FlowIntent(0, PRIORITY_CONTROL, match(eth_type=ETH_TYPE_ARP), to_controller, cookie),
    ]


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
    "SwitchDelta",
    "SwitchProgram",
    "applied",
    "control_flows",
    "cookie_of",
    "diff",
    "generation_of",
    "holding",
    "match",
    "rollout",
]
