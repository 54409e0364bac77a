"""The subnet manager's state machine: declared fabric + live port state -> routed tables -> switch programs.

Pure and single-threaded by design: every method takes the time (`now`, seconds) from its caller and returns
data; the service around it owns threads, clocks and I/O.  That keeps routing decisions reproducible (same
events in, same tables out) and lets unit tests drive the whole controller logic against fake switches.

Liveness is tracked per port, as switches report it.  A link is usable when neither end is reported down;
what the subnet manager routes is the part of the live fabric with the most hosts (hosts cut off entirely
lose their routes until a link returns).  LIDs, and so addresses, never move: they come from the declared
fabric and re-sweeps keep them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.sm.addressing import AddressTable
from controller.sm.engines import EngineRegistry, RoutingEngine, default_registry, select_engine
from controller.sm.incremental import NotIncremental, reroute
from controller.sm.intents import ForwardingOptions, SwitchProgram, compile_programs
from controller.sm.lids import LidMap, assign_lids
from controller.sm.subnet import Subnet
from controller.sm.tables import Hop, RouteError, RoutingTables
from controller.sm.validation import Discovery
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


@dataclass
class SubnetManager:
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
        self.lids: LidMap = assign_lids(self.declared)
        self.addresses = AddressTable.build(self.lids)
        self.dpids: dict[str, int] = {s.name: s.guid for s in self.declared.switches}
        self.switch_of_dpid: dict[int, str] = {d: n for n, d in self.dpids.items()}
        self.ports_down: dict[PortRef, float] = {}
        self.discovery = Discovery(self.declared, self.dpids)
        self.current: Computation | None = None

    # --- port and link state ---------------------------------------------------------------------------

    def switch_name(self, dpid: int) -> str:
        try:
            return self.switch_of_dpid[dpid]
        except KeyError:
            raise UnknownSwitch(f"datapath {dpid:016x} is not a switch of {self.declared.name}") from None

    def set_port_state(self, switch: str, port: int, up: bool, now: float) -> bool:
        """Record a port's liveness; True when that changes a declared link's usability (reroute needed)."""
        ref = PortRef(switch, port)
        was_down = ref in self.ports_down
        if up == (not was_down):
            return False
        entry = self.declared.port_map.get(ref)
        link_was_up = entry is not None and self.link_up(entry[0])
        if up:
            del self.ports_down[ref]
        else:
            self.ports_down[ref] = now
            self.discovery.forget_port(switch, port)
        return entry is not None and self.link_up(entry[0]) != link_was_up

    def link_up(self, index: int) -> bool:
        link = self.declared.links[index]
        return link.a not in self.ports_down and link.b not in self.ports_down

    def down_links(self) -> list[int]:
        return [i for i in range(len(self.declared.links)) if not self.link_up(i)]

    def live_fabric(self) -> tuple[Fabric, tuple[str, ...]]:
        reduced = self.declared.without(links=self.down_links())
        kept = largest_component(reduced)
        stray = [name for name in reduced.nodes if name not in kept]
        lost = tuple(sorted(n for n in stray if reduced.nodes[n].is_host))
        return (reduced.without(nodes=stray) if stray else reduced), lost

    # --- routing ---------------------------------------------------------------------------------------

    def compute(self, engine: str | None = None, options: ForwardingOptions | None = None) -> Computation:
        """Route the live fabric (without committing): raises on an unknown engine, changes nothing."""
        engine = engine or self.engine
        options = options or self.options
        router = self.registry.create(engine)
        live, lost = self.live_fabric()
        lids = assign_lids(live, previous=self.lids)
        note = None
        if self.fallback is not None:
            router, note = select_engine(self.registry, engine, Subnet.build(live, lids), self.fallback)
        tables, verification, changed = self._route(router, live, lids)
        generation = self.generation + 1
        previous = None
        if self.current is not None and self.current.engine == engine and self.current.options == options:
            previous = (self.current.tables, self.current.programs)
        programs = compile_programs(tables, self.addresses, self.dpids, options, generation, previous)
        return Computation(
            generation=generation,
            engine=engine,
            options=options,
            tables=tables,
            programs=programs,
            verification=verification,
            down_links=tuple(str(self.declared.links[i]) for i in self.down_links()),
            lost_hosts=lost,
            incremental=changed is not None,
            changed_lids=changed,
            fallback=note,
        )

    def _route(
        self, router: RoutingEngine, live: Fabric, lids: LidMap
    ) -> tuple[RoutingTables, Verification, frozenset[int] | None]:
        """Incremental when the live fabric is the last computation's minus failures with the same engine
        (only destinations that used the failed part move); a full routing otherwise, or when the spliced
        tables do not verify."""
        current = self.current
        if current is not None and current.tables.engine == router.name:
            previous = current.tables
            try:
                result = reroute(previous, live, router, lids)
            except NotIncremental:
                result = None
            if result is not None and (result.failed_links or result.failed_switches or result.removed_lids):
                verification = verify(result.tables)
                if verification.ok:
                    return result.tables, verification, result.changed_lids
                return result.full, verify(result.full), None
        tables = router.route(Subnet.build(live, lids))
        return tables, verify(tables), None

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
        for name in (src, dst):
            if name not in self.declared.nodes:
                raise RouteError(f"unknown node {name!r}")
        return self.require_current().tables.path(src, dst)

    def lft(self, switch: str) -> dict[int, int]:
        if switch not in self.dpids:
            raise UnknownSwitch(f"unknown switch {switch!r}")
        tables = self.require_current().tables
        if switch not in tables.subnet.switch_index:
            return {}
        return tables.table(switch)


__all__ = ["Computation", "SubnetManager", "UnknownSwitch"]
