"""The few frames the controller itself sends and reads: LLDP probes and ARP.

Hand-packed with `struct`: both are fixed layouts, this runs per packet-in, and it keeps the data-plane
helpers independent of any packet library.  Parsing returns None for anything that is not ours or not
well-formed; a malformed frame from the network must never raise into the event loop.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

LLDP_MULTICAST = bytes.fromhex("0180c200000e")
ETH_TYPE_LLDP = 0x88CC
ETH_TYPE_ARP = 0x0806
_CHASSIS_PREFIX = b"dpid:"
_ARP_REQUEST = 1
_ARP_REPLY = 2


def _tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def lldp_probe(dpid: int, port: int, src_mac: int) -> bytes:
    """An LLDP frame saying "sent by datapath `dpid` on port `port`"."""
    chassis = _tlv(1, b"\x07" + _CHASSIS_PREFIX + f"{dpid:016x}".encode())  # subtype 7: locally assigned
    port_id = _tlv(2, b"\x02" + struct.pack("!I", port))  # subtype 2: port component
    ttl = _tlv(3, struct.pack("!H", 120))
    header = LLDP_MULTICAST + src_mac.to_bytes(6, "big") + struct.pack("!H", ETH_TYPE_LLDP)
    return header + chassis + port_id + ttl + _tlv(0, b"")


@dataclass(frozen=True, slots=True)
class LldpProbe:
    dpid: int
    port: int


def parse_lldp(frame: bytes) -> LldpProbe | None:
    if len(frame) < 14 or struct.unpack_from("!H", frame, 12)[0] != ETH_TYPE_LLDP:
        return None
    offset, dpid, port = 14, None, None
    while offset + 2 <= len(frame):
        (head,) = struct.unpack_from("!H", frame, offset)
        kind, length = head >> 9, head & 0x1FF
        value = frame[offset + 2 : offset + 2 + length]
        if len(value) != length or kind == 0:
            break
        if kind == 1 and value[:1] == b"\x07" and value[1:].startswith(_CHASSIS_PREFIX):
            try:
                dpid = int(value[1 + len(_CHASSIS_PREFIX) :], 16)
            except ValueError:
                return None
        elif kind == 2 and value[:1] == b"\x02" and length == 5:
            (port,) = struct.unpack("!I", value[1:])
        offset += 2 + length
    if dpid is None or port is None:
        return None
    return LldpProbe(dpid, port)


@dataclass(frozen=True, slots=True)
class Arp:
    op: int
    sender_mac: int
    sender_ip: int
    target_mac: int
    target_ip: int

    @property
    def is_request(self) -> bool:
        return self.op == _ARP_REQUEST


def parse_arp(frame: bytes) -> Arp | None:
    if len(frame) < 42 or struct.unpack_from("!H", frame, 12)[0] != ETH_TYPE_ARP:
        return None
    htype, ptype, hlen, plen, op = struct.unpack_from("!HHBBH", frame, 14)
    if (htype, ptype, hlen, plen) != (1, 0x0800, 6, 4):
        return None
    sha = int.from_bytes(frame[22:28], "big")
    (spa,) = struct.unpack_from("!I", frame, 28)
    tha = int.from_bytes(frame[32:38], "big")
    (tpa,) = struct.unpack_from("!I", frame, 38)
    return Arp(op, sha, spa, tha, tpa)


def arp_reply(request: Arp, answer_mac: int) -> bytes:
    """The reply a host would send if it answered `request` itself (unicast back to the asker)."""
    asker = request.sender_mac.to_bytes(6, "big")
    mac = answer_mac.to_bytes(6, "big")
    header = asker + mac + struct.pack("!H", ETH_TYPE_ARP)
    body = struct.pack("!HHBBH", 1, 0x0800, 6, 4, _ARP_REPLY) + mac + struct.pack("!I", request.target_ip)
    return header + body + asker + struct.pack("!I", request.sender_ip)


__all__ = ["Arp", "LldpProbe", "arp_reply", "lldp_probe", "parse_arp", "parse_lldp"]
