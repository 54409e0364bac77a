"""Sequence-numbered UDP probe for loss windows (runs inside host namespaces).

    udp_probe.py send DST_IP PORT RATE_PPS DURATION_S
    udp_probe.py recv PORT DURATION_S    # prints JSON {"received", "max_seq", "gaps": [[after, missing]...]}

The receiver is the truth: OVS's userspace datapath can drop without counting it in port statistics.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import time


def send(dst: str, port: int, rate_pps: float, duration_s: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    interval = 1.0 / rate_pps
    start = time.perf_counter()
    seq = 0
    end = start + duration_s
    payload = bytes(64)
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        due = start + seq * interval
        if now < due:
            continue  # busy wait: sleep() is too coarse at 10k+ pps
        with contextlib.suppress(OSError):  # ENOBUFS under load: loss at the receiver, as it should be
            sock.sendto(struct.pack("!Q", seq) + payload, (dst, port))
        seq += 1
    print(json.dumps({"sent": seq}))


def recv(port: int, duration_s: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("0.0.0.0", port))
    sock.settimeout(0.2)
    end = time.monotonic() + duration_s
    last = -1
    received = 0
    gaps: list[list[int]] = []
    print("ready", flush=True)
    while time.monotonic() < end:
        try:
            data = sock.recv(2048)
        except TimeoutError:
            continue
        (seq,) = struct.unpack_from("!Q", data)
        received += 1
        if seq > last + 1:
            gaps.append([last, seq - last - 1])
        last = max(last, seq)
    print(json.dumps({"received": received, "max_seq": last, "gaps": gaps}))


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    else:
        recv(int(sys.argv[2]), float(sys.argv[3]))
