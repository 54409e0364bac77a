"""The per-packet hot loop: prebuilt RoCEv2 frames, patched and re-checksummed at line rate.

Scapy builds a frame once (tens of microseconds); after that only the PSN (and, for per-packet spraying,
the UDP source port) change per packet.  Both are covered by the ICRC, so the ICRC is recomputed every
time: `zlib.crc32` over the frame's invariant-masked image (IBTA RoCEv2 annex: 8 bytes of ones for the
missing LRH, then IP with TOS/TTL/checksum set to ones, UDP with checksum ones, BTH with FECN/BECN/resv6
ones — fields routers may change), which a template keeps ready so each packet costs two small slice
assignments and one crc32.  Frames go out and come in on AF_PACKET sockets; the receiver tracks PSNs per
destination QP (loss, reordering, duplicates) and can verify every ICRC.
"""

from __future__ import annotations

import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from traffic.entropy import spray_sport

ETH_P_ALL = 0x0003
SO_RCVBUFFORCE = 33  # Linux; not exported by the socket module
_ETH, _IP, _UDP = 14, 20, 8
_BTH = _ETH + _IP + _UDP  # offset of the BTH in an IPv4 frame without options
_ICRC = struct.Struct("<I")


def masked_image(frame: bytes) -> bytearray:
    """The bytes the ICRC covers, with variant fields set to ones (frame without its ICRC)."""
    body = bytearray(b"\xff" * 8 + frame[_ETH:-4])
    ip = 8
    body[ip + 1] = 0xFF  # TOS (DSCP/ECN may be rewritten, ECN marked)
    body[ip + 8] = 0xFF  # TTL
    body[ip + 10 : ip + 12] = b"\xff\xff"  # IP header checksum
    body[ip + _IP + 6 : ip + _IP + 8] = b"\xff\xff"  # UDP checksum
    body[ip + _IP + _UDP + 4] = 0xFF  # BTH FECN, BECN, resv6
    return body


def icrc_of(frame: bytes) -> int:
    return zlib.crc32(masked_image(frame)) & 0xFFFFFFFF


def icrc_ok(frame: bytes) -> bool:
    return len(frame) >= _BTH + 16 and _ICRC.unpack_from(frame, len(frame) - 4)[0] == icrc_of(frame)


class FrameTemplate:
    """One prebuilt frame; `render(psn, sport)` gives a valid frame for that PSN and source port."""

    def __init__(self, frame: bytes) -> None:
        if len(frame) < _BTH + 16 or frame[12:14] != b"\x08\x00" or frame[14] != 0x45:
            raise ValueError("expected Ether / IPv4 (no options) / UDP / BTH ... / ICRC")
        self.frame = bytearray(frame)
        self.masked = masked_image(frame)
        self._psn_frame = _BTH + 9
        self._psn_masked = 8 + _IP + _UDP + 9
        self._sport_frame = _ETH + _IP
        self._sport_masked = 8 + _IP

    @classmethod
    def from_packet(cls, packet: Any) -> FrameTemplate:
        return cls(bytes(packet))

    def render(self, psn: int, sport: int | None = None) -> bytes:
        psn_bytes = (psn & 0xFFFFFF).to_bytes(3, "big")
        frame, masked = self.frame, self.masked
        frame[self._psn_frame : self._psn_frame + 3] = psn_bytes
        masked[self._psn_masked : self._psn_masked + 3] = psn_bytes
        if sport is not None:
            port = sport.to_bytes(2, "big")
            frame[self._sport_frame : self._sport_frame + 2] = port
            masked[self._sport_masked : self._sport_masked + 2] = port
        frame[-4:] = _ICRC.pack(zlib.crc32(masked) & 0xFFFFFFFF)
        return bytes(frame)


def receive_buffer(sock: socket.socket, nbytes: int) -> None:
    """A receive buffer of `nbytes` even above net.core.rmem_max (CAP_NET_ADMIN may force it): a receiver
    descheduled for a few ms must not drop a burst. rmem_max is host-wide and read-only in a container, and
    its default (208 KiB) is far below a burst, so results must not depend on someone having raised it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, nbytes)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)


_SOL_PACKET, _PACKET_STATISTICS = 263, 6


def socket_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped because this packet socket's buffer was full (PACKET_STATISTICS; reading
    resets it).  Once the socket is closed nobody can count them any more, so receivers report them."""
    try:
        _, drops = struct.unpack("II", sock.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, 8))
    except OSError:
        return 0
    return int(drops)


