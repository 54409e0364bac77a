"""Forwarding tables become switch programs (`controller.sm.intents`): one flow per destination host port,
fast-failover groups over the alternatives, slot tables for the multipath policies.

A reroute changes few entries on the switches it touches, so compiling is incremental twice over: a switch
whose table row, alternatives and weights did not change keeps its program object, and one where only a few
destinations changed has just those compiled again (`_patch_switch`).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import numpy.typing as npt

from controller.sm.addressing import AddressTable, HostAddress
from controller.sm.intents import (
    ETH_TYPE_IPV4,
    IP_PROTO_UDP,
    PRIORITY_CLASS,
    PRIORITY_ROUTE,
    PRIORITY_SET_FALLBACK,
    PRIORITY_SLOT,
    SLOT_TABLE,
    Action,
    FlowIntent,
    FlowKey,
    ForwardingOptions,
    GroupIntent,
    GroupKind,
    Match,
    SwitchProgram,
    control_flows,
    cookie_of,
    match,
)
from controller.sm.policies import SLOTS, Assignment, even_assignment, slot_shift
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables


@dataclass
class _GroupIds:
    """Content-addressed group ids, probing deterministically on (rare) crc collisions."""

    by_content: dict[tuple[GroupKind, tuple[int, ...]], int] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    def get(self, kind: GroupKind, ports: tuple[int, ...]) -> int:
        content = (kind, ports)
        gid = self.by_content.get(content)
        if gid is None:
            gid = _content_id(kind, ports)
            while gid in self.taken:
                gid = (gid + 1) & 0x7FFFFFFF or 1
            self.by_content[content] = gid
            self.taken.add(gid)
        return gid


@lru_cache(maxsize=1 << 16)
def _content_id(kind: GroupKind, ports: tuple[int, ...]) -> int:
    """A group's id before collisions are probed: a crc of its content (the same on every switch, so a
    reroute asks for the same few thousand again and again)."""
    return (zlib.crc32(f"{kind.value}:{','.join(map(str, ports))}".encode()) & 0x7FFFFFFF) or 1


@lru_cache(maxsize=1 << 16)
def _failover_buckets(port: int, alternatives: tuple[int, ...]) -> tuple[int, ...]:
    """A static entry's fast-failover buckets: its port, then the other alternatives in order."""
    return (port, *sorted(p for p in alternatives if p != port))


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
    align = _align(previous[0], tables) if previous is not None else None
    levels = switch_levels(subnet) if options.slot_tables else None
    weights = weights or {}
    programs: dict[str, SwitchProgram] = {}
    assignments: dict[str, dict[tuple[int, ...], Assignment]] = {}
    keys: SlotKeys = {}
    indexed: _Present | None = None
    for s, name in enumerate(subnet.switch_names):
        mine = weights.get(name, {})
        if align is not None and previous is not None and name in align.old_index and name in previous[1]:
            before = (previous_weights or {}).get(name, {})
            same_weights = (not before and not mine) or _skewed(before) == _skewed(mine)
            if same_weights and align.same(s):
                programs[name] = previous[1][name]
                installed = (previous_weights or {}).get(name) or mine  # what that program was compiled with
                if installed:
                    assignments[name] = dict(installed)
                    keys[name] = (previous_keys or {}).get(name, {})
                continue
            if indexed is None:
                indexed = _Present(present, ep_target)
            patched = _patch_switch(tables, s, align, previous[1][name], indexed, options, cookie)
            if patched is not None:
                programs[name] = patched
                continue
        shift = slot_shift(int(levels[s])) if levels is not None else 0
        programs[name], used, slot_keys = _compile_switch(
            tables, s, name, dpids[name], present, ep_target, options, cookie, shift, mine
        )
        if previous is not None and name in previous[1] and not options.slot_tables:
            programs[name] = _keep_group_ids(programs[name], previous[1][name])
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


