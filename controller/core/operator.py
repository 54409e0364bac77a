"""Operator requests: what the decision core makes of a routing, policy, partition or QoS change.

Every one goes the same way, so there is one store, one save path and one event log for all of them:
validated whole (a refusal is a `Reply` with the error and changes nothing), computed as the next
generation, persisted with the rest of the operator's choices (`Save`; `controller.core.fabric` commits it
when `Saved` says the disk has it), rolled out make-before-break and recorded with one id sequence.

Partition edits arrive as edits, not as finished partitions: the rules of `controller.sm.pkey_edits` are
applied here to the partitions running when the worker reaches the edit, so two clients editing at once are
serialised by the worker and neither overwrites the other.  A QoS policy changes no switch table (it
classifies paths: `GET /qos/path`), but it is still a generation: one counter says what the controller
runs, and its rollout is empty.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from controller.core.events import (
    PartitionEditRequested,
    PartitionsRequested,
    PolicyRequested,
    QosPolicyRequested,
    Reply,
    RoutingRequested,
    Save,
)
from controller.core.state import Config, PendingChange, RecordKind
from controller.core.step import Builder, saved_state
from controller.sm import pkey_edits
from controller.sm.engines.base import UnknownEngine
from controller.sm.intents import MAX_GENERATION, GenerationExhausted
from controller.sm.manager import Computation, SubnetContext
from controller.sm.policies import PolicyParams, PolicyRegistry
from controller.sm.qos import diff, resolve
from topologies.errors import InputError

#: Generations reserved on disk at a time (see `controller.core.fabric`).
GENERATION_BLOCK = 1000


class Core(Protocol):
    """What these handlers need of `controller.core.fabric.FabricCore` (a protocol: no import cycle)."""

    context: SubnetContext
    policies: PolicyRegistry

    def compute(self, step: Builder, config: Config) -> Computation: ...


def propose(step: Builder, change: PendingChange) -> None:
    """Persist before commit: the change waits while its state (and a new generation block) is saved;
    the core's `Saved` handler commits it, or refuses it if the save failed."""
    reserved = max(step.state.reserved, min(change.computation.generation + GENERATION_BLOCK, MAX_GENERATION))
    step.update(pending_change=change)
    step.emit(Save(saved_state(change.config, reserved)))


def _change(core: Core, step: Builder, request: int, config: Config, kind: RecordKind,
            reason: str | None = None, changes: tuple[str, ...] | None = None) -> None:  # fmt: skip
    try:
        computation = core.compute(step, config)
    except (UnknownEngine, InputError, GenerationExhausted) as exc:
        step.emit(Reply(request, error=exc))
        return
    propose(step, PendingChange(computation, config, request, step.now, kind, reason, changes))


def routing_requested(core: Core, step: Builder, event: RoutingRequested) -> None:
    """Another engine or other forwarding options (the policy's parameters start from their defaults)."""
    config = step.state.config
    config = replace(config, engine=event.engine or config.engine, options=event.options or config.options,
                     policy_params=PolicyParams())  # fmt: skip
    _change(core, step, event.request, config, RecordKind.ROUTING_CHANGE)


def policy_requested(core: Core, step: Builder, event: PolicyRequested) -> None:
    """A policy change: validated whole (name, parameters, classes, and that the fabric has equal-cost
    alternatives for a multipath policy), persisted, then rolled out like a routing change."""
    state = step.state
    try:
        choice = event.choice.validate(core.policies)
        options = replace(state.config.options, policy=choice.name, multipath=False, classes=choice.classes)
        config = replace(state.config, options=options, policy_params=choice.params)
        computation = core.compute(step, config)
        problem = computation.policy_problem()
        if problem is not None:
            raise problem
    except (InputError, GenerationExhausted) as exc:
        step.emit(Reply(event.request, error=exc))
        return
    step.update(load=replace(state.load, moved_at={}))
    propose(step, PendingChange(computation, config, event.request, step.now, RecordKind.POLICY_CHANGE))


def partitions_requested(core: Core, step: Builder, event: PartitionsRequested) -> None:
    """New partitions (validated whole by the caller): computed (the partition layer of every edge switch),
    persisted, then rolled out make-before-break — flows of pairs whose permission did not change are not
    touched."""
    config = replace(step.state.config, partitions=event.partitions)
    _change(core, step, event.request, config, RecordKind.PARTITION_CHANGE, event.change)


def partition_edit_requested(core: Core, step: Builder, event: PartitionEditRequested) -> None:
    """One P_Key edit, decided against the partitions running now (`controller.sm.pkey_edits`)."""
    declared = core.context.declared
    try:
        edit = pkey_edits.apply(
            pkey_edits.running(step.state.config.partitions, declared), declared, event.edit
        )
    except pkey_edits.EditError as exc:
        step.emit(Reply(event.request, error=exc))
        return
    partitions_requested(core, step, PartitionsRequested(event.request, edit.partitions, edit.change))


def qos_requested(core: Core, step: Builder, event: QosPolicyRequested) -> None:
    """A new QoS policy (validated whole by the caller against the fabric): the next generation, saved
    with the rest, recorded with the policy sections it changes."""
    declared = core.context.declared
    old = step.state.config
    changes = tuple(sorted(diff(resolve(old.qos, declared), resolve(event.policy, declared))))
    config = replace(old, qos=event.policy, qos_source=event.source)
    _change(core, step, event.request, config, RecordKind.QOS_POLICY, event.source, changes)


__all__ = [
    "GENERATION_BLOCK",
    "Core",
    "partition_edit_requested",
    "partitions_requested",
    "policy_requested",
    "propose",
    "qos_requested",
    "routing_requested",
]