def raw_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((ifname, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    receive_buffer(sock, 32 << 20)
    return sock


def send_stream(
    sock: socket.socket,
    template: FrameTemplate,
    count: int,
    rate_pps: float = 0.0,
    psn_start: int = 0,
    spray_ports: int = 0,
    burst: int = 8,
) -> dict[str, float]:
    """Send `count` frames with consecutive PSNs, paced to `rate_pps` (0: as fast as possible).  With
    `spray_ports` > 0 the UDP source port cycles through that many values of `traffic.entropy.spray_sport`
    (whose low bits change on every packet): per-packet spraying.  Pacing
    sleeps every `burst` packets: bursts longer than a switch's receive batch are what a userspace
    datapath drops first."""
    render, send = template.render, sock.send
    start = time.perf_counter()
    interval = 1.0 / rate_pps if rate_pps > 0 else 0.0
    dropped = 0
    for i in range(count):
        if interval and i % burst == 0:
            ahead = start + i * interval - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        data = render(psn_start + i, spray_sport(i % spray_ports) if spray_ports else None)
        try:
            send(data)
        except BlockingIOError:
            dropped += 1
    elapsed = time.perf_counter() - start
    return {
        "sent": count - dropped,
        "seconds": elapsed,
        "pps": (count - dropped) / elapsed if elapsed else 0.0,
    }


@dataclass
class QpStats:
    received: int = 0
    bytes: int = 0
    expected_psn: int | None = None
    lost: int = 0
    out_of_order: int = 0
    bad_icrc: int = 0
    first: float = 0.0
    last: float = 0.0
    first_psn: int | None = None

    def as_dict(self) -> dict[str, Any]:
        duration = self.last - self.first
        return {
            "received": self.received,
            "first_psn": self.first_psn,
            "bytes": self.bytes,
            "lost": self.lost,
            "out_of_order": self.out_of_order,
            "bad_icrc": self.bad_icrc,
            "goodput_mbps": round(self.bytes * 8 / duration / 1e6, 3) if duration > 0 else None,
            "pps": round(self.received / duration) if duration > 0 else None,
            "first": self.first,
            "last": self.last,
        }


@dataclass
class Receiver:
    """Counts RoCEv2 frames per destination QP from an AF_PACKET socket."""

    sock: socket.socket
    check_icrc: bool = True
    qps: dict[int, QpStats] = field(default_factory=dict)
    other: int = 0

    def handle(self, data: bytes, now: float) -> bool:
        """Account one frame; False if it is not RoCEv2 (other traffic on the interface)."""
        if (
            len(data) < _BTH + 16
            or data[12:14] != b"\x08\x00"
            or data[23] != 17
            or data[36:38] != b"\x12\xb7"
        ):
            self.other += 1
            return False
        dqpn = int.from_bytes(data[_BTH + 5 : _BTH + 8], "big")
        psn = int.from_bytes(data[_BTH + 9 : _BTH + 12], "big")
        qp = self.qps.get(dqpn)
        if qp is None:
            qp = self.qps[dqpn] = QpStats(first=now, first_psn=psn)
        qp.received += 1
        qp.bytes += len(data)
        qp.last = now
        if self.check_icrc and not icrc_ok(data):
            qp.bad_icrc += 1
        if qp.expected_psn is not None and psn != qp.expected_psn:
            gap = (psn - qp.expected_psn) & 0xFFFFFF
            if gap < 0x800000:
                qp.lost += gap
            else:  # behind what we expected: reordered (or duplicated) packet
                qp.out_of_order += 1
                qp.lost = max(0, qp.lost - 1)
                return True
        qp.expected_psn = (psn + 1) & 0xFFFFFF
        return True

    def run(self, duration_s: float, stop_after: int = 0) -> dict[str, Any]:
        self.sock.settimeout(0.1)
        recv, handle = self.sock.recv, self.handle
        end = time.monotonic() + duration_s
        total = 0
        idle_since = time.monotonic()
        while time.monotonic() < end:
            try:
                data = recv(65535)
            except TimeoutError:
                if total and not stop_after and time.monotonic() - idle_since > 1.0:
                    break  # the stream is over (what did not come is lost)
                continue  # told how many to expect: a busy emulator may stall longer, wait for them
            idle_since = time.monotonic()
            if handle(data, time.time()):  # wall clock: comparable across hosts' agents
                total += 1
            if stop_after and total >= stop_after:
                break
        return {
            "qps": {str(k): v.as_dict() for k, v in sorted(self.qps.items())},
            "other_frames": self.other,
            "socket_drops": socket_drops(self.sock),
        }


__all__ = [
    "FrameTemplate",
    "QpStats",
    "Receiver",
    "icrc_of",
    "icrc_ok",
    "masked_image",
    "raw_socket",
    "receive_buffer",
    "send_stream",
    "socket_drops",
]
