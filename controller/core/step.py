"""One step of the decision core: the builder that accumulates a step's state, commands and records, and the
conversion between operator choices (`Config`) and what is saved on disk (`SavedState`).  Kept apart from
`controller.core.fabric` so the decisions there read as decisions."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from controller.core.events import Command, Log, LogLevel
from controller.core.state import MAX_RECORDS, Config, FabricState, Record, RecordKind
from controller.sm.intents import ForwardingOptions
from controller.sm.policies import PolicyChoice, PolicyError, PolicyParams, default_policies
from controller.sm.qos import policy_data
from controller.statestore import SavedState


class StateNotSaved(RuntimeError):
    """An operator change was refused because its state could not be saved (nothing changed)."""


@dataclass(frozen=True)
class Step:
    state: FabricState
    commands: tuple[Command, ...] = ()
    records: tuple[Record, ...] = ()


class Builder:
    """Accumulates one step: the evolving state, commands and records."""

    def __init__(self, state: FabricState, now: float) -> None:
        self.state, self.now = state, now
        self.commands: list[Command] = []
        self.records: list[Record] = []

    def update(self, **changes: Any) -> None:
        self.state = replace(self.state, **changes)

    def emit(self, command: Command) -> None:
        self.commands.append(command)

    def log(self, level: LogLevel, message: str) -> None:
        self.commands.append(Log(level, message))

    def record(self, kind: RecordKind, **fields: Any) -> Record:
        record = Record(id=self.state.next_record, kind=kind, at=round(self.now, 6), **fields)
        records = (*self.state.records, record)[-MAX_RECORDS:]
        self.update(records=records, next_record=record.id + 1)
        self.records.append(record)
        return record

    def done(self) -> Step:
        return Step(self.state, tuple(self.commands), tuple(self.records))


def saved_state(config: Config, reserved: int) -> SavedState:
    options, params = config.options, config.policy_params
    classes = {str(dscp): name for dscp, name in options.classes} or None
    parts = config.partitions
    saved_parts = parts.as_dict()["partitions"] if parts is not None and parts.configured else None
    return SavedState(
        config.engine, options.fast_failover, options.multipath, reserved, options.policy,
        params.interval_ms, params.threshold, params.hysteresis, classes, saved_parts,
        policy_data(config.qos), config.qos_source,
    )  # fmt: skip


def config_of(saved: SavedState) -> Config:
    """Operator choices from a saved state (raises PolicyError for a policy or parameter out of range)."""
    policy = saved.policy or ("ecmp" if saved.multipath else "static")
    classes = tuple(sorted((int(k), v) for k, v in (saved.classes or {}).items() if k.isdigit()))
    if saved.classes and len(classes) != len(saved.classes):
        raise PolicyError("DSCP keys must be integers", field="classes")
    params = PolicyParams(saved.interval_ms, float(saved.threshold), float(saved.hysteresis))
    PolicyChoice(policy, params, classes).validate(default_policies())
    options = ForwardingOptions(saved.fast_failover, policy=policy, classes=classes)
    return Config(saved.engine, options, params)


__all__ = ["Builder", "StateNotSaved", "Step", "config_of", "saved_state"]
