"""What the decision core reacts to (inputs) and what it asks for (commands), as typed values.

Inputs come from the southbound (switches connecting, ports changing, LLDP and ARP sightings), from the
operator (REST), from timers, and from the executor reporting how a command went (a switch read back, a
rollout confirmed, the state saved).  Commands are what the executor must do; the results of the ones that
have any come back as inputs.  Nothing here is a string to be parsed: kinds are types and enums.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from controller.sm.intents import FlowIntent, FlowKey, ForwardingOptions, GroupIntent, SwitchDelta
from controller.sm.partitions import Partitions
from controller.sm.pkey_edits import PartitionEdit
from controller.sm.policies import PolicyChoice
from controller.sm.qos import QosPolicy
from controller.statestore import SavedState

# --- inputs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The controller starts: compute the first generation."""


@dataclass(frozen=True)
class SwitchConnected:
    dpid: int


@dataclass(frozen=True)
class SwitchRead:
    """A connected switch's contents and port liveness, as read back (the answer to `ReadSwitch`)."""

    dpid: int
    ports: Mapping[int, bool]
    flows: tuple[FlowIntent, ...]
    groups: tuple[GroupIntent, ...]


@dataclass(frozen=True)
class SwitchesConnected:
    """Several connections at once (the service batches them: a fabric coming up), each handled as alone."""

    dpids: tuple[int, ...]


@dataclass(frozen=True)
class SwitchesRead:
    """Several switches read back at once (see `controller.core.reads`)."""

    reads: tuple[SwitchRead, ...]


@dataclass(frozen=True)
class SwitchReadFailed:
    dpid: int
    reason: str


@dataclass(frozen=True)
class SwitchDisconnected:
    dpid: int


@dataclass(frozen=True)
class PortChange:
    dpid: int
    port: int
    live: bool
    #: When the switch's port-status message arrived (the start of every reroute timing).
    at: float


@dataclass(frozen=True)
class PortsChanged:
    """One or more port-status messages, handled together (both ends of a cut cable, a dead switch)."""

    changes: tuple[PortChange, ...]


@dataclass(frozen=True)
class FlowRemoval:
    """A switch reports that one of its entries is gone (OFPT_FLOW_REMOVED): `flow` has its table, priority,
    match and cookie; `reason` is delete, group_delete or a timeout."""

    dpid: int
    flow: FlowIntent
    reason: str
    at: float


@dataclass(frozen=True)
class FlowsRemoved:
    """Flow-removed messages that arrived together (a wiped table is one burst), handled at once."""

    removals: tuple[FlowRemoval, ...]


@dataclass(frozen=True)
class LinkSighting:
    src_dpid: int
    src_port: int
    dst_dpid: int
    dst_port: int
    at: float


@dataclass(frozen=True)
class LinksSeen:
    sightings: tuple[LinkSighting, ...]


@dataclass(frozen=True)
class HostSeen:
    """A host's ARP request arrived on a switch port (validates host cabling)."""

    host: str
    host_port: int
    dpid: int
    in_port: int
    at: float


@dataclass(frozen=True)
class Tick:
    """Periodic round: expire old sightings, probe links, report cabling changes, and audit a share of the
    switches (read back and repaired if they differ from what the controller believes)."""


@dataclass(frozen=True)
class RoutingRequested:
    """The operator changes engine and/or options.  `request` pairs the reply with the caller."""

    request: int
    engine: str | None = None
    options: ForwardingOptions | None = None


@dataclass(frozen=True)
class PolicyRequested:
    """The operator chooses a routing policy (name, parameters, per-class exceptions) for the fabric."""

    request: int
    choice: PolicyChoice


@dataclass(frozen=True)
class PartitionsRequested:
    """The operator replaces the partitions (validated whole by the caller against the fabric); `change`
    says what changed, for the event log."""

    request: int
    partitions: Partitions
    change: str


@dataclass(frozen=True)
class PartitionEditRequested:
    """The operator edits one partition (create, members added, replaced or removed, delete): the core
    applies the rules of `controller.sm.pkey_edits` to the partitions running when the edit is handled, so
    edits from several clients are serialised by the worker, never lost to each other."""

    request: int
    edit: PartitionEdit


@dataclass(frozen=True)
class QosPolicyRequested:
    """The operator replaces the QoS policy (validated whole against the fabric by the caller); `source`
    says where it came from ("rest", "file PATH")."""

    request: int
    policy: QosPolicy
    source: str


