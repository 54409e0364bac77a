"""Drive the controller's decision core without threads: events in, commands executed against fake switches.

`CoreDriver` runs the controller's own executor (`controller.executor`, as `controller.service.FabricService`
does on its worker thread) — an event to `FabricCore.handle`, the commands it returns carried out against
the fake southbound (real OpenFlow bytes, see `tests.fakes`), their outcomes fed back depth first — but
synchronously, with a clock the test sets and each read made on its own.  Tests keep every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.core.events import (
    Event,
    LinkSighting,
    LinksSeen,
    Log,
    Phase,
    PortChange,
    PortsChanged,
    ProbeLinks,
    Push,
    PushDone,
    ReadSwitch,
    Reply,
    Save,
    Saved,
    Start,
    SwitchConnected,
    SwitchRead,
    SwitchReadFailed,
)
from controller.core.fabric import FabricCore, Step
from controller.core.state import Config, FabricState, Record
from controller.executor import Executor
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import SubnetContext
from controller.sm.partitions import Partitions
from controller.sm.policies import PolicyParams
from controller.statestore import SavedState
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.model import Fabric


@dataclass
class CoreDriver:
    fabric: Fabric
    engine: str = "ftree"
    options: ForwardingOptions = field(default_factory=ForwardingOptions)
    saved: SavedState | None = None
    params: PolicyParams = field(default_factory=PolicyParams)
    link_scale: float = 1.0
    partitions: Partitions | None = None

    def __post_init__(self) -> None:
        self.context = SubnetContext.build(self.fabric)
        self.core = FabricCore(self.context, link_scale=self.link_scale)
        config = Config(self.engine, self.options, self.params, self.partitions)
        self.state: FabricState = self.core.initial_state(self.saved, config)
        self.fake = FakeFabric(self.fabric, self.context.addresses)
        self.sb = FakeSouthbound(self.fake, self)
        self.now = 0.0
        self.steps: list[Step] = []
        self.saves: list[SavedState] = []
        self.save_error: str | None = None
        self.replies: dict[int, Reply] = {}
        self.logs: list[Log] = []
        self._sightings: list[LinkSighting] = []

    # --- the listener interface FakeSouthbound calls (LLDP answers) -------------------------------------

    def link_seen(self, src_dpid: int, src_port: int, dst_dpid: int, dst_port: int, now: float) -> None:
        self._sightings.append(LinkSighting(src_dpid, src_port, dst_dpid, dst_port, self.now))

    # --- driving -----------------------------------------------------------------------------------------

    def feed(self, event: Event, now: float | None = None) -> list[Step]:
        """Handle `event` at `now` (default: the driver's clock) and everything it causes, through the
        controller's own executor (`controller.executor`)."""
        if now is not None:
            self.now = now
        steps: list[Step] = []

        def on_step(step: Step) -> None:  # the state as of each step: tests look between a push's phases
            self.state = step.state
            steps.append(step)

        self.state = Executor(self.core, self, lambda: self.now, on_step=on_step).run(self.state, event)
        self.steps += steps
        return steps

    # --- Effects: what each command does here ------------------------------------------------------------

    def read(self, command: ReadSwitch) -> Event:
        if command.dpid not in self.sb.up:
            return SwitchReadFailed(command.dpid, "not connected")
        snap = self.sb.read_switch(command.dpid)
        return SwitchRead(command.dpid, snap.ports, tuple(snap.flows), tuple(snap.groups))

    def push(self, command: Push) -> Event:
        """One phase on the fake switches, said to take a millisecond (the driver's clock stays put)."""
        problems = self.sb.push(command.deltas, command.phase) if command.deltas else {}
        offset = 0.001 if command.phase is Phase.MAKE else 0.002
        return PushDone(command.rollout, command.phase, problems, self.now, self.now + offset)

    def probe(self, command: ProbeLinks) -> None:
        self.sb.probe_links(command.dpids)

    def save(self, command: Save) -> Saved:
        if self.save_error is not None:
            return Saved(self.save_error)
        self.saves.append(command.state)
        return Saved()

    def log(self, command: Log) -> None:
        self.logs.append(command)

    def reply(self, command: Reply) -> None:
        self.replies[command.request] = command

    def drain(self) -> list[Event]:
        """The fake switches answered LLDP probes synchronously: one `LinksSeen` after the step's outcomes."""
        if not self._sightings:
            return []
        seen, self._sightings = LinksSeen(tuple(self._sightings)), []
        return [seen]

    def start(self) -> list[Step]:
        return self.feed(Start())

    def connect_all(self) -> None:
        for dpid in sorted(self.sb.dpids.values()):
            self.sb.up.add(dpid)
            self.feed(SwitchConnected(dpid))

    def set_link(self, index: int, up: bool) -> list[Step]:
        """Cut or restore a cable on the fake fabric; the controller hears both ends at once."""
        ends = self.fake.set_link(index, up=up)
        changes = tuple(PortChange(self.sb.dpids[e.node], e.port, up, self.now) for e in ends)
        return self.feed(PortsChanged(changes))

    def records(self, kind: str | None = None) -> list[Record]:
        return [r for r in self.state.records if kind is None or r.kind == kind]

    def assert_holds_desired(self) -> None:
        current = self.state.current
        assert current is not None
        for name, program in current.programs.items():
            switch = self.fake.switches[name]
            assert {k: f.actions for k, f in switch.flows.items()} == {
                k: f.actions for k, f in program.flows.items()
            }, name
            assert switch.groups == dict(program.groups), name


__all__ = ["CoreDriver"]