@dataclass(frozen=True)
class _Alignment:
    """How the switches of the previous tables line up with the new ones (by name: a lost or returning
    switch shifts the indices), and the switches with hosts — the only targets whose alternatives a
    program uses — in both numberings."""

    old: RoutingTables
    new: RoutingTables
    old_index: Mapping[str, int]
    new_targets: npt.NDArray[np.intp]
    old_targets: npt.NDArray[np.intp]

    def targets(self, s: int) -> list[int]:
        """The host switches (new indices) toward which switch `s` has other alternatives."""
        return self._per_switch[1][s]

    def moved(self, s: int) -> list[int]:
        """The LIDs whose entry on switch `s` changed (switch `s` must have been there before)."""
        return self._per_switch[0][s]

    def same(self, s: int) -> bool:
        """Switch `s` has the same table row and the same alternatives toward every host switch."""
        return self._per_switch[2][s]

    @cached_property
    def _per_switch(self) -> tuple[list[list[int]], list[list[int]], list[bool]]:
        """(per switch: its changed LIDs, its host switches with other alternatives, neither) — split
        from two whole-table comparisons once: asked switch by switch, the array slicing was a third of a
        k=16 leaf-cable cut's compile."""
        n = self.new.subnet.n_switches
        renumbering = self.new.subnet.renumbering(self.old_index)
        if renumbering.identity:
            old_lft, old_alt = self.old.lft, self.old.alt
        else:  # a returning switch's row (-1) is never asked for
            rows = np.maximum(renumbering.old_of, 0)
            old_lft, old_alt = self.old.lft[rows], self.old.alt[rows]
        moved_rows, moved_lids = np.nonzero(self.new.lft != old_lft)
        moved = _split(moved_rows, moved_lids, n)
        before = old_alt[:, self.old_targets]
        changed_rows, changed_cols = np.nonzero((before != self.new.alt[:, self.new_targets]).any(axis=2))
        targets = _split(changed_rows, self.new_targets[changed_cols], n)
        same = [not (m or t) for m, t in zip(moved, targets, strict=True)]
        return moved, targets, same


def _split(rows: npt.NDArray[np.intp], values: npt.NDArray[np.intp], n: int) -> list[list[int]]:
    """`values` grouped by their (sorted) `rows` into one list per row 0..n-1."""
    bounds = np.searchsorted(rows, np.arange(n + 1)).tolist()
    flat: list[int] = values.tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(n)]


def _align(old: RoutingTables, new: RoutingTables) -> _Alignment | None:
    """None when the two do not describe the same destinations on the same switches with hosts (then
    every switch is compiled whole)."""
    a, b = old.subnet, new.subnet
    if old.lft.shape[1] != new.lft.shape[1] or old.alt.shape[2] != new.alt.shape[2]:
        return None
    if not np.array_equal(a.ep_lids, b.ep_lids):
        return None
    old_index = a.switch_index
    new_targets = np.unique(b.ep_switch).astype(np.intp)
    try:
        old_targets = np.array([old_index[b.switch_names[t]] for t in new_targets.tolist()], dtype=np.intp)
    except KeyError:  # a switch with hosts came back
        return None
    old_names, new_names = a.switch_names, b.switch_names
    if [old_names[x] for x in a.ep_switch.tolist()] != [new_names[x] for x in b.ep_switch.tolist()]:
        return None  # a host moved to another switch
    return _Alignment(old, new, old_index, new_targets, old_targets)


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
                 weights: Mapping[tuple[int, ...], Assignment], ids: _GroupIds | None = None,
                 control: bool = True) -> None:  # fmt: skip
        self.options, self.cookie, self.shift, self.weights = options, cookie, shift, weights
        self.flows = control_flows(cookie) if control else []
        self.groups: dict[int, GroupIntent] = {}
        self.ids = ids if ids is not None else _GroupIds()
        self.sets: dict[tuple[int, ...], int] = {}
        self.used: dict[tuple[int, ...], Assignment] = {}
        #: Each set's slot flows, in slot order (their byte counters are adaptive routing's per-slot load).
        self.slot_keys: dict[tuple[int, ...], tuple[FlowKey, ...]] = {}
        self._static: dict[tuple[int, bytes], Action] = {}

    def group(self, kind: GroupKind, ports: tuple[int, ...]) -> Action:
        gid = self.ids.get(kind, ports)
        self.groups[gid] = GroupIntent(gid, kind, ports)
        return ("group", gid)

    def to_port(self, port: int, ports: tuple[int, ...]) -> Action:
        """Out of `port`, through a fast-failover group over `ports` when failover is on."""
        if self.options.fast_failover and len(ports) > 1:
            return self.group(GroupKind.FAST_FAILOVER, failover_ports(port, ports))
        return ("output", port)

    def static(self, port: int, alternatives: tuple[int, ...], packed: bytes) -> Action:
        """The LFT's port: a fast-failover group leading with it, then the sorted alternatives.  Many
        destination switches share a set of alternatives (a leaf's uplinks): each (port, set) is built
        once per switch, looked up by the set's packed bits `packed` (bytes keep their hash; a tuple of
        ports is hashed again on every lookup)."""
        found = self._static.get((port, packed))
        if found is not None:
            return found
        action: Action = ("output", port)
        if self.options.fast_failover and len(alternatives) > 1:
            action = self.group(GroupKind.FAST_FAILOVER, _failover_buckets(port, alternatives))
        self._static[(port, packed)] = action
        return action

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
    build = _Builder(options, cookie, shift, weights or {})
    _address_flows(build, tables, s, present, ep_target)
    program = SwitchProgram.of(name, dpid, build.flows, build.groups.values())
    # counted now, through the few distinct action lists, so that the first patch of this program does
    # not count them flow by flow on the reroute's path
    users: Counter[int] = Counter()
    for actions, n in Counter(f.actions for f in build.flows).items():
        for kind, arg in actions:
            if kind == "group":
                users[int(arg)] += n
    program.__dict__["group_users"] = users
    return program, build.used, build.slot_keys


