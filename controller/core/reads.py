"""Switches read back: what the core makes of one read, or of many at once.

A fabric coming up connects all its switches within seconds.  Handled one at a time, each connection is a
read and a barrier-confirmed push in a row — three round trips per switch while its ovs-vswitchd is busy
taking everyone else's flows: 1.5 to 3 switches a second at k=16, minutes for 320.  So the service reads
the switches of a batch of connections concurrently and hands the core one `SwitchesRead`; each read is
applied exactly as a lone read would be, and the switches that need flows get them in one rollout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from controller.core.events import ProbeLinks, SwitchesConnected, SwitchesRead
from controller.core.state import Config, FabricState, RecordKind
from controller.core.step import Builder
from controller.sm.intents import SwitchProgram, rollout
from controller.sm.manager import Computation, SubnetContext
from topologies.model import PortRef


class Core(Protocol):
    """What a read needs of the decision core (`controller.core.fabric.FabricCore`): the steps it shares
    with the core's other handlers.  A protocol, so this module does not import the core that calls it."""

    context: SubnetContext

    def connected_one(self, step: Builder, dpid: int) -> None: ...

    def set_port(self, ports_down: dict[PortRef, float], ref: PortRef, live: bool, now: float) -> bool: ...

    def neighbour_dpids(self, state: FabricState, switch: str) -> list[int]: ...

    def compute(self, step: Builder, config: Config) -> Computation: ...

    def reserve(self, step: Builder, generation: int, config: Config) -> None: ...

    def commit(self, step: Builder, computation: Computation, config: Config) -> None: ...

    def rollout(
        self,
        step: Builder,
        kind: RecordKind,
        detected_at: float,
        only: Iterable[str] | None = None,
        request: int | None = None,
        **details: Any,
    ) -> None: ...


def switches_connected(core: Core, step: Builder, event: SwitchesConnected) -> None:
    """Each connection as if alone (the reads they ask for are made concurrently by the service)."""
    for dpid in dict.fromkeys(event.dpids):
        core.connected_one(step, dpid)


def switches_read(core: Core, step: Builder, event: SwitchesRead) -> None:
    """Apply every read; then one rollout for the switches that need flows — the whole fabric if a port
    changed or nothing was computed yet — and LLDP probes around every newly connected switch."""
    connects: list[str] = []
    repairs: list[str] = []
    detected: list[float] = []
    ports_down_seen: dict[str, tuple[int, ...]] = {}
    probes: list[int] = []
    changed = False
    for read in event.reads:
        name = core.context.switch_of_dpid.get(read.dpid)
        if name is None or name not in step.state.connected:
            continue  # disconnected while being read: its next connection reads it again
        ports_down = dict(step.state.ports_down)
        port_changed = False
        discovery = step.state.discovery
        repairing = step.state.repairing.get(name)
        # A connection's first read sets its ports; after that, port-status messages do (they arrive on the
        # same connection, and one may wait in the queue behind this read: taking the port from the read
        # would leave that message nothing to report).
        dead: list[PortRef] = []
        for port in core.context.declared_ports(name) if repairing is None else ():
            live = read.ports.get(port, False)
            port_changed |= core.set_port(ports_down, PortRef(name, port), live, step.now)
            if not live:
                dead.append(PortRef(name, port))
        discovery = discovery.forget_ports(dead)
        program = SwitchProgram.of(name, read.dpid, read.flows, read.groups)
        step.update(
            ports_down=ports_down,
            installed={**step.state.installed, name: program},
            discovery=discovery,
            repairing={k: v for k, v in step.state.repairing.items() if k != name},
        )
        current = step.state.current
        ports_down_seen[name] = tuple(sorted(p for p, up in read.ports.items() if not up))
        if repairing is not None and not port_changed and current is not None:
            # A repair or an audit: only this switch, and nothing at all if it holds what it should.
            if rollout({name: program}, current.programs):
                repairs.append(name)
                detected.append(repairing)
            elif name in current.programs:
                step.update(synced=step.state.synced | {name})
            continue
        changed |= port_changed
        if repairing is None:
            connects.append(name)
            detected.append(step.state.discovery.connected_at.get(name, step.now))
            probes += [read.dpid, *core.neighbour_dpids(step.state, name)]
        else:
            repairs.append(name)
            detected.append(repairing)
    if not connects and not repairs:
        return
    details: dict[str, Any]
    names = connects + repairs
    if len(names) == 1:  # as it always was for one switch
        details = {"switch": names[0], "ports_down": ports_down_seen[names[0]]}
    else:  # a record each when the rollout is done (see FabricCore._rollout_done)
        times = dict(zip(names, detected, strict=True))
        details = {"each": tuple((n, ports_down_seen[n], times[n]) for n in names)}
    kind = RecordKind.SWITCH_CONNECT if connects else RecordKind.RECONCILE
    if changed or step.state.current is None:
        config = step.state.config
        computation = core.compute(step, config)
        core.reserve(step, computation.generation, config)
        core.commit(step, computation, config)
        core.rollout(step, kind, min(detected), **details)
    else:
        core.rollout(step, kind, min(detected), only=names, **details)
    if probes:
        step.emit(ProbeLinks(tuple(dict.fromkeys(probes))))


__all__ = ["switches_connected", "switches_read"]
