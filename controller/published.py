"""What the controller publishes for readers: the core's latest state with its fixed context, and the
latest port counters.  REST, metrics and the live view read only this (`controller.service` publishes a new
`Published` after every step of the core and every counter poll, and never changes one), so a reader never
waits for the worker and never sees half a change.  Its own module so that readers need not import the
service that writes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.core.state import FabricState
from controller.sm.manager import SubnetContext


@dataclass(frozen=True)
class PortCounters:
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int


@dataclass(frozen=True)
class PortStats:
    """Port counters of every connected switch, polled together at `at` (seconds)."""

    at: float
    #: (switch name, port) -> counters
    counters: Mapping[tuple[str, int], PortCounters] = field(default_factory=dict)


@dataclass(frozen=True)
class Published:
    """What readers see: the core's latest state, the latest port counters, and the fixed context."""

    context: SubnetContext
    state: FabricState
    stats: PortStats | None
    started_at: float
    published_at: float
    #: The poll before `stats` (rates and utilisation are differences of the two).
    previous_stats: PortStats | None = None


__all__ = ["PortCounters", "PortStats", "Published"]
