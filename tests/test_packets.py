"""LLDP probes and ARP replies the controller sends: golden bytes, round trips, and malformed input that
must be ignored (None), never raised into the event loop."""

from __future__ import annotations

import struct

import pytest

from controller.southbound.packets import Arp, LldpProbe, arp_reply, lldp_probe, parse_arp, parse_lldp

LLDP_GOLDEN = bytes.fromhex(
    "0180c200000e"
    "02fab1000003"
    "88cc"  # dst (nearest bridge), src, ethertype
    "0216"
    "07"
    + b"dpid:02fab10200000100".hex()  # chassis id, locally assigned
    + "0405"
    "02"
    "00000003"  # port id, port component: port 3
    "0602"
    "0078"  # TTL 120 s
    "0000"  # end
)


def test_lldp_probe_golden_bytes_and_round_trip() -> None:
    frame = lldp_probe(0x02FAB10200000100, 3, 0x02FAB1000003)
    assert frame == LLDP_GOLDEN
    assert parse_lldp(frame) == LldpProbe(0x02FAB10200000100, 3)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        LLDP_GOLDEN[:20],
        LLDP_GOLDEN[:12] + b"\x08\x00" + LLDP_GOLDEN[14:],  # not LLDP
        LLDP_GOLDEN.replace(b"dpid:", b"dpix:"),  # someone else's LLDP
        LLDP_GOLDEN.replace(b"dpid:02fab1", b"dpid:zzzzzz"),
        LLDP_GOLDEN[:14] + b"\x02\x05\x07abcd",  # chassis TLV only, truncated
    ],
)
def test_lldp_that_is_not_ours_or_broken_is_ignored(frame: bytes) -> None:
    assert parse_lldp(frame) is None


def _arp_request(sender_mac: int, sender_ip: int, target_ip: int) -> bytes:
    return (
        b"\xff" * 6
        + sender_mac.to_bytes(6, "big")
        + b"\x08\x06"
        + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
        + sender_mac.to_bytes(6, "big")
        + struct.pack("!I", sender_ip)
        + bytes(6)
        + struct.pack("!I", target_ip)
    )


def test_arp_reply_golden_bytes() -> None:
    request = parse_arp(_arp_request(0x02FAB1000001, 0x0A000001, 0x0A000009))
    assert request == Arp(1, 0x02FAB1000001, 0x0A000001, 0, 0x0A000009) and request.is_request
    reply = arp_reply(request, 0x02FAB1000009)
    assert reply == bytes.fromhex(
        "02fab1000001" "02fab1000009" "0806"
        "0001" "0800" "06" "04" "0002"
        "02fab1000009" "0a000009"
        "02fab1000001" "0a000001"
    )  # fmt: skip
    parsed = parse_arp(reply)
    assert parsed is not None and not parsed.is_request and parsed.sender_ip == 0x0A000009


@pytest.mark.parametrize(
    "frame",
    [b"", _arp_request(1, 2, 3)[:41], _arp_request(1, 2, 3)[:14] + b"\x00\x06" + _arp_request(1, 2, 3)[16:]],
)
def test_broken_arp_is_ignored(frame: bytes) -> None:
    assert parse_arp(frame) is None
