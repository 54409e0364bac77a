"""Partitions (InfiniBand P_Keys) as a pure, frozen model: who may talk to whom.

InfiniBand isolates tenants with partitions: every end port holds a table of P_Keys, each with a membership
bit (bit 15: 1 = full, 0 = limited).  Two ports may exchange packets when they hold a common P_Key and at
least one of them is a *full* member of it; two limited members of the same partition may not (that is how
a storage target serves many clients that must not see each other).  Only the low 15 bits name the
partition.

This module is the resolved model (names, P_Keys, members by host) and its one decision, `permitted`.
Parsing OpenSM's ``partitions.conf`` and the YAML form lives in `controller.sm.partitions_conf`; turning the
model into flows lives in `controller.sm.isolation`.

OpenSM's defaults are kept: without a file, ``Default=0x7fff : ALL=full ;`` (everyone talks to everyone);
a file without a rule for the default P_Key behaves as if it said ``Default=0x7fff : ALL=limited,
SELF=full ;`` — every host is a limited member of the default partition, so hosts only talk through the
partitions the file gives them.  ``SELF`` is the subnet manager's own port; the controller is not an end
port of this Ethernet fabric, so ``SELF`` adds no member here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from topologies.errors import InputError

DEFAULT_PKEY = 0x7FFF
DEFAULT_NAME = "Default"
#: Bit 15 of a P_Key is the membership bit; the partition is named by the low 15 bits.
PKEY_MASK = 0x7FFF
FULL_BIT = 0x8000


class PartitionError(InputError):
    """Bad partition configuration: `str()` gives ``file:line:column: field: message``."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(message, file=file, line=line, field=field)
        self.column = column

    def located(self, file: str | None = None, line: int | None = None) -> PartitionError:
        return PartitionError(self.message, file=self.file or file, field=self.field, column=self.column,
                              line=self.line if self.line is not None else line)  # fmt: skip

    def __str__(self) -> str:
        where = ""
        if self.line is not None:
            where = f"{self.line}" + (f":{self.column}" if self.column is not None else "")
            where = f"{self.file}:{where}: " if self.file else f"line {where}: "
        elif self.file:
            where = f"{self.file}: "
        field_ = f"{self.field}: " if self.field else ""
        return f"{where}{field_}{self.message}"


class Membership(StrEnum):
    LIMITED = "limited"
    FULL = "full"
    #: OpenSM's newer ``both``: the port holds the P_Key twice, full and limited; for who-may-talk, full.
    BOTH = "both"

    @property
    def full(self) -> bool:
        return self is not Membership.LIMITED

    def merged(self, other: Membership) -> Membership:
        """Two rules give one port the same P_Key: the stronger membership wins (both > full > limited)."""
        order = (Membership.LIMITED, Membership.FULL, Membership.BOTH)
        return max(self, other, key=order.index)


def parse_pkey(value: object, field_: str = "pkey") -> int:
    """A P_Key as given (``0x8001``, ``32769``, an int) -> its partition number, the low 15 bits.

    Values above 16 bits, and those whose low 15 bits are zero (no partition), are refused."""
    if isinstance(value, bool):
        raise PartitionError(f"P_Key must be a number, not {value!r}", field=field_)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
        except ValueError:
            raise PartitionError(f"P_Key {value!r} is not a number", field=field_) from None
    else:
        raise PartitionError(f"P_Key must be a number, not {type(value).__name__}", field=field_)
    if not 0 <= number <= 0xFFFF or number & PKEY_MASK == 0:
        raise PartitionError(f"P_Key {value} is outside 0x0001-0x7fff (bit 15 is membership)", field=field_)
    return number & PKEY_MASK


def pkey_str(pkey: int) -> str:
    return f"0x{pkey:04x}"


@dataclass(frozen=True)
class Member:
    """One end port's membership: `host` for a host (CA) port, else `guid` (a switch's port 0)."""

    membership: Membership
    host: str | None = None
    guid: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host}
        if self.host is None:
            out = {"guid": f"0x{self.guid or 0:016x}"}
        out["membership"] = self.membership.value
        return out