def _address_flows(
    build: _Builder,
    tables: RoutingTables,
    s: int,
    entries: list[tuple[HostAddress, int]],
    ep_target: list[int],
) -> None:
    """The forwarding flows of switch `s` for the host addresses `entries` (and the groups and slot tables
    they use), into `build`."""
    options, cookie = build.options, build.cookie
    n_ports = tables.subnet.n_ports
    # only the entries asked for become Python ints (a patch asks for a few of ~1,400), and a switch's
    # alternatives stay packed: each target's bytes name its port tuple (`_ports_of`)
    ports_of_entry = tables.lft[s, [address.lid for address, _ in entries]].tolist()
    alt_row = tables.alt[s].tobytes()
    alt_width = tables.alt.shape[2]
    fabric_multipath = options.multipath
    overrides = [(dscp, policy != "static") for dscp, policy in options.classes]
    overrides = [(dscp, mp) for dscp, mp in overrides if mp != fabric_multipath]
    slot_tables = options.slot_tables  # a property: asked once, not per destination
    use_alternatives = slot_tables or options.fast_failover
    actions: dict[tuple[int, int], tuple[tuple[Action, ...], tuple[tuple[int, tuple[Action, ...]], ...]]] = {}
    alternatives_of: dict[int, tuple[tuple[int, ...], bytes]] = {}  # they depend on the target switch only
    for (address, ep), port in zip(entries, ports_of_entry, strict=True):
        if port in (NO_PORT, 0):
            continue
        target = ep_target[ep]
        found = actions.get((port, target))
        if found is None:
            main: tuple[Action, ...] = (("output", port),)
            per_class: tuple[tuple[int, tuple[Action, ...]], ...] = ()
            if target != s and use_alternatives:
                known = alternatives_of.get(target)
                if known is None:
                    bits = alt_row[target * alt_width : (target + 1) * alt_width]
                    known = alternatives_of[target] = (_ports_of(bits, n_ports), bits)
                alternatives, bits = known
                if len(alternatives) > 1:
                    static = (build.static(port, alternatives, bits),)
                    spread = build.multipath(alternatives) if slot_tables else static
                    main = spread if fabric_multipath else static
                    if overrides:
                        per_class = tuple((dscp, spread if mp else static) for dscp, mp in overrides)
            found = actions[(port, target)] = (main, per_class)
        main, per_class = found
        flows = build.flows
        flows.append(FlowIntent(0, PRIORITY_ROUTE, (("eth_dst", address.mac),), main, cookie))
        for dscp, class_actions in per_class:
            key = match(eth_dst=address.mac, eth_type=ETH_TYPE_IPV4, ip_dscp=dscp)
            flows.append(FlowIntent(0, PRIORITY_CLASS, key, class_actions, cookie))


