"""Routing a fabric as the subnet manager sees it: declared fabric + live port state -> tables -> programs.

`SubnetContext` holds what never changes while a controller runs (the declared fabric, LIDs, addresses,
datapath ids, the engine registry) and computes one routed generation as a pure function of the ports that
are down, the engine, the forwarding options and the previous generation.  The controller's decision core
(`controller.core`) keeps the changing state and calls it; `SubnetManager` is a small stateful convenience
around it for scripts, benchmarks and tests.

Liveness is tracked per port, as switches report it.  A link is usable when neither end is reported down;
what the subnet manager routes is the part of the live fabric with the most hosts (hosts cut off entirely
lose their routes until a link returns).  LIDs, and so addresses, never move: they come from the declared
fabric and re-sweeps keep them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from controller.sm.addressing import AddressTable
from controller.sm.compile import Weights, compile_programs, switch_levels
from controller.sm.engines import EngineRegistry, RoutingEngine, default_registry, select_engine
from controller.sm.incremental import NotIncremental, reroute
from controller.sm.intents import (
    MAX_GENERATION,
    FlowKey,
    ForwardingOptions,
    GenerationExhausted,
    SwitchProgram,
    cookie_of,
)
from controller.sm.isolation import Attachment, attachments, enforce
from controller.sm.lids import LidMap, assign_lids
from controller.sm.partitions import Partitions
from controller.sm.policies import SLOTS, Assignment, PolicyError, even_assignment, slot_shift
from controller.sm.subnet import Subnet
from controller.sm.tables import Hop, RouteError, RoutingTables
from controller.sm.verify import Verification, verify
from topologies.faults import largest_component
from topologies.model import Fabric, PortRef


class UnknownSwitch(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Computation:
    """One routed generation of the fabric."""

    generation: int
    engine: str
    options: ForwardingOptions
    tables: RoutingTables
    programs: Mapping[str, SwitchProgram]
    verification: Verification
    down_links: tuple[str, ...]
    lost_hosts: tuple[str, ...]
    #: True when only the destinations that used a failed part were rerouted (`incremental.reroute`).
    incremental: bool = False
    #: Why another engine than `engine` routed this generation (see `SubnetManager.fallback`).
    fallback: str | None = None
    #: Destination LIDs whose entries changed since the previous computation (None: not tracked — a full
    #: recomputation, e.g. after a link came back or another engine was chosen).
    changed_lids: frozenset[int] | None = None

    @property
    def changed_destinations(self) -> int | None:
        """How many destinations moved: the count a port-down event reports."""
        return None if self.changed_lids is None else len(self.changed_lids)

    #: Per switch: each set of equal-cost ports with a slot table -> its slot assignment (multipath only).
    weights: Mapping[str, Mapping[tuple[int, ...], Assignment]] = field(default_factory=dict)
    #: Per switch and set: its slot flows' keys in slot order (their counters are per-slot load).
    slot_keys: Mapping[str, Mapping[tuple[int, ...], tuple[FlowKey, ...]]] = field(default_factory=dict)
    #: The partitions enforced at the edge switches of this generation (None: OpenSM's no-file default).
    partitions: Partitions | None = None

    @property
    def slot_sets(self) -> int:
        return sum(len(sets) for sets in self.weights.values())

    def policy_problem(self) -> PolicyError | None:
        """Why this fabric cannot support the chosen policy (a multipath policy without any equal-cost
        alternatives), or None."""
        if self.options.slot_tables and self.slot_sets == 0:
            multipath = self.options.policy if self.options.multipath else "a multipath class"
            return PolicyError(
                f"{multipath!r} needs equal-cost alternatives, and the {self.engine} tables of this fabric "
                "have none (one path per destination)",
                field="policy",
            )
        return None


class RecentRoutings:
    """Full routings (tables and their verification) of the last few live fabrics, by what determines them:
    the engine and its settings, the declared links that are down, and whether alternatives are checked.

    A cable that comes back returns the fabric to a state it was in moments ago (a flap, a reseated cable,
    a maintenance window closed): routing it again gives the same tables (same inputs, same tables), so
    they are taken from here instead — at k=16 a routing and its verification are ~100 ms of a restore.
    Only what a full routing would have produced is kept or returned: incremental splices are never
    stored, so which tables a fabric gets does not depend on whether this cache hit.  Bounded (`limit`);
    safe to share between threads (a lost race is a miss, never a wrong entry)."""

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self._items: dict[tuple[object, ...], tuple[RoutingTables, Verification]] = {}
        #: Lookups answered from here (for tests and benchmarks).
        self.hits = 0

    @staticmethod
    def key(router: RoutingEngine, down: tuple[int, ...], alternatives: bool) -> tuple[object, ...]:
        settings = tuple(sorted((k, repr(v)) for k, v in vars(router).items()))
        return (router.name, type(router).__qualname__, settings, down, alternatives)

    def get(self, key: tuple[object, ...]) -> tuple[RoutingTables, Verification] | None:
        found = self._items.pop(key, None)
        if found is not None:
            self.hits += 1
            self._items[key] = found  # most recently used last
        return found

    def put(self, key: tuple[object, ...], value: tuple[RoutingTables, Verification]) -> None:
        self._items.pop(key, None)
        self._items[key] = value
        while len(self._items) > self.limit:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                self._items.pop(next(iter(self._items)))


def _route(
    router: RoutingEngine,
    live: Fabric,
    lids: LidMap,
    previous: Computation | None,
    alternatives: bool,
    recent: RecentRoutings | None = None,
    down: tuple[int, ...] = (),
) -> tuple[RoutingTables, Verification, frozenset[int] | None]:
    """Incremental when the live fabric is the previous computation's minus failures with the same engine
    (only destinations that used the failed part move); a full routing otherwise, or when the spliced tables
    do not verify.  A full routing of a live fabric routed lately (the same `down` links) comes from
    `recent`."""
    key = RecentRoutings.key(router, down, alternatives)
    if previous is not None and previous.tables.engine == router.name:
        try:
            result = reroute(previous.tables, live, router, lids)
        except NotIncremental:
            result = None
        if result is not None and (result.failed_links or result.failed_switches or result.removed_lids):
            # the columns a cut did not touch carry their figures over from the previous verification
            verification = verify(result.tables, alternatives=alternatives, previous=previous.verification)
            if verification.ok:
                return result.tables, verification, result.changed_lids
            full = (result.full, verify(result.full, alternatives=alternatives))
            if recent is not None:
                recent.put(key, full)
            return full[0], full[1], None
    found = recent.get(key) if recent is not None else None
    if found is not None:
        return found[0], found[1], None
    tables = router.route(Subnet.build(live, lids))
    # a restore changes few columns too: the others' figures carry over (`ColumnFigures.carry` says when
    # they cannot, and the verification is whole then; the result is the same either way)
    before = previous.verification if previous is not None else None
    verification = verify(tables, alternatives=alternatives, previous=before)
    if recent is not None:
        recent.put(key, (tables, verification))
    return tables, verification, None


@dataclass(frozen=True, eq=False)
class SubnetContext:
    """The declared fabric and everything derived from it that stays fixed at run time."""

    declared: Fabric
    registry: EngineRegistry
    lids: LidMap
    addresses: AddressTable
    dpids: Mapping[str, int]
    switch_of_dpid: Mapping[int, str]
    recent: RecentRoutings = field(default_factory=RecentRoutings, repr=False)

    @classmethod
    def build(cls, declared: Fabric, registry: EngineRegistry | None = None) -> SubnetContext:
        lids = assign_lids(declared)
        dpids = {s.name: s.guid for s in declared.switches}
        return cls(
            declared=declared,
            registry=registry or default_registry(),
            lids=lids,
            addresses=AddressTable.build(lids),
            dpids=dpids,
            switch_of_dpid={d: n for n, d in dpids.items()},
        )

    @cached_property
    def attached(self) -> tuple[Attachment, ...]:
        """Each host port and the edge switch port it is cabled to (where partitions are enforced)."""
        return attachments(self.declared, self.addresses)

    def declared_ports(self, switch: str) -> list[int]:
        return sorted(ref.port for ref in self.declared.port_map if ref.node == switch)

    def link_up(self, index: int, ports_down: Mapping[PortRef, float]) -> bool:
        link = self.declared.links[index]
        return link.a not in ports_down and link.b not in ports_down

    def down_links(self, ports_down: Mapping[PortRef, float]) -> list[int]:
        """Declared links with an end down, in declared order: found from the ports that are down (a
        port has one link), not by testing every link (9 ms of a k=16 reroute asked three times)."""
        return sorted({i for ref in ports_down if (i := self.link_of(ref)) is not None})

    def link_of(self, ref: PortRef) -> int | None:
        entry = self.declared.port_map.get(ref)
        return entry[0] if entry is not None else None

    def live_fabric(self, ports_down: Mapping[PortRef, float]) -> tuple[Fabric, tuple[str, ...]]:
        """The routable part: declared minus dead links, reduced to the component with the most hosts."""
        reduced = self.declared.without(links=self.down_links(ports_down))
        kept = largest_component(reduced)
        stray = [name for name in reduced.nodes if name not in kept]
        lost = tuple(sorted(n for n in stray if reduced.nodes[n].is_host))
        return (reduced.without(nodes=stray) if stray else reduced), lost

    def compute(
        self,
        engine: str,
        options: ForwardingOptions,
        ports_down: Mapping[PortRef, float],
        generation: int,
        previous: Computation | None = None,
        fallback: str | None = None,
        partitions: Partitions | None = None,
    ) -> Computation:
        """Route the live fabric as generation `generation`: raises `UnknownEngine` before doing anything.
        With `previous` (same engine and options), switches whose rows are unchanged keep their programs.

        When `previous` was routed by the same engine and the live fabric is its fabric minus failed links or
        switches, only the destinations whose routes used the failed part are rerouted
        (`incremental.reroute`; `changed_lids` says which moved).  With `fallback`, an engine that cannot
        route the live fabric (ftree on a non-tree) is replaced by it, and `fallback` in the result says why.

        Sets of equal-cost ports that still exist keep their slot assignment (adaptive weights).
        """
        router = self.registry.create(engine)
        if fallback is not None:
            self.registry.create(fallback)
        if generation > MAX_GENERATION:
            raise GenerationExhausted(
                f"table generation {generation - 1} is the last the 48-bit cookie can carry; "
                "start the controller on a fresh state directory"
            )
        live, lost = self.live_fabric(ports_down)
        lids = assign_lids(live, previous=self.lids)
        note = None
        if fallback is not None:
            router, note = select_engine(self.registry, engine, Subnet.build(live, lids), fallback)
        tables, verification, changed = _route(
            router,
            live,
            lids,
            previous,
            options.fast_failover or options.slot_tables,
            self.recent,
            tuple(self.down_links(ports_down)),
        )
        reuse = None
        weights: Weights | None = None
        keys = None
        if (
            previous is not None
            and previous.engine == engine
            and previous.options.tables_key == options.tables_key
        ):
            reuse = (previous.tables, previous.programs)
            keys = {k: dict(v) for k, v in previous.slot_keys.items()}
            # adaptive weights carry over while the policy stays; any other change starts even
            weights = previous.weights if previous.options == options else {}
        programs, assignments, slot_keys = compile_programs(
            tables, self.addresses, self.dpids, options, generation, reuse, weights,
            previous.weights if reuse and previous is not None else None, keys,
        )  # fmt: skip
        programs = enforce(programs, partitions, self.attached, cookie_of(generation))
        return Computation(
            generation=generation,
            engine=engine,
            options=options,
            tables=tables,
            programs=programs,
            verification=verification,
            down_links=tuple(str(self.declared.links[i]) for i in self.down_links(ports_down)),
            lost_hosts=lost,
            incremental=changed is not None,
            fallback=note,
            changed_lids=changed,
            weights=assignments,
            slot_keys=slot_keys,
            partitions=partitions,
        )

    def reweight(self, computation: Computation, weights: Weights) -> Computation:
        """The same generation with other slot assignments for some switches (an adaptive move): only
        those switches' programs are compiled again."""
        merged = {**computation.weights, **{k: dict(v) for k, v in weights.items()}}
        programs, assignments, slot_keys = compile_programs(
            computation.tables,
            self.addresses,
            self.dpids,
            computation.options,
            computation.generation,
            (computation.tables, computation.programs),
            merged,
            computation.weights,
            {k: dict(v) for k, v in computation.slot_keys.items()},
        )
        programs = enforce(programs, computation.partitions, self.attached, cookie_of(computation.generation))
        return replace(computation, programs=programs, weights=assignments, slot_keys=slot_keys)

    def route(
        self, computation: Computation, src: str, dst: str, sport: int | None = None, dscp: int = 0
    ) -> list[Hop]:
        """The path of a packet from `src` to `dst`: the table's, or — under a multipath policy, for a UDP
        packet from source port `sport` in traffic class `dscp` — the one its slots choose."""
        for name in (src, dst):
            if name not in self.declared.nodes:
                raise RouteError(f"unknown node {name!r}")
        options = computation.options
        multipath = dict(options.classes).get(dscp, options.policy) != "static"
        if sport is None or not multipath:
            return computation.tables.path(src, dst)
        tables = computation.tables
        subnet = tables.subnet
        levels = switch_levels(subnet).tolist()

        def choose(switch: int, lid: int, port: int) -> int:
            target = subnet.lid_target(lid)[0]
            if target == switch:
                return port
            bits = np.unpackbits(tables.alt[switch, target], count=subnet.n_ports)
            ports = tuple(int(p) for p in np.flatnonzero(bits))
            if len(ports) < 2:
                return port
            sets = computation.weights.get(subnet.switch_names[switch], {})
            assignment = sets.get(ports) or even_assignment(ports)
            return assignment[(sport >> slot_shift(levels[switch])) & (SLOTS - 1)]

        return tables.path(src, dst, choose)

    def lft(self, computation: Computation, switch: str) -> dict[int, int]:
        if switch not in self.dpids:
            raise UnknownSwitch(f"unknown switch {switch!r}")
        tables = computation.tables
        if switch not in tables.subnet.switch_index:
            return {}
        return tables.table(switch)


