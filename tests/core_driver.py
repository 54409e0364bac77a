"""Drive the controller's decision core without threads: events in, commands executed against fake switches.

`CoreDriver` does what `controller.service.FabricService` does — hand an event to `FabricCore.handle`, run
the commands it returns against the fake southbound (real OpenFlow bytes, see `tests.fakes`), feed their
outcomes back depth first — but synchronously, with a clock the test sets.  Tests keep every step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from controller.core.events import (
    Event,
    LinkSighting,
    LinksSeen,
    Log,
    PortChange,
    PortsChanged,
    ProbeLinks,
    Push,
    ReadSwitch,
    Reply,
    RolloutDone,
    Save,
    Saved,
    Start,
    SwitchConnected,
    SwitchRead,
    SwitchReadFailed,
)
from controller.core.fabric import FabricCore, Step
from controller.core.state import Config, FabricState, Record
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import SubnetContext
from controller.sm.partitions import Partitions
from controller.sm.policies import PolicyParams
from controller.state import SavedState
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
        """Handle `event` at `now` (default: the driver's clock) and everything it causes."""
        if now is not None:
            self.now = now
        steps: list[Step] = []
        pending: deque[Event] = deque([event])
        while pending:
            step = self.core.handle(self.state, self.now, pending.popleft())
            self.state = step.state
            steps.append(step)
            outcomes = [o for o in map(self._execute, step.commands) if o is not None]
            if self._sightings:
                outcomes.append(LinksSeen(tuple(self._sightings)))
                self._sightings = []
            pending.extendleft(reversed(outcomes))
        self.steps += steps
        return steps

    def _execute(self, command: Any) -> Event | None:
        if isinstance(command, ReadSwitch):
            if command.dpid not in self.sb.up:
                return SwitchReadFailed(command.dpid, "not connected")
            snap = self.sb.read_switch(command.dpid)
            return SwitchRead(command.dpid, snap.ports, tuple(snap.flows), tuple(snap.groups))
        if isinstance(command, Push):
            pushed = self.now
            problems = self.sb.push(command.deltas, "make")
            rest = {k: v for k, v in command.deltas.items() if k not in problems}
            problems.update(self.sb.push(rest, "break"))
            return RolloutDone(command.rollout, problems, pushed, pushed + 0.001, pushed + 0.002)
        if isinstance(command, ProbeLinks):
            self.sb.probe_links(command.dpids)
            return None
        if isinstance(command, Save):
            if self.save_error is not None:
                return Saved(self.save_error)
            self.saves.append(command.state)
            return Saved()
        if isinstance(command, Log):
            self.logs.append(command)
            return None
        if isinstance(command, Reply):
            self.replies[command.request] = command
            return None
        raise TypeError(command)

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