@lru_cache(maxsize=4096)
def _ports_of(bits: bytes, n_ports: int) -> tuple[int, ...]:
    """The ports set in a packed alternatives bitmap (a fabric has a few dozen distinct ones)."""
    return tuple(np.flatnonzero(np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=n_ports)).tolist())


#: A changed switch is patched (only its changed destinations compiled again) while at most this share of
#: its destinations changed; above it, compiling it whole is as cheap.
PATCH_MAX_SHARE = 0.25


def _patch_switch(
    tables: RoutingTables,
    s: int,
    align: _Alignment,
    program: SwitchProgram,
    present: _Present,
    options: ForwardingOptions,
    cookie: int,
) -> SwitchProgram | None:
    """`program` (compiled from the previous tables) with only the destinations whose
    entry or whose target's alternatives changed in `tables` compiled again, or None when a whole compile
    is due (slot tables, or most of the switch changed).  The result forwards exactly as a whole compile
    would (group ids are content-addressed; the new ones probe past the ids the program holds), while its
    unchanged entries keep the cookie that wrote them — which is what the switch holds.

    At k=16 a cable cut changes a few entries on each of ~150 switches; compiling those switches whole
    was 80 % of the reroute's computation (2.7 s of 3.4 s)."""
    if options.slot_tables:
        return None
    moved = align.moved(s)
    targets = align.targets(s)
    todo = present.affected(moved, targets)
    if not todo:
        # only entries toward switch LIDs moved (a lost switch's own LID, on every switch): programs
        # carry host addresses only, so this one stands as it is (copying its flows was 0.2 ms a switch)
        return program
    if len(todo) > PATCH_MAX_SHARE * max(1, len(present.items)):
        return None
    ids = _GroupIds({(g.kind, g.ports): gid for gid, g in program.groups.items()}, set(program.groups))
    build = _Builder(options, cookie, 0, {}, ids=ids, control=False)
    _address_flows(build, tables, s, todo, present.ep_target)
    stale: dict[FlowKey, None] = {}  # ordered: the patch's touched keys go out in a fixed order
    for address, _ in todo:
        stale[(0, PRIORITY_ROUTE, (("eth_dst", address.mac),))] = None
        for dscp, _policy in options.classes:
            stale[(0, PRIORITY_CLASS, match(eth_dst=address.mac, eth_type=ETH_TYPE_IPV4, ip_dscp=dscp))] = (
                None
            )
    # replaced in place, popped only where gone: a dict with no deleted slots is copied as a block (4 us
    # for a k=16 leaf's ~1,000 flows; after pops and re-inserts 35 us, re-hashing every key) — and the
    # next patch copies this one
    flows = dict(program.flows)
    built_flows = {f.key: f for f in build.flows}
    replaced = [f for key in stale if (f := flows.get(key)) is not None]
    for key in stale:
        if key not in built_flows:
            flows.pop(key, None)
    flows.update(built_flows)
    # the program's group users, less the replaced flows', plus the new ones' (scanning the switch's
    # flows for them was the largest part of a k=16 leaf-cable reroute's compile)
    users = program.group_users.copy()
    users.subtract(_group_uses(replaced))
    users.update(_group_uses(build.flows))
    unused = {gid for gid, count in users.items() if count <= 0}
    for gid in unused:
        del users[gid]
    groups = {gid: g for gid, g in {**program.groups, **build.groups}.items() if gid not in unused}
    built = frozenset(f.priority for f in build.flows)
    exact = all(f.priority in built for f in replaced)  # else a priority may have gone with them
    priorities = program.priorities | built if exact else None
    touched = tuple({**stale, **{f.key: None for f in build.flows}})
    return program.patched(flows, groups, priorities, users, touched)