@dataclass
class SubnetManager:
    """A stateful convenience over `SubnetContext` (scripts, benchmarks, tests): remembers port state, the
    engine, options and the last computation.  The controller itself keeps that state in `controller.core`."""

    declared: Fabric
    engine: str = "ftree"
    options: ForwardingOptions = field(default_factory=ForwardingOptions)
    generation: int = 0
    registry: EngineRegistry = field(default_factory=default_registry)
    #: Engine to use when `engine` cannot route the live fabric (ftree on a non-tree), as OpenSM falls back;
    #: None: the engine routes anyway (ftree through a single root).
    fallback: str | None = None

    def __post_init__(self) -> None:
        self.registry.create(self.engine)  # unknown engine: fail before anything runs
        if self.fallback is not None:
            self.registry.create(self.fallback)
        self.context = SubnetContext.build(self.declared, self.registry)
        self.ports_down: dict[PortRef, float] = {}
        self.current: Computation | None = None

    @property
    def lids(self) -> LidMap:
        return self.context.lids

    @property
    def addresses(self) -> AddressTable:
        return self.context.addresses

    @property
    def dpids(self) -> Mapping[str, int]:
        return self.context.dpids

    def set_port_state(self, switch: str, port: int, up: bool, now: float) -> bool:
        """Record a port's liveness; True when that changes a declared link's usability (reroute needed)."""
        ref = PortRef(switch, port)
        if up == (ref not in self.ports_down):
            return False
        index = self.context.link_of(ref)
        was_up = index is not None and self.context.link_up(index, self.ports_down)
        if up:
            del self.ports_down[ref]
        else:
            self.ports_down[ref] = now
        return index is not None and self.context.link_up(index, self.ports_down) != was_up

    def compute(self, engine: str | None = None, options: ForwardingOptions | None = None) -> Computation:
        """Route the live fabric (without committing): raises on an unknown engine, changes nothing."""
        return self.context.compute(
            engine or self.engine,
            options or self.options,
            self.ports_down,
            self.generation + 1,
            self.current,
            self.fallback,
        )

    def commit(self, computation: Computation) -> None:
        self.current = computation
        self.generation = computation.generation
        self.engine = computation.engine
        self.options = computation.options

    def recompute(self, engine: str | None = None, options: ForwardingOptions | None = None) -> Computation:
        computation = self.compute(engine, options)
        self.commit(computation)
        return computation

    def require_current(self) -> Computation:
        if self.current is None:
            self.recompute()
        assert self.current is not None
        return self.current

    def route(self, src: str, dst: str) -> list[Hop]:
        return self.context.route(self.require_current(), src, dst)

    def lft(self, switch: str) -> dict[int, int]:
        return self.context.lft(self.require_current(), switch)


def policy_problem(
    fabric: Fabric, engine: str, options: ForwardingOptions, registry: EngineRegistry | None = None
) -> PolicyError | None:
    """Why `engine`'s tables of `fabric` cannot carry the policy in `options` (`Computation.policy_problem`),
    or None — the one check every entry point (the CLI's `controller`, `emulate up`, `compare`) runs before
    starting anything.  One full computation of the tables."""
    manager = SubnetManager(fabric, engine, options, registry=registry or default_registry())
    return manager.compute().policy_problem()


__all__ = [
    "Computation",
    "RecentRoutings",
    "SubnetContext",
    "SubnetManager",
    "UnknownSwitch",
    "policy_problem",
]
