"""Background load for the observability tests, run inside an emulated host: UDP datagrams to every given
destination in turn at a fixed total rate (an all-to-all when every host runs it towards all others).

    python tests/alltoall_sender.py PORT RATE_PPS DURATION_S SIZE_BYTES DST_IP [DST_IP ...]

Nobody listens: the fabric carries the packets either way (the counters are what is looked at).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time


def main(argv: list[str]) -> int:
    port, rate, duration, size = int(argv[0]), float(argv[1]), float(argv[2]), int(argv[3])
    targets = [(ip, port) for ip in argv[4:]]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(size)
    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) - start < duration:
        due = int((now - start) * rate) + 1
        while sent < due:
            with contextlib.suppress(OSError):
                sock.sendto(payload, targets[sent % len(targets)])
            sent += 1
        time.sleep(0.002)
    print(sent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