@dataclass(frozen=True)
class Partition:
    name: str
    pkey: int
    members: tuple[Member, ...] = ()
    #: OpenSM's flags and UFM's optional fields; carried, shown, not enforced on Ethernet.
    ipoib: bool = False
    mtu_limit: int | None = None
    rate_limit: float | None = None
    service_level: int | None = None
    scope: int | None = None

    @cached_property
    def hosts(self) -> Mapping[str, Membership]:
        return {m.host: m.membership for m in self.members if m.host is not None}

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "pkey": pkey_str(self.pkey)}
        if self.ipoib:
            out["ip_over_ib"] = True
        for key in ("mtu_limit", "rate_limit", "service_level", "scope"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["members"] = [m.as_dict() for m in self.members]
        return out


@dataclass(frozen=True)
class Partitions:
    """The resolved partitions of one fabric, sorted by P_Key.  `configured` is False for OpenSM's no-file
    default (everyone full in 0x7fff): nothing to enforce."""

    partitions: tuple[Partition, ...]
    configured: bool = True
    _by_host: Mapping[str, tuple[tuple[int, Membership], ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        by_host: dict[str, list[tuple[int, Membership]]] = {}
        for p in self.partitions:
            for host, membership in p.hosts.items():
                by_host.setdefault(host, []).append((p.pkey, membership))
        object.__setattr__(self, "_by_host", {h: tuple(v) for h, v in by_host.items()})

    def get(self, pkey: int) -> Partition | None:
        return next((p for p in self.partitions if p.pkey == pkey), None)

    def keys_of(self, host: str) -> tuple[tuple[int, Membership], ...]:
        """(P_Key, membership) of every partition `host` is in."""
        return self._by_host.get(host, ())

    def shared(self, src: str, dst: str) -> tuple[int, ...]:
        """The P_Keys over which `src` and `dst` may talk (shared, at least one full member), lowest first."""
        theirs = dict(self.keys_of(dst))
        found = []
        for pkey, mine in self.keys_of(src):
            other = theirs.get(pkey)
            if other is not None and (mine.full or other.full):
                found.append(pkey)
        return tuple(sorted(found))

    @cached_property
    def peers(self) -> Mapping[str, frozenset[str]]:
        """Every host -> the hosts it may talk to (the `permitted` relation at once: one pass over the
        partitions, full members × members, instead of a lookup per pair)."""
        found: dict[str, set[str]] = {}
        for p in self.partitions:
            members = list(p.hosts)
            full = [h for h, m in p.hosts.items() if m.full]
            for f in full:
                found.setdefault(f, set()).update(members)
            for h in members:
                found.setdefault(h, set()).update(full)
        return {h: frozenset(v) for h, v in found.items()}

    def permitted(self, src: str, dst: str) -> bool:
        """May `src` and `dst` exchange packets?  (Symmetric; a host may always reach itself.)"""
        return src == dst or bool(self.shared(src, dst))

    def pkey_for(self, src: str, dst: str) -> int | None:
        """The P_Key a packet from `src` to `dst` carries (the lowest they may share; full bit set when the
        sender is a full member), None when they may not talk."""
        shared = self.shared(src, dst)
        if not shared:
            return None
        mine = dict(self.keys_of(src))[shared[0]]
        return shared[0] | (FULL_BIT if mine.full else 0)

    def as_dict(self) -> dict[str, Any]:
        return {"partitions": [p.as_dict() for p in self.partitions]}

    def replaced(self, partition: Partition) -> Partitions:
        """With `partition` added or replacing the one with its P_Key."""
        others = [p for p in self.partitions if p.pkey != partition.pkey]
        return Partitions(tuple(sorted([*others, partition], key=lambda p: p.pkey)), True)

    def without(self, pkey: int) -> Partitions:
        return Partitions(tuple(p for p in self.partitions if p.pkey != pkey), True)


def default_partitions(hosts: Iterable[str]) -> Partitions:
    """OpenSM without a partitions file: ``Default=0x7fff : ALL=full ;`` (nothing to enforce)."""
    members = tuple(Member(Membership.FULL, host=h) for h in sorted(hosts))
    return Partitions((Partition(DEFAULT_NAME, DEFAULT_PKEY, members),), configured=False)


__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_PKEY",
    "FULL_BIT",
    "PKEY_MASK",
    "Member",
    "Membership",
    "Partition",
    "PartitionError",
    "Partitions",
    "default_partitions",
    "parse_pkey",
    "pkey_str",
]