def _keep_group_ids(new: SwitchProgram, old: SwitchProgram) -> SwitchProgram:
    """`new` with each of its new groups renamed to an old group it replaces — one all of whose entries
    now use it (the one with most entries, if several): the switch then modifies that group in place, and
    those entries need no flow-mod; only entries that came from other groups are rewritten.

    A leaf that loses an uplink has other alternatives toward every destination: each of its few
    fast-failover groups changes content, and with content-addressed ids all ~1,100 entries moved to new
    groups (a k=16 cut's largest share of flow-mods).  Renamed, the entries that kept their port keep
    their group id.  Ids stay content-addressed for contents the switch does not hold yet; only a
    replacement keeps its old id."""
    gone = old.groups.keys() - new.groups.keys()
    fresh = new.groups.keys() - old.groups.keys()
    if not gone or not fresh:
        return new
    # one pass over the old flows: per gone group, its entries' count and the one fresh group they all
    # use now (0: they split, or some left the fresh groups)
    counts: Counter[int] = Counter()
    now_in: dict[int, int] = {}
    fresh_of: dict[tuple[Action, ...], int] = {}  # a switch's flows share a few action tuples
    new_flows = new.flows
    for key, f in old.flows.items():
        for kind, arg in f.actions:
            if kind != "group" or (was := int(arg)) not in gone:
                continue
            counts[was] += 1
            if now_in.get(was, -1) == 0:
                continue
            nf = new_flows.get(key)
            gid = 0
            if nf is not None:
                found = fresh_of.get(nf.actions)
                if found is None:
                    found = fresh_of[nf.actions] = next(
                        (int(a) for k, a in nf.actions if k == "group" and int(a) in fresh), 0
                    )
                gid = found
            now_in[was] = gid if now_in.get(was, gid) == gid else 0
    # per fresh group, the gone groups all of whose entries now use it: it takes the id of the largest
    takes: dict[int, tuple[int, int]] = {}
    for was, gid in sorted(now_in.items()):
        if gid == 0 or old.groups[was].kind != new.groups[gid].kind:
            continue
        best = takes.get(gid)
        if best is None or (counts[was], -was) > (best[0], -best[1]):
            takes[gid] = (counts[was], was)
    rename = {gid: was for gid, (_, was) in takes.items()}
    if not rename:
        return new
    renamed_actions: dict[tuple[Action, ...], tuple[Action, ...]] = {}

    def renamed(actions: tuple[Action, ...]) -> tuple[Action, ...]:
        """`actions` with renamed groups (the same object when none is)."""
        found = renamed_actions.get(actions)
        if found is None:
            changed = tuple(
                ("group", rename.get(int(arg), arg)) if kind == "group" else (kind, arg)
                for kind, arg in actions
            )
            found = renamed_actions[actions] = actions if changed == actions else changed
        return found

    flows = {
        key: f if (actions := renamed(f.actions)) is f.actions else f._replace(actions=actions)
        for key, f in new_flows.items()
    }
    groups = {}
    for gid, g in new.groups.items():
        groups[rename.get(gid, gid)] = GroupIntent(rename[gid], g.kind, g.ports) if gid in rename else g
    users: Counter[int] = Counter({rename.get(gid, gid): n for gid, n in new.group_users.items()})
    program = SwitchProgram(new.switch, new.dpid, flows, groups)
    program.__dict__["group_users"] = users
    return program


def _group_uses(flows: Iterable[FlowIntent]) -> list[int]:
    return [int(a[1]) for f in flows for a in f.actions if a[0] == "group"]


class _Present:
    """The host addresses the switches route (with their endpoint index), looked up by LID and by the
    switch they hang off: a patch compiles the few whose entry or target changed, found without a scan."""

    def __init__(self, items: list[tuple[HostAddress, int]], ep_target: list[int]) -> None:
        self.items = items
        self.ep_target = ep_target
        self._by_lid: dict[int, list[int]] = {}
        self._by_target: dict[int, list[int]] = {}
        for i, (address, ep) in enumerate(items):
            self._by_lid.setdefault(address.lid, []).append(i)
            self._by_target.setdefault(ep_target[ep], []).append(i)

    def affected(self, lids: Iterable[int], targets: Iterable[int]) -> list[tuple[HostAddress, int]]:
        """The addresses with one of `lids` or hanging off one of `targets`, in `items` order."""
        chosen: set[int] = set()
        for lid in lids:
            chosen.update(self._by_lid.get(lid, ()))
        for target in targets:
            chosen.update(self._by_target.get(target, ()))
        return [self.items[i] for i in sorted(chosen)]


__all__ = [
    "PATCH_MAX_SHARE",
    "SlotKeys",
    "Weights",
    "compile_programs",
    "failover_ports",
    "slot_match",
    "switch_levels",
]
