"""Sequence-numbered UDP probe flows, run inside emulated hosts (`python -m emulation.probe ...`).

    probe send DST_IP PORT RATE_PPS DURATION_S [SIZE_BYTES]   # prints {"sent": N, "start": t0}
    probe recv PORT DURATION_S [BUCKET_S]                     # prints the receiver's record (JSON)

The receiver is the truth about loss: OVS's userspace datapath can drop without counting it in port
statistics.  It reports arrivals per time bucket (throughput over time) and every gap in the sequence with
the wall-clock times around it (loss windows, to line up with faults).  The sender wakes every ~0.5 ms and
sends what is due: exact rate on average, a few packets per burst, and no core burnt busy-waiting (on a
2-core machine busy-waiting senders starve ovs-vswitchd's forwarding thread and cause the loss they are
meant to measure).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
from typing import Any

from traffic.fastpath import receive_buffer

_HEADER = struct.Struct("!Qd")  # sequence number, send time


def send(dst: str, port: int, rate_pps: float, duration_s: float, size: int = 64) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    interval = 1.0 / rate_pps
    pad = bytes(max(0, size - _HEADER.size))
    wall0, start = time.time(), time.perf_counter()
    end = start + duration_s
    seq = errors = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        due = int((now - start) / interval) + 1  # packets that should have left by now
        while seq < due:
            try:
                sock.sendto(_HEADER.pack(seq, time.time()) + pad, (dst, port))
            except OSError:  # ENOBUFS under load: loss at the receiver, as it should be
                errors += 1
            seq += 1
        time.sleep(0.0005)
    return {"sent": seq, "start": wall0, "rate_pps": rate_pps, "size": size, "send_errors": errors}


def receive(port: int, duration_s: float, bucket_s: float = 0.1, ready: Any = None) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receive_buffer(sock, 8 << 20)
    sock.bind(("0.0.0.0", port))
    sock.settimeout(0.1)
    if ready is not None:
        ready()
    end = time.monotonic() + duration_s
    last_seq, last_time = -1, 0.0
    received = out_of_order = 0
    bytes_total = 0
    buckets: dict[int, int] = {}
    gaps: list[dict[str, float]] = []
    delays: list[float] = []
    first = None
    while time.monotonic() < end:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        now = time.time()
        if len(data) < _HEADER.size:
            continue
        seq, sent = _HEADER.unpack_from(data)
        delays.append(now - sent)  # one clock for every namespace: a true one-way delay
        received += 1
        bytes_total += len(data)
        first = now if first is None else first
        buckets[int(now / bucket_s)] = buckets.get(int(now / bucket_s), 0) + 1
        if seq < last_seq:
            out_of_order += 1
            continue
        if seq > last_seq + 1 and last_seq >= 0:
            gaps.append({"after_seq": last_seq, "missing": seq - last_seq - 1, "from": last_time, "to": now})
        last_seq, last_time = seq, now
    return {
        "received": received,
        "bytes": bytes_total,
        "max_seq": last_seq,
        "out_of_order": out_of_order,
        "first": first,
        "bucket_s": bucket_s,
        "buckets": sorted(buckets.items()),
        "gaps": gaps,
        "latency_ms": _percentiles(delays),
    }


def _percentiles(delays: list[float]) -> dict[str, float] | None:
    if not delays:
        return None
    ordered = sorted(delays)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(1000 * ordered[-1], 3)}


def main(argv: list[str]) -> int:
    if argv[0] == "send":
        size = int(argv[5]) if len(argv) > 5 else 64
        print(json.dumps(send(argv[1], int(argv[2]), float(argv[3]), float(argv[4]), size)), flush=True)
    elif argv[0] == "recv":
        bucket = float(argv[3]) if len(argv) > 3 else 0.1
        result = receive(int(argv[1]), float(argv[2]), bucket, ready=lambda: print("ready", flush=True))
        print(json.dumps(result), flush=True)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
