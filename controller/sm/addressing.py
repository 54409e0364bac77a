"""Ethernet/IP identities derived from LIDs, and switch datapath ids derived from GUIDs.

On InfiniBand a packet is forwarded on its destination LID.  On our Ethernet fabric the destination MAC plays
that role, so every host port's MAC (and IPv4 address) is a pure function of its LID:

* MAC  ``02:fa:b1:00:HH:LL`` where HHLL is the 16-bit LID (locally administered, unicast);
* IPv4 ``10.0.0.0 + LID`` in ``10.0.0.0/16`` (unicast LIDs stop at 0xBFFF, so it always fits).

Because LIDs are stable across re-sweeps (see `lids`), addresses survive failures and controller restarts,
and the emulation can configure hosts before the controller runs.  A switch's OpenFlow datapath id is its
node GUID: unique by construction, 64 bits like a dpid, and preserved for fabrics imported from
ibnetdiscover.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

from controller.sm.lids import LidMap

MAC_PREFIX = 0x02FAB1000000
IPV4_BASE = 0x0A000000
IPV4_PREFIX_LEN = 16


def mac_of_lid(lid: int) -> int:
    return MAC_PREFIX | (lid & 0xFFFF)


def ipv4_of_lid(lid: int) -> int:
    return IPV4_BASE + lid


def mac_str(mac: int) -> str:
    return ":".join(f"{(mac >> shift) & 0xFF:02x}" for shift in range(40, -8, -8))


def parse_mac(text: str) -> int:
    parts = text.split(":")
    if len(parts) != 6:
        raise ValueError(f"not a MAC address: {text!r}")
    return int("".join(f"{int(p, 16):02x}" for p in parts), 16)


def ipv4_str(ip: int) -> str:
    return ".".join(str((ip >> shift) & 0xFF) for shift in (24, 16, 8, 0))


@dataclass(frozen=True, slots=True)
class HostAddress:
    host: str
    port: int
    lid: int
    mac: int
    ipv4: int

    @property
    def mac_str(self) -> str:
        return mac_str(self.mac)

    @property
    def ipv4_str(self) -> str:
        return ipv4_str(self.ipv4)


@dataclass(frozen=True)
class AddressTable:
    """Every connected host port of the declared fabric, by (host, port), IP and MAC."""

    entries: tuple[HostAddress, ...]

    @classmethod
    def build(cls, lids: LidMap) -> AddressTable:
        entries = [
            HostAddress(e.node, e.port, lid, mac_of_lid(lid), ipv4_of_lid(lid))
            for lid, e in sorted(lids.endpoints.items())
            if not e.is_switch
        ]
        return cls(tuple(entries))

    @cached_property
    def by_ipv4(self) -> Mapping[int, HostAddress]:
        return {a.ipv4: a for a in self.entries}

    @cached_property
    def by_mac(self) -> Mapping[int, HostAddress]:
        return {a.mac: a for a in self.entries}

    @cached_property
    def by_port(self) -> Mapping[tuple[str, int], HostAddress]:
        return {(a.host, a.port): a for a in self.entries}

    def of_host(self, host: str) -> HostAddress:
        """The host's first connected port's address (what a single-homed host uses)."""
        ports = [a for a in self.entries if a.host == host]
        if not ports:
            raise KeyError(host)
        return min(ports, key=lambda a: a.port)

    def as_strings(self) -> dict[tuple[str, int], tuple[str, str]]:
        """(host, port) -> (MAC, IPv4) as text: what emulators configure on host interfaces."""
        return {(a.host, a.port): (a.mac_str, a.ipv4_str) for a in self.entries}

    def __iter__(self) -> Iterator[HostAddress]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


__all__ = [
    "IPV4_PREFIX_LEN",
    "AddressTable",
    "HostAddress",
    "ipv4_of_lid",
    "ipv4_str",
    "mac_of_lid",
    "mac_str",
    "parse_mac",
]