@dataclass(frozen=True)
class CountersSampled:
    """Counters of the connected switches, read together at `at`: (dpid, port) -> bytes sent, and the byte
    counters of slot-table flows, (dpid, flow key) -> bytes matched (per-slot load).  The service feeds one
    every adaptive interval (and never queues a second before the first is handled)."""

    at: float
    tx_bytes: Mapping[tuple[int, int], int]
    slot_bytes: Mapping[tuple[int, FlowKey], int] = field(default_factory=dict)


@dataclass(frozen=True)
class PushDone:
    """How one phase of a `Push` went: switches that failed (dpid -> why: refused, gone, no barrier reply
    within the push's time), and when the phase started and was confirmed."""

    rollout: int
    phase: Phase
    problems: Mapping[int, str]
    started_at: float
    done_at: float


@dataclass(frozen=True)
class Saved:
    """How a `Save` went: `error` is None on success."""

    error: str | None = None


Event = (
    Start
    | SwitchConnected
    | SwitchesConnected
    | SwitchRead
    | SwitchesRead
    | SwitchReadFailed
    | SwitchDisconnected
    | PortsChanged
    | FlowsRemoved
    | LinksSeen
    | HostSeen
    | Tick
    | RoutingRequested
    | PolicyRequested
    | PartitionsRequested
    | PartitionEditRequested
    | QosPolicyRequested
    | CountersSampled
    | PushDone
    | Saved
)

#: Requests an operator waits for (each answered by one `Reply` with its `request`).
OperatorRequest = (
    RoutingRequested | PolicyRequested | PartitionsRequested | PartitionEditRequested | QosPolicyRequested
)

# --- commands ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadSwitch:
    dpid: int


class Phase(StrEnum):
    #: Every delta's additions and modifications, barrier-confirmed: the new paths are in place.
    MAKE = "make"
    #: Then the deletions of what the new paths replaced, on the switches whose make succeeded.
    BREAK = "break"


#: A push's barrier deadline grows with its size: `PUSH_BASE_S`, plus a second per `PUSH_MESSAGES_PER_S`
#: messages (a whole k=16 fabric's first push is ~350,000 flow-mods over 2 cores' worth of ovs-vswitchd).
#: A switch that does not confirm in time failed: it is read back and repaired.
PUSH_MESSAGES_PER_S = 2000
PUSH_BASE_S = 10.0


@dataclass(frozen=True)
class Push:
    """One phase of a make-before-break rollout on the switches of `deltas`, each confirmed by a barrier
    within `timeout_s`.  Answered by `PushDone`; the core sends the break phase only after the make phase
    is confirmed, and only to the switches whose make succeeded."""

    rollout: int
    deltas: Mapping[int, SwitchDelta]
    phase: Phase = Phase.MAKE
    timeout_s: float = PUSH_BASE_S

    @staticmethod
    def timeout_for(deltas: Mapping[int, SwitchDelta]) -> float:
        return PUSH_BASE_S + sum(d.n_messages for d in deltas.values()) / PUSH_MESSAGES_PER_S


@dataclass(frozen=True)
class ProbeLinks:
    dpids: tuple[int, ...]


@dataclass(frozen=True)
class Save:
    """Persist operator choices before they take effect.  Answered by `Saved`."""

    state: SavedState


class LogLevel(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Log:
    level: LogLevel
    message: str


@dataclass(frozen=True)
class Reply:
    """The outcome of an operator request: `result` on success, else `error` (an InputError: 4xx)."""

    request: int
    result: object = None
    error: Exception | None = field(default=None, compare=False)


Command = ReadSwitch | Push | ProbeLinks | Save | Log | Reply

__all__ = [
    "PUSH_BASE_S",
    "PUSH_MESSAGES_PER_S",
    "Command",
    "CountersSampled",
    "Event",
    "FlowRemoval",
    "FlowsRemoved",
    "HostSeen",
    "LinkSighting",
    "LinksSeen",
    "Log",
    "LogLevel",
    "OperatorRequest",
    "PartitionEditRequested",
    "PartitionsRequested",
    "Phase",
    "PolicyRequested",
    "PortChange",
    "PortsChanged",
    "ProbeLinks",
    "Push",
    "PushDone",
    "QosPolicyRequested",
    "ReadSwitch",
    "Reply",
    "RoutingRequested",
    "Save",
    "Saved",
    "Start",
    "SwitchConnected",
    "SwitchDisconnected",
    "SwitchRead",
    "SwitchReadFailed",
    "SwitchesConnected",
    "SwitchesRead",
    "Tick",
]
