"""The controller's decisions: `FabricCore.handle(state, now, event) -> Step(state, commands, records)`.

This is where the controller decides what to do — on a switch connecting or disconnecting, ports going
down or up, discovery sightings, a discovery round, an operator's routing change, and the outcome of its
own commands.  It is a pure function in Faucet's Valve shape: no threads, no clock (the time is passed in),
no I/O; it returns the new state, the commands for the executor (read a switch, push a rollout, probe
links, save state, reply, log) and the records for the event log.  The service runs it on one worker
thread; unit tests run it with sequences of events and timestamps.

Rules it keeps:

* **Make before break**: a rollout adds everything on every switch, confirms, then deletes (`Push`).
* **Persist before commit**: an operator change takes effect only after the new choice is on disk; a failed
  save changes nothing and is reported to the caller.
* **Generations are reserved in blocks** on disk (`GENERATION_BLOCK`), so a cookie generation is never
  reused after a restart while reroutes do not wait for the disk.
* **Reconnects diff**: a switch that (re)connects is read back and only the difference is sent.
* **Adaptive routing decides here too**: counter samples arrive as events (`CountersSampled`); the core
  turns them into utilisation, asks `controller.sm.adaptive.rebalance` per slot table, and rolls out the
  moved slots like any other change (make before break), each move an event with its reason.  Moves keep
  the table generation: they change weights, not routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from controller.core import adaptive, discovery, operator, reads
from controller.core.events import (
    CountersSampled,
    Event,
    FlowRemoval,
    FlowsRemoved,
    HostSeen,
    LinksSeen,
    LogLevel,
    PartitionEditRequested,
    PartitionsRequested,
    Phase,
    PolicyRequested,
    PortsChanged,
    ProbeLinks,
    Push,
    PushDone,
    QosPolicyRequested,
    ReadSwitch,
    Reply,
    RoutingRequested,
    Save,
    Saved,
    Start,
    SwitchConnected,
    SwitchDisconnected,
    SwitchesConnected,
    SwitchesRead,
    SwitchRead,
    SwitchReadFailed,
    Tick,
)
from controller.core.operator import GENERATION_BLOCK
from controller.core.queries import changed_destinations, dry_run
from controller.core.state import (
    Config,
    FabricState,
    PendingRollout,
    RecordKind,
    RolloutOutcome,
)
from controller.core.step import Builder, StateNotSaved, Step, config_of, saved_state
from controller.sm.intents import (
    MAX_GENERATION,
    GenerationExhausted,
    SwitchDelta,
    SwitchProgram,
    applied,
    holding,
    rollout,
)
from controller.sm.manager import Computation, SubnetContext
from controller.sm.ordering import make_waves
from controller.sm.partitions_conf import resolve, rule_from_dict
from controller.sm.policies import default_policies
from controller.sm.validation import DISCOVERY_GRACE_S
from controller.statestore import SavedState
from topologies.model import PortRef

#: Every `Tick` reads back this share of the switches (round robin) and repairs what differs: a full audit
#: every AUDIT_ROUNDS ticks.  The safety net for what no OpenFlow message reports (an entry modified or
#: added behind the controller's back); entries deleted behind its back are reported at once (flow-removed).
AUDIT_ROUNDS = 6
#: ... but a tick reads back at most this many table entries (and at least one switch).  Reading a table
#: costs the controller ~0.1 ms of parsing per entry and the switch a dump: at k=16 (352,000 entries) a
#: sixth of the fabric per 10 s tick kept a core busy, delayed reads past their deadline and starved
#: discovery.  Above ~12,000 entries in all the full audit takes longer than AUDIT_ROUNDS ticks (k=16: one
#: switch a tick, 53 minutes; k=8 still a minute).
AUDIT_ENTRIES_PER_TICK = 2000


class FabricCore:
    """Decisions for one declared fabric.  Holds no changing state of its own."""

    def __init__(
        self,
        context: SubnetContext,
        lldp_ttl_s: float = 30.0,
        grace_s: float = DISCOVERY_GRACE_S,
        link_scale: float = 1.0,
    ) -> None:
        """`link_scale`: what a link really carries per declared bit/s (an emulator shaping 400 Gb/s links
        to 200 Mb/s: 0.0005) — adaptive routing's utilisation is relative to that capacity."""
        self.context = context
        self.lldp_ttl_s = lldp_ttl_s
        self.grace_s = grace_s
        self.policies = default_policies()
        self.capacity_bps: dict[PortRef, float] = {}
        for link in context.declared.links:
            for end in (link.a, link.b):
                self.capacity_bps[end] = link.bw_gbps * 1e9 * link_scale
        self._handlers: dict[type, Callable[[Builder, Any], None]] = {
            Start: self._start,
            SwitchConnected: self._connected,
            SwitchesConnected: partial(reads.switches_connected, self),
            SwitchRead: lambda step, event: reads.switches_read(self, step, SwitchesRead((event,))),
            SwitchesRead: partial(reads.switches_read, self),
            SwitchReadFailed: self._read_failed,
            SwitchDisconnected: self._disconnected,
            PortsChanged: self._ports,
            FlowsRemoved: self._flows_removed,
            LinksSeen: partial(discovery.links_seen, context),
            HostSeen: partial(discovery.host_seen, context),
            Tick: self._tick,
            RoutingRequested: partial(operator.routing_requested, self),
            PolicyRequested: partial(operator.policy_requested, self),
            PartitionsRequested: partial(operator.partitions_requested, self),
            PartitionEditRequested: partial(operator.partition_edit_requested, self),
            QosPolicyRequested: partial(operator.qos_requested, self),
            CountersSampled: self._counters,
            Saved: self._saved,
            PushDone: self._push_done,
        }

    def initial_state(self, saved: SavedState | None = None, config: Config | None = None) -> FabricState:
        """The state before `Start`: saved operator choices, overridden by `config` (the command line)."""
        base = Config()
        generation = 0
        if saved is not None:
            base = config_of(saved)
            if saved.partitions is not None:  # resolved again: the topology is the one running now
                rules = [rule_from_dict(p, 0) for p in saved.partitions]
                base = replace(base, partitions=resolve(rules, self.context.declared, add_default=False))
            generation = saved.generation
        chosen = config or base
        self.context.registry.create(chosen.engine)  # an unknown engine fails before anything runs
        chosen.policy.validate(self.policies)  # so does an unknown policy or a bad parameter
        if generation > MAX_GENERATION - GENERATION_BLOCK:
            raise GenerationExhausted(f"generation {generation} leaves no room below 2^48")
        return FabricState(config=chosen, generation=generation, reserved=generation)

    def handle(self, state: FabricState, now: float, event: Event) -> Step:
        step = Builder(state, now)
        self._handlers[type(event)](step, event)
        return step.done()

    # --- routing and rollouts ------------------------------------------------------------------------------

    def compute(self, step: Builder, config: Config) -> Computation:
        generation = step.state.generation + 1
        if generation > MAX_GENERATION:
            raise GenerationExhausted("cookie generations exhausted (2^48)")
        previous = step.state.current
        return self.context.compute(
            config.engine, config.options, step.state.ports_down, generation, previous,
            partitions=config.partitions,
        )  # fmt: skip

    def reserve(self, step: Builder, generation: int, config: Config) -> None:
        """Before cookies carry `generation`, make sure the disk says it is used (see GENERATION_BLOCK)."""
        if generation > step.state.reserved:
            reserved = min(generation + GENERATION_BLOCK, MAX_GENERATION)
            step.update(reserved=reserved)
            step.emit(Save(saved_state(config, reserved)))

    def commit(self, step: Builder, computation: Computation, config: Config) -> None:
        """`computation` becomes the current one.  A switch that held the previous program exactly and whose
        program the computation reused (the same object: its rows did not change) still holds it exactly:
        it stays synced, and no rollout diffs it again (at k=16 a cable cut reprograms a few dozen of 320
        switches; diffing the rest cost half a second)."""
        state = step.state
        previous = state.current
        kept = frozenset(
            name
            for name in state.synced
            if previous is not None and previous.programs.get(name) is computation.programs.get(name)
        )
        step.update(current=computation, generation=computation.generation, config=config, synced=kept)

    def rollout(
        self,
        step: Builder,
        kind: RecordKind,
        detected_at: float,
        only: Iterable[str] | None = None,
        request: int | None = None,
        previous: Computation | None = None,
        **details: Any,
    ) -> None:
        """Send the current computation's changes to the switches (`only`: to those), make before break.
        With `previous` (what the switches held), the make phase goes in waves, downstream switches first
        (`controller.sm.ordering`)."""
        state = step.state
        computation = state.current
        assert computation is not None
        names = set(only) if only is not None else set(state.installed)
        installed: dict[str, SwitchProgram | None] = {
            n: p for n, p in state.installed.items() if n in names and n in state.connected
        }
        deltas = rollout(installed, computation.programs, skip=state.synced)
        in_step = frozenset(n for n in installed if n not in deltas and n in computation.programs)
        # they hold their program exactly: noted, so that its next patch is diffed along the patch
        noted = holding(installed, computation.programs, in_step)
        step.update(synced=state.synced | in_step, installed={**state.installed, **noted})
        rollout_id = state.next_rollout
        waves = make_waves(previous.tables if previous is not None else None, computation.tables, deltas)
        step.update(
            next_rollout=rollout_id + 1,
            pending_rollout=PendingRollout(
                rollout=rollout_id,
                computation=computation,
                kind=kind,
                detected_at=detected_at,
                computed_at=step.now,
                deltas=deltas,
                flow_mods=sum(d.n_messages for d in deltas.values()),
                details=details,
                request=request,
                waves=waves,
            ),
        )
        self._push_wave(step, rollout_id, 0)

    def _push_wave(self, step: Builder, rollout_id: int, wave: int) -> None:
        pending = step.state.pending_rollout
        assert pending is not None
        names = pending.waves[wave] if pending.waves else frozenset(pending.deltas)
        by_dpid = {d.dpid: d for name, d in pending.deltas.items() if name in names}
        step.update(pending_rollout=replace(pending, wave=wave))
        step.emit(Push(rollout_id, by_dpid, Phase.MAKE, Push.timeout_for(by_dpid)))

    def _push_done(self, step: Builder, done: PushDone) -> None:
        """Make before break: the make phase confirmed, the break phase goes to the switches whose make
        succeeded (a switch that failed keeps its old entries too, and is read back); the break phase
        confirmed, the rollout is done."""
        pending = step.state.pending_rollout
        if pending is None or pending.rollout != done.rollout:
            step.log(LogLevel.ERROR, f"rollout {done.rollout} ({done.phase}) finished but was not pending")
            return
        if done.phase is Phase.MAKE:
            problems = {**pending.make_problems, **done.problems}
            pushed_at = pending.pushed_at if pending.pushed_at is not None else done.started_at
            pending = replace(pending, pushed_at=pushed_at, made_at=done.done_at, make_problems=problems)
            step.update(pending_rollout=pending)
            if pending.wave + 1 < len(pending.waves):  # the next wave, downstream of it confirmed
                self._push_wave(step, done.rollout, pending.wave + 1)
                return
            rest = {d.dpid: d for d in pending.deltas.values() if d.dpid not in problems}
            if rest:
                step.emit(Push(done.rollout, rest, Phase.BREAK, Push.timeout_for(rest)))
                return
            self._rollout_done(step, RolloutOutcome(done.rollout, problems, pushed_at, done.done_at,
                                                 done.done_at))  # fmt: skip
            return
        assert pending.pushed_at is not None and pending.made_at is not None
        problems = {**pending.make_problems, **done.problems}
        self._rollout_done(step, RolloutOutcome(done.rollout, problems, pending.pushed_at, pending.made_at,
                                             done.done_at))  # fmt: skip

    def _rollout_done(self, step: Builder, done: RolloutOutcome) -> None:
        pending = step.state.pending_rollout
        if pending is None or pending.rollout != done.rollout:
            step.log(LogLevel.ERROR, f"rollout {done.rollout} finished but was not pending")
            return
        state = step.state
        installed = dict(state.installed)
        synced = set(state.synced)
        reading: list[str] = []
        deltas: Mapping[str, SwitchDelta] = pending.deltas
        for name, delta in deltas.items():
            if delta.dpid in done.problems:
                installed.pop(name, None)  # unknown contents: read back
                synced.discard(name)
                if name in state.connected:
                    reading.append(name)
            elif name in installed:
                installed[name] = applied(installed[name], delta)
                synced.add(name)
        step.update(installed=installed, synced=frozenset(synced), pending_rollout=None)
        if done.problems:
            step.update(failed_updates=state.failed_updates + 1)
            step.log(
                LogLevel.ERROR,
                f"update of {len(done.problems)} switch(es) failed: {dict(done.problems)}; re-reading them",
            )
        for name in reading:
            step.emit(ReadSwitch(self.context.dpids[name]))
        computation: Computation = pending.computation
        details = dict(pending.details)
        each = details.pop("each", None)
        for name, ports_down, detected_at in each or ():  # switches read together: a record each, as alone
            found = deltas.get(name)
            failed = {f"{k:016x}": v for k, v in done.problems.items() if found and k == found.dpid}
            step.record(
                pending.kind,
                generation=computation.generation,
                detected_at=detected_at,
                computed_ms=_ms(detected_at, done.pushed_at),
                installed_ms=_ms(detected_at, done.made_at),
                cleaned_ms=_ms(detected_at, done.done_at),
                switches_updated=int(found is not None),
                flow_mods=found.n_messages if found is not None else 0,
                failed_switches=failed,
                verification_ok=computation.verification.ok,
                lost_hosts=computation.lost_hosts,
                switch=name,
                ports_down=ports_down,
            )
        if each:
            return
        record = step.record(
            pending.kind,
            generation=computation.generation,
            detected_at=pending.detected_at,
            computed_ms=_ms(pending.detected_at, done.pushed_at),
            installed_ms=_ms(pending.detected_at, done.made_at),
            cleaned_ms=_ms(pending.detected_at, done.done_at),
            switches_updated=len(deltas),
            flow_mods=pending.flow_mods,
            failed_switches={f"{k:016x}": v for k, v in done.problems.items()},
            verification_ok=computation.verification.ok,
            lost_hosts=computation.lost_hosts,
            **details,
        )
        if pending.request is not None:
            step.emit(Reply(pending.request, record.as_dict()))

    # --- start, switches and ports -----------------------------------------------------------------------

    def _start(self, step: Builder, _: Start) -> None:
        config = step.state.config
        computation = self.compute(step, config)
        self.reserve(step, computation.generation, config)
        self.commit(step, computation, config)
        step.record(RecordKind.ROUTING_COMPUTED, generation=computation.generation, engine=config.engine)

    def _connected(self, step: Builder, event: SwitchConnected) -> None:
        self.connected_one(step, event.dpid)

    def connected_one(self, step: Builder, dpid: int) -> None:
        name = self.context.switch_of_dpid.get(dpid)
        state = step.state
        if name is None:
            if dpid not in state.unknown_switches:
                step.update(unknown_switches=state.unknown_switches | {dpid})
                step.log(
                    LogLevel.WARNING,
                    f"datapath {dpid:016x} is not a switch of {self.context.declared.name}; leaving it alone",
                )
                step.record(RecordKind.UNKNOWN_SWITCH, dpid=f"{dpid:016x}")
            return
        installed = {k: v for k, v in state.installed.items() if k != name}
        step.update(
            connected=state.connected | {name},
            installed=installed,
            synced=state.synced - {name},
            discovery=state.discovery.switch_connected(name, step.now),
            repairing={k: v for k, v in state.repairing.items() if k != name},
        )
        step.emit(ReadSwitch(dpid))

    def _read_failed(self, step: Builder, event: SwitchReadFailed) -> None:
        name = self.context.switch_of_dpid.get(event.dpid)
        repairing = step.state.repairing
        step.update(repairing={k: v for k, v in repairing.items() if k != name})  # the next Tick retries
        step.log(LogLevel.WARNING, f"reading switch {name or event.dpid} failed: {event.reason}")
        step.record(RecordKind.SWITCH_READ_FAILED, switch=name, reason=event.reason)

    def _disconnected(self, step: Builder, event: SwitchDisconnected) -> None:
        name = self.context.switch_of_dpid.get(event.dpid)
        state = step.state
        if name is None or name not in state.connected:
            return
        step.update(
            connected=state.connected - {name},
            installed={k: v for k, v in state.installed.items() if k != name},
            synced=state.synced - {name},
            discovery=state.discovery.switch_disconnected(name),
            repairing={k: v for k, v in state.repairing.items() if k != name},
        )
        step.record(RecordKind.SWITCH_DISCONNECT, switch=name, detected_at=step.now)

    def set_port(self, ports_down: dict[PortRef, float], ref: PortRef, live: bool, now: float) -> bool:
        """Record a port's liveness in `ports_down`; True when a declared link's usability changed."""
        if live == (ref not in ports_down):
            return False
        index = self.context.link_of(ref)
        was_up = index is not None and self.context.link_up(index, ports_down)
        if live:
            del ports_down[ref]
        else:
            ports_down[ref] = now
        return index is not None and self.context.link_up(index, ports_down) != was_up

    def _ports(self, step: Builder, event: PortsChanged) -> None:
        ports_down = dict(step.state.ports_down)
        discovery = step.state.discovery
        changes: list[str] = []
        ups: list[bool] = []
        lost: list[PortRef] = []
        for change in event.changes:
            name = self.context.switch_of_dpid.get(change.dpid)
            if name is None:
                continue
            if self.set_port(ports_down, PortRef(name, change.port), change.live, change.at):
                changes.append(f"{name}:{change.port} {'up' if change.live else 'down'}")
                ups.append(change.live)
            if not change.live:
                lost.append(PortRef(name, change.port))
        step.update(ports_down=ports_down, discovery=discovery.forget_ports(lost))
        if not changes or step.state.current is None:
            return
        config = step.state.config
        previous = step.state.current
        computation = self.compute(step, config)
        self.reserve(step, computation.generation, config)
        self.commit(step, computation, config)
        kind = RecordKind.PORT_UP if all(ups) else RecordKind.PORT_DOWN
        detected = min(c.at for c in event.changes)
        self.rollout(step, kind, detected, previous=previous, ports=tuple(changes),
                      changed_destinations=changed_destinations(previous, computation))  # fmt: skip

    def _flows_removed(self, step: Builder, event: FlowsRemoved) -> None:
        """Entries gone from a switch.  Ours removed by our own rollouts are already gone from `installed`
        (their removal was confirmed before this event is handled) or were replaced by a newer cookie;
        anything else the switch lost behind the controller's back: read it back and repair it."""
        state = step.state
        lost: dict[str, list[FlowRemoval]] = {}
        for removal in event.removals:
            name = self.context.switch_of_dpid.get(removal.dpid)
            program = state.installed.get(name) if name is not None else None
            if name is None or program is None or name in state.repairing:
                continue
            held = program.flows.get(removal.flow.key)
            if held is not None and held.cookie == removal.flow.cookie:
                lost.setdefault(name, []).append(removal)
        for name, removals in sorted(lost.items()):
            detected = min(r.at for r in removals)
            reasons = ", ".join(sorted({r.reason for r in removals}))
            step.log(
                LogLevel.WARNING,
                f"{name} lost {len(removals)} entries it should hold ({reasons}); reading it back to repair",
            )
            step.record(RecordKind.ENTRIES_LOST, switch=name, detected_at=detected,
                        entries_lost=len(removals), reason=reasons)  # fmt: skip
            self._read_back(step, name, detected)

    def _read_back(self, step: Builder, name: str, detected: float) -> None:
        state = step.state
        step.update(
            installed={k: v for k, v in state.installed.items() if k != name},
            synced=state.synced - {name},
            repairing={**state.repairing, name: detected},
        )
        step.emit(ReadSwitch(self.context.dpids[name]))

    def _audit(self, step: Builder) -> None:
        """Read back the next share of the switches (round robin over the declared ones)."""
        names = [s.name for s in self.context.declared.switches]
        if not names or step.state.current is None:
            return
        share = -(-len(names) // AUDIT_ROUNDS)
        start = step.state.audit_next % len(names)
        chosen: list[str] = []
        entries = 0
        for i in range(share):
            name = names[(start + i) % len(names)]
            program = step.state.installed.get(name)
            size = len(program.flows) + len(program.groups) if program is not None else 0
            if chosen and entries + size > AUDIT_ENTRIES_PER_TICK:
                break
            chosen.append(name)
            entries += size
        step.update(audit_next=(start + len(chosen)) % len(names))
        for name in chosen:
            state = step.state
            if name in state.installed and name in state.connected and name not in state.repairing:
                self._read_back(step, name, step.now)

    def neighbour_dpids(self, state: FabricState, switch: str) -> list[int]:
        dpids = self.context.dpids
        far = {
            peer.node
            for ref, (_, peer) in self.context.declared.port_map.items()
            if ref.node == switch and peer.node in dpids and peer.node in state.connected
        }
        return sorted(dpids[n] for n in far)

    def _tick(self, step: Builder, _: Tick) -> None:
        state = step.state
        discovery = state.discovery.expire(step.now, self.lldp_ttl_s)
        step.update(discovery=discovery)
        dpids = self.context.dpids
        step.emit(ProbeLinks(tuple(sorted(dpids[n] for n in state.connected))))
        for name in sorted(state.connected - set(state.installed) - set(state.repairing)):
            step.emit(ReadSwitch(dpids[name]))  # a read that failed earlier: try again, once a round
        self._audit(step)
        report = discovery.report(self.context.declared, state.ports_down, step.now, self.grace_s)
        problems = tuple(
            [f"{e['link']} {e['status']}" for e in report["links"] if e["status"] in ("missing", "miswired")]
            + [f"{u} unexpected" for u in report["unexpected"]]
        )
        if problems != state.cabling_problems:  # log changes, not the same findings every round
            if problems:
                shown = "; ".join(problems[:10])
                step.log(LogLevel.WARNING, f"cabling: {len(problems)} problem(s): {shown}")
            else:
                step.log(LogLevel.INFO, "cabling: all declared links seen as declared")
            step.update(cabling_problems=problems)

    # --- operator changes (`controller.core.operator`) and their saves ---------------------------------

    def _saved(self, step: Builder, event: Saved) -> None:
        pending = step.state.pending_change
        if pending is None:  # a generation reservation (reroute or start)
            if event.error is not None:
                step.log(LogLevel.ERROR, f"could not save controller state: {event.error}")
                step.record(RecordKind.STATE_SAVE_FAILED, reason=event.error)
            return
        step.update(pending_change=None)
        if event.error is not None:
            step.emit(
                Reply(
                    pending.request or 0,
                    error=StateNotSaved(f"state not saved, nothing changed: {event.error}"),
                )
            )
            return
        reserved = max(
            step.state.reserved, min(pending.computation.generation + GENERATION_BLOCK, MAX_GENERATION)
        )
        step.update(reserved=reserved)
        previous = step.state.current
        self.commit(step, pending.computation, pending.config)
        details: dict[str, Any] = {"engine": pending.config.engine}
        if pending.kind is RecordKind.POLICY_CHANGE:
            details = {"policy": pending.config.options.policy, "reason": "operator request"}
        elif pending.kind is RecordKind.PARTITION_CHANGE:
            details = {"reason": pending.reason}
        elif pending.kind is RecordKind.QOS_POLICY:
            details = {"reason": pending.reason, "changes": pending.changes}
        self.rollout(step, pending.kind, pending.detected_at, request=pending.request, previous=previous,
                     **details)  # fmt: skip

    # --- adaptive routing ----------------------------------------------------------------------------------

    def _counters(self, step: Builder, event: CountersSampled) -> None:
        """A counter sample: utilisation per switch port; under an adaptive policy, slot moves for every
        slot table with a hot port (or back towards even weights), rolled out as one change."""
        state = step.state
        decision = adaptive.sample(state, event, self.context.switch_of_dpid, self.capacity_bps, step.now)
        step.update(load=decision.load)
        if not decision.changed or state.current is None:
            return
        computation = self.context.reweight(state.current, decision.changed)
        step.update(current=computation, synced=state.synced - set(decision.changed))
        reasons = decision.reasons
        reason = "; ".join(reasons[:5]) + (f" (+{len(reasons) - 5} more)" if len(reasons) > 5 else "")
        self.rollout(step, RecordKind.ADAPTIVE_MOVE, event.at, only=sorted(decision.changed),
                      reason=reason, moves=decision.moves, policy="adaptive")  # fmt: skip


def _ms(start: float, end: float) -> float:
    return round((end - start) * 1000.0, 2)


__all__ = [
    "AUDIT_ENTRIES_PER_TICK",
    "AUDIT_ROUNDS",
    "GENERATION_BLOCK",
    "MAX_GENERATION",
    "FabricCore",
    "GenerationExhausted",
    "StateNotSaved",
    "Step",
    "changed_destinations",
    "config_of",
    "dry_run",
    "saved_state",
]
