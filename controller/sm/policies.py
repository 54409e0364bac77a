"""Routing policies: how traffic uses the equal-cost alternatives the engine found (the SM's fourth job).

An engine computes one forwarding table per switch plus, per destination, the set of equally good ports
(`RoutingTables.alt`).  A *policy* decides how packets use that set.  The same names and parameters are
realised three times — as OpenFlow groups by the controller, as paths by the flow-level simulator, and in
reports — so their meaning is defined once, here:

* ``static``   — the engine's table only: one path per destination (InfiniBand without adaptive routing).
* ``ecmp``     — per-flow hashing over the alternatives on the 5-tuple: every packet of a flow takes the same
                 path, and two flows that hash alike collide, as on real Ethernet fabrics.
* ``spray``    — per-packet: successive packets of one flow take different equal-cost ports (the sender varies
                 the UDP source port as entropy, as RoCE NICs with multipath do).
* ``adaptive`` — congestion-aware: the controller measures link load every ``interval_ms`` and moves traffic
                 off links whose utilisation is above ``threshold`` (with ``hysteresis`` so it does not
                 oscillate); between moves it behaves like ``spray`` over the ports it currently allows.

Fast failover stays on under every policy.  Policies are plain data plus a little behaviour; the registry
is filled explicitly (`default_policies`), never by import side effects.

How the controller realises them on OpenFlow 1.3 (measured choices, see docs/policies.md): every multipath
policy uses the same *slot table* per switch and set of equal-cost ports — the packet's UDP source port,
a 4-bit window of it per switch level (`slot_shift`), picks one of `SLOTS` slots by a masked match, and
each slot names one port (`Assignment`).  Even weights are an even assignment; ``adaptive`` changes the
assignment (exact weight changes, one flow-mod per moved slot).  ``ecmp`` and ``spray`` install the same
tables: on Ethernet, spraying is the sender's choice of entropy, so what differs is ``per_packet``, which
the traffic engine follows.  A fabric may choose per traffic class (DSCP) between ``static`` and the
fabric's multipath policy (`PolicyChoice.classes`), e.g. keeping reorder-sensitive traffic on one path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from topologies.errors import InputError, clip

#: The smallest adaptive interval: below it the controller's own polling would load a 2-core machine.
MIN_INTERVAL_MS = 10
MAX_INTERVAL_MS = 60_000
#: Slot tables: this many bits of the UDP source port select one of SLOTS slots at a switch.  16 slots
#: split 2 or 4 ports exactly and 3 ports as 6/5/5; weights change in steps of 1/16.
SLOT_BITS = 4
SLOTS = 1 << SLOT_BITS
#: Switch levels (hops from the nearest switch with hosts) use disjoint windows of the source port — bits
#: 0-3 at leaves, 4-7 one level up, 8-11 above — so choices at successive hops are independent (no hash
#: polarisation) within RoCEv2's 14 bits of source-port entropy.
SLOT_WINDOWS = 3
#: DSCP values a per-class choice may name.
MAX_DSCP = 63

#: slot -> port, for one switch and one set of equal-cost ports (len == SLOTS).
Assignment = tuple[int, ...]


class PolicyError(InputError):
    """A policy name or parameter that cannot be used (names the field)."""


@dataclass(frozen=True)
class PolicyParams:
    """Parameters of a policy; only ``adaptive`` reads them, every policy validates them."""

    interval_ms: int = 100
    threshold: float = 0.7
    hysteresis: float = 0.1

    def validate(self) -> PolicyParams:
        if isinstance(self.interval_ms, bool) or not isinstance(self.interval_ms, int):
            raise PolicyError(f"must be an integer, got {self.interval_ms!r}", field="interval_ms")
        if not MIN_INTERVAL_MS <= self.interval_ms <= MAX_INTERVAL_MS:
            raise PolicyError(
                f"must be within {MIN_INTERVAL_MS}..{MAX_INTERVAL_MS} ms, got {self.interval_ms}",
                field="interval_ms",
            )
        for name in ("threshold", "hysteresis"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise PolicyError(f"must be a finite number, got {value!r}", field=name)
        if not 0.0 < self.threshold <= 1.0:
            raise PolicyError(f"must be in (0, 1], got {self.threshold}", field="threshold")
        if not 0.0 <= self.hysteresis < self.threshold:
            raise PolicyError(
                f"must be in [0, threshold={self.threshold}), got {self.hysteresis}", field="hysteresis"
            )
        return self


class RoutingPolicy:
    """One policy: its name, what it promises, and how its packets use equal-cost alternatives."""

    name: ClassVar[str]
    summary: ClassVar[str]
    #: Uses the equal-cost alternatives at all (False: the LFT port only).
    multipath: ClassVar[bool]
    #: Packets of one flow may take different paths (receivers see reordering).
    per_packet: ClassVar[bool]
    #: Reacts to measured load at run time (needs counters polled every interval).
    adaptive: ClassVar[bool]

    def __init__(self, params: PolicyParams | None = None) -> None:
        self.params = (params or PolicyParams()).validate()

    def describe(self) -> dict[str, object]:
        return {
            "policy": self.name,
            "summary": self.summary,
            "multipath": self.multipath,
            "per_packet": self.per_packet,
            "adaptive": self.adaptive,
            "interval_ms": self.params.interval_ms,
            "threshold": self.params.threshold,
            "hysteresis": self.params.hysteresis,
        }


class StaticPolicy(RoutingPolicy):
    name = "static"
    summary = "the engine's table: one path per destination"
    multipath = False
    per_packet = False
    adaptive = False


class EcmpPolicy(RoutingPolicy):
    name = "ecmp"
    summary = "per-flow hash of the 5-tuple over the equal-cost ports (flows can collide)"
    multipath = True
    per_packet = False
    adaptive = False


class SprayPolicy(RoutingPolicy):
    name = "spray"
    summary = "per-packet spraying over the equal-cost ports (even load, reordering)"
    multipath = True
    per_packet = True
    adaptive = False


class AdaptivePolicy(RoutingPolicy):
    name = "adaptive"
    summary = "congestion-aware: moves traffic off links above the threshold, measured every interval"
    multipath = True
    per_packet = True
    adaptive = True


class PolicyRegistry:
    """name -> policy class, filled explicitly."""

    def __init__(self) -> None:
        self._policies: dict[str, type[RoutingPolicy]] = {}

    def register(self, policy: type[RoutingPolicy]) -> type[RoutingPolicy]:
        if policy.name in self._policies and self._policies[policy.name] is not policy:
            raise ValueError(f"routing policy {policy.name!r} is already registered")
        self._policies[policy.name] = policy
        return policy

    def create(self, name: str, params: PolicyParams | None = None) -> RoutingPolicy:
        cls = self._policies.get(name)
        if cls is None:
            raise PolicyError(
                f"unknown routing policy {clip(repr(name))} (available: {', '.join(self.names())})",
                field="policy",
            )
        return cls(params)

    def parse_list(self, text: str, field: str = "policies") -> list[str]:
        """`static,ecmp` -> names, each checked; duplicates and empty items rejected."""
        names = [part.strip() for part in text.split(",")]
        seen: set[str] = set()
        for name in names:
            if not name:
                raise PolicyError(f"empty policy name in {clip(repr(text))}", field=field)
            if name not in self._policies:
                raise PolicyError(
                    f"unknown routing policy {clip(repr(name))} (available: {', '.join(self.names())})",
                    field=field,
                )
            if name in seen:
                raise PolicyError(f"policy {name!r} listed twice", field=field)
            seen.add(name)
        return names

    def names(self) -> list[str]:
        return list(self._policies)

    def classes(self) -> Mapping[str, type[RoutingPolicy]]:
        return dict(self._policies)

    def __iter__(self) -> Iterator[type[RoutingPolicy]]:
        return iter(self._policies.values())

    def __contains__(self, name: object) -> bool:
        return name in self._policies


def default_policies() -> PolicyRegistry:
    """The policies fabriclab ships, in the order they are listed to users."""
    registry = PolicyRegistry()
    for policy in (StaticPolicy, EcmpPolicy, SprayPolicy, AdaptivePolicy):
        registry.register(policy)
    return registry


def slot_shift(level: int) -> int:
    """The lowest source-port bit of the slot window used at a switch `level` hops above the hosts."""
    return SLOT_BITS * (max(0, level) % SLOT_WINDOWS)


def even_assignment(ports: tuple[int, ...]) -> Assignment:
    """Slots dealt round-robin over `ports` (sorted): equal weights, to within one slot."""
    if not ports:
        raise ValueError("a slot table needs at least one port")
    return tuple(ports[i % len(ports)] for i in range(SLOTS))


def weights_of(assignment: Assignment) -> dict[int, int]:
    """port -> slots it holds (ports with none are absent)."""
    counts: dict[int, int] = {}
    for port in assignment:
        counts[port] = counts.get(port, 0) + 1
    return counts


@dataclass(frozen=True)
class PolicyChoice:
    """What an operator chose: the fabric's policy, its parameters, and per traffic class (DSCP) exceptions.

    A class may only differ from the fabric between ``static`` and the fabric's multipath policy (or, on a
    static fabric, one multipath policy for all its exceptions): multipath classes share the slot tables,
    so one fabric cannot weigh them adaptively for one class and evenly for another."""

    name: str = "static"
    params: PolicyParams = PolicyParams()
    #: (dscp, policy name), sorted by DSCP.
    classes: tuple[tuple[int, str], ...] = ()

    def validate(self, registry: PolicyRegistry) -> PolicyChoice:
        if not isinstance(self.name, str):
            raise PolicyError(f"must be a policy name, got {self.name!r}", field="policy")
        registry.create(self.name, self.params)  # unknown name or bad parameters
        seen: set[int] = set()
        multipath: set[str] = set()
        for dscp, name in self.classes:
            if isinstance(dscp, bool) or not isinstance(dscp, int) or not 0 <= dscp <= MAX_DSCP:
                raise PolicyError(f"DSCP must be an integer in 0..{MAX_DSCP}, got {dscp!r}", field="classes")
            if dscp in seen:
                raise PolicyError(f"DSCP {dscp} listed twice", field="classes")
            seen.add(dscp)
            if name not in registry:
                known = ", ".join(registry.names())
                raise PolicyError(
                    f"DSCP {dscp}: unknown routing policy {name!r} (available: {known})", field="classes"
                )
            if name != "static":
                multipath.add(name)
        if self.name != "static":
            multipath.add(self.name)
        if len(multipath) > 1:
            raise PolicyError(
                f"multipath policies {sorted(multipath)} would share slot tables: a class may differ "
                "from the fabric only by being static",
                field="classes",
            )
        return self

    @property
    def multipath_policy(self) -> str | None:
        """The one multipath policy in use (fabric or classes), or None when everything is static."""
        if self.name != "static":
            return self.name
        return next((name for _, name in self.classes if name != "static"), None)


def class_map(
    classes: Mapping[str, str] | Mapping[int, str] | Mapping[int | str, str] | None,
) -> tuple[tuple[int, str], ...]:
    """{"26": "static"} (JSON) or {26: "static"} -> sorted (dscp, policy) pairs; keys checked."""
    if not classes:
        return ()
    pairs: list[tuple[int, str]] = []
    for key, name in classes.items():
        try:
            dscp = int(key)
        except (TypeError, ValueError):
            raise PolicyError(
                f"DSCP must be an integer in 0..{MAX_DSCP}, got {key!r}", field="classes"
            ) from None
        if not isinstance(name, str):
            raise PolicyError(f"DSCP {dscp}: policy must be a name, got {name!r}", field="classes")
        pairs.append((dscp, name))
    return tuple(sorted(pairs))


__all__ = [
    "MAX_DSCP",
    "MAX_INTERVAL_MS",
    "MIN_INTERVAL_MS",
    "SLOTS",
    "SLOT_BITS",
    "SLOT_WINDOWS",
    "AdaptivePolicy",
    "Assignment",
    "EcmpPolicy",
    "PolicyChoice",
    "PolicyError",
    "PolicyParams",
    "PolicyRegistry",
    "RoutingPolicy",
    "SprayPolicy",
    "StaticPolicy",
    "class_map",
    "default_policies",
    "even_assignment",
    "slot_shift",
    "weights_of",
]
