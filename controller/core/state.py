"""The controller's state as the decision core sees it: one immutable value per moment.

Every input produces a new `FabricState` (unchanged parts are shared, changed containers are copied), so the
worker can publish each one to readers — REST, metrics — without locks, and a test can keep any state it
saw and compare.  What never changes at run time (declared fabric, LIDs, addresses) lives in
`SubnetContext`, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from controller.sm.intents import FlowKey, ForwardingOptions, SwitchDelta, SwitchProgram
from controller.sm.manager import Computation
from controller.sm.partitions import Partitions
from controller.sm.policies import PolicyChoice, PolicyParams
from controller.sm.qos import QosPolicy, default_policy
from controller.sm.validation import Discovery
from topologies.model import PortRef

#: Records kept for `GET /events`; older ones are dropped.
MAX_RECORDS = 1000


class RecordKind(StrEnum):
    ROUTING_COMPUTED = "routing_computed"
    SWITCH_CONNECT = "switch_connect"
    SWITCH_DISCONNECT = "switch_disconnect"
    SWITCH_READ_FAILED = "switch_read_failed"
    UNKNOWN_SWITCH = "unknown_switch"
    PORT_DOWN = "port_down"
    PORT_UP = "port_up"
    ROUTING_CHANGE = "routing_change"
    #: The operator chose another routing policy (or its parameters).
    POLICY_CHANGE = "policy_change"
    #: Adaptive routing moved slots off a hot link (or back towards even weights); `reason`, `moves`.
    ADAPTIVE_MOVE = "adaptive_move"
    STATE_SAVE_FAILED = "state_save_failed"
    #: A switch lost entries it should hold (flow-removed) or differed at an audit: read back and repaired.
    ENTRIES_LOST = "entries_lost"
    RECONCILE = "reconcile"
    #: The operator created, changed or deleted a partition (P_Key); `reason` says what.
    PARTITION_CHANGE = "partition_change"
    #: The operator replaced the QoS policy; `reason` says from where, `changes` which sections changed.
    QOS_POLICY = "qos_policy"


@dataclass(frozen=True)
class Record:
    """One entry of the controller's event log.  Fields that do not apply to a kind stay None (and are left
    out of its JSON)."""

    id: int
    kind: RecordKind
    at: float
    generation: int | None = None
    engine: str | None = None
    switch: str | None = None
    dpid: str | None = None
    #: Ports whose change caused this event, as "switch:port up|down".
    ports: tuple[str, ...] | None = None
    #: Ports of a connecting switch that had no link.
    ports_down: tuple[int, ...] | None = None
    #: When the cause was detected (port status arrival, switch connection, operator request).
    detected_at: float | None = None
    #: Milliseconds from detection until the new tables were computed / installed everywhere (make) /
    #: unused entries deleted (break).
    computed_ms: float | None = None
    installed_ms: float | None = None
    cleaned_ms: float | None = None
    switches_updated: int | None = None
    flow_mods: int | None = None
    failed_switches: Mapping[str, str] | None = None
    verification_ok: bool | None = None
    lost_hosts: tuple[str, ...] | None = None
    #: Destinations (LIDs) whose forwarding entry changed on at least one switch.
    changed_destinations: int | None = None
    reason: str | None = None
    #: Entries a switch reported removed although the controller wanted them there.
    entries_lost: int | None = None
    #: Routing policy in force after the event (policy changes).
    policy: str | None = None
    #: Adaptive moves, one line each: "leaf1: 2 slot(s) 3->4 (relief; 93% -> 20%)".
    moves: tuple[str, ...] | None = None
    #: Sections of the QoS policy that changed (QoS policy changes).
    changes: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out


@dataclass(frozen=True)
class Config:
    """Operator choices: what the controller should do, independent of what the fabric is doing."""

    engine: str = "ftree"
    options: ForwardingOptions = field(default_factory=ForwardingOptions)
    #: Parameters of the routing policy named in `options` (only ``adaptive`` acts on them).
    policy_params: PolicyParams = field(default_factory=PolicyParams)
    #: Partitions to enforce (None: OpenSM's no-file default, everyone full in 0x7fff: nothing enforced).
    partitions: Partitions | None = None
    #: The QoS policy the fabric's paths are classified by (`GET /qos/path`), and where it came from.
    qos: QosPolicy = field(default_factory=default_policy)
    qos_source: str = "default"

    @property
    def policy(self) -> PolicyChoice:
        return PolicyChoice(self.options.policy, self.policy_params, self.options.classes)


@dataclass(frozen=True)
class PendingChange:
    """A computation waiting for its `Save` to be confirmed before it may take effect."""

    computation: Computation
    config: Config
    request: int | None
    detected_at: float
    kind: RecordKind = RecordKind.ROUTING_CHANGE
    #: What the operator changed, for the event's `reason` (partition changes; where a QoS policy came from).
    reason: str | None = None
    #: Sections of the QoS policy that change (QoS policy changes).
    changes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Load:
    """What adaptive routing knows of link load: the last counter sample and the utilisation it gave."""

    #: When the last sample was taken, and each switch port's transmitted bytes then.
    at: float | None = None
    tx_bytes: Mapping[PortRef, int] = field(default_factory=dict)
    #: (switch, slot flow key) -> bytes it matched, at the last sample.
    slot_bytes: Mapping[tuple[str, FlowKey], int] = field(default_factory=dict)
    #: Share of capacity each switch port transmitted over the last interval.
    utilisation: Mapping[PortRef, float] = field(default_factory=dict)
    #: (switch, set of ports) -> when its slots last moved: the next sample that covers the move is skipped.
    moved_at: Mapping[tuple[str, tuple[int, ...]], float] = field(default_factory=dict)
    #: Smoothed utilisation per switch port and load per slot flow (see `controller.core.adaptive`).
    smoothed: Mapping[PortRef, float] = field(default_factory=dict)
    slot_smoothed: Mapping[tuple[str, FlowKey], float] = field(default_factory=dict)
    #: Ports whose history a move made stale: their next clean sample replaces it.
    fresh: frozenset[PortRef] = frozenset()
    #: (switch, set) -> calm samples in a row (none of its ports above the threshold).
    calm: Mapping[tuple[str, tuple[int, ...]], int] = field(default_factory=dict)
    samples: int = 0
    moves: int = 0


@dataclass(frozen=True)
class PendingRollout:
    """A rollout in flight (`Push` make, then break): what to record when it is done."""

    rollout: int
    computation: Computation
    kind: RecordKind
    detected_at: float
    computed_at: float
    deltas: Mapping[str, SwitchDelta]
    flow_mods: int
    details: Mapping[str, Any]
    request: int | None = None
    #: The make phase, once confirmed: when it started and ended, and the switches where it failed.
    pushed_at: float | None = None
    made_at: float | None = None
    make_problems: Mapping[int, str] = field(default_factory=dict)
    #: The make phase's waves (switch names, downstream first: `controller.sm.ordering`), the one in flight.
    waves: tuple[frozenset[str], ...] = ()
    wave: int = 0


@dataclass(frozen=True)
class RolloutOutcome:
    """A whole rollout as the core records it (all make waves and the break phase): the failed switches
    and when each phase was confirmed.  Made by the core from its `PushDone`s, never an event."""

    rollout: int
    problems: Mapping[int, str]
    pushed_at: float
    made_at: float
    done_at: float


@dataclass(frozen=True)
class FabricState:
    config: Config = field(default_factory=Config)
    #: Generation of the current computation (the low 48 bits of every cookie it writes).
    generation: int = 0
    #: Generations up to this one are on disk as used: a restart continues above it, never reusing a cookie.
    reserved: int = 0
    current: Computation | None = None
    #: Ports reported without link, with the time they went down.
    ports_down: Mapping[PortRef, float] = field(default_factory=dict)
    #: Switches connected, as the core has been told (names of declared switches).
    connected: frozenset[str] = frozenset()
    #: What each connected switch holds, as last read back or confirmed; absent = unknown (being read).
    installed: Mapping[str, SwitchProgram] = field(default_factory=dict)
    #: Connected switches known to hold exactly the current generation's program.
    synced: frozenset[str] = frozenset()
    unknown_switches: frozenset[int] = frozenset()
    discovery: Discovery = field(default_factory=Discovery)
    #: Cabling findings reported last (a change is logged, not every round).
    cabling_problems: tuple[str, ...] = ()
    warned_cables: frozenset[tuple[PortRef, PortRef]] = frozenset()
    failed_updates: int = 0
    records: tuple[Record, ...] = ()
    next_record: int = 1
    next_rollout: int = 1
    pending_change: PendingChange | None = None
    pending_rollout: PendingRollout | None = None
    #: Switches being read back to repair them (not a connection): name -> when the damage was detected.
    repairing: Mapping[str, float] = field(default_factory=dict)
    #: Where the round-robin audit continues (index into the declared switches).
    audit_next: int = 0
    load: Load = field(default_factory=Load)

    @property
    def in_sync(self) -> bool:
        """Every connected switch holds exactly the current generation's program."""
        return self.current is not None and self.connected <= self.synced


__all__ = [
    "MAX_RECORDS",
    "Config",
    "FabricState",
    "Load",
    "PendingChange",
    "PendingRollout",
    "Record",
    "RecordKind",
]
