"""A probe receiver counts a reordered packet as late, not lost.

A path that changes under a flow — a cable restore moving it back, an adaptive move — reorders the
packets in flight: the first packets on the new, emptier path overtake the last ones queued on the old.
The receiver used to record the gap the first overtaking packet opened and never close it, so the
restore benchmark called a make-before-break that delivered every packet "lossy" (2-18 packets in a
sixth of its runs, while the last switch's port counters showed every packet sent to the host).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from emulation.flows import missing_seqs, net_gaps
from emulation.probe import _HEADER

PROBE = [sys.executable, "-m", "emulation.probe"]


def _gap(after: int, missing: int) -> dict[str, float]:
    return {"after_seq": after, "missing": missing, "from": 1.0, "to": 2.0}


@pytest.mark.parametrize(
    ("gaps", "late", "still_missing"),
    [
        ([_gap(3, 1)], [4], []),  # the one missing packet came late: no gap left
        ([_gap(3, 4)], [5], [4, 6, 7]),  # split around it
        ([_gap(3, 4)], [4, 5, 6, 7], []),
        ([_gap(3, 4)], [7, 4], [5, 6]),  # either end, any order
        ([_gap(3, 2), _gap(10, 3)], [5, 12, 2, 99], [4, 11, 13]),  # late packets outside every gap ignored
        ([_gap(3, 2)], [], [4, 5]),
    ],
)
def test_late_packets_close_their_place_in_a_gap(
    gaps: list[dict[str, float]], late: list[int], still_missing: list[int]
) -> None:
    net = net_gaps(gaps, late)
    assert missing_seqs(net) == still_missing
    assert all(g["missing"] > 0 and (g["from"], g["to"]) == (1.0, 2.0) for g in net)


def test_the_receiver_reports_reordered_packets_as_late_and_only_the_lost_ones_as_gaps() -> None:
    """A real receiver on loopback, fed 0 1 2 4 5 3 6 8 9 (7 never sent): one gap, the 7."""
    port = 47313
    receiver = subprocess.Popen(
        [*PROBE, "recv", str(port), "30", "0.1", "--wait-end"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None and receiver.stdin is not None
        assert receiver.stdout.readline().strip() == "ready"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for seq in (0, 1, 2, 4, 5, 3, 6, 8, 9):
                sock.sendto(_HEADER.pack(seq, time.time()), ("127.0.0.1", port))
                time.sleep(0.002)
        got = json.loads(receiver.communicate(f"{time.time() + 0.3}\n", timeout=30)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    assert got["received"] == 9
    assert (got["out_of_order"], got["reorder_max"]) == (1, 2)
    assert missing_seqs(got["gaps"]) == [7], got["gaps"]


def test_arrival_times_are_the_kernels_not_when_a_busy_receiver_reads_them() -> None:
    """A receiver stopped (as a loaded machine deschedules it) while 50 packets arrive at 1,000 pkt/s, then
    resumed 0.4 s later: each packet's one-way delay and time bucket are when it reached the socket.  With
    the receiver's own clock every delay came out >= 0.35 s and the 50 packets landed in one bucket read
    at once — a receive rate the link never carried."""
    port = 47314
    receiver = subprocess.Popen(
        [*PROBE, "recv", str(port), "30", "0.01", "--wait-end"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None and receiver.stdin is not None
        assert receiver.stdout.readline().strip() == "ready"
        receiver.send_signal(signal.SIGSTOP)
        sent_at = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for seq in range(50):
                sent_at.append(time.time())
                sock.sendto(_HEADER.pack(seq, sent_at[-1]), ("127.0.0.1", port))
                time.sleep(0.001)
        time.sleep(0.4)
        receiver.send_signal(signal.SIGCONT)
        got = json.loads(receiver.communicate(f"{time.time() + 0.3}\n", timeout=30)[0])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    assert got["received"] == 50
    # loopback delivers within microseconds; allow a slow machine 50 ms, far below the 400 ms stop
    assert got["latency_ms"]["max"] < 50.0, got["latency_ms"]
    assert got["first"] - sent_at[0] < 0.05 and got["last"] - sent_at[-1] < 0.05, (got["first"], got["last"])
    # the 50 packets span ~60 ms of 10 ms buckets: spread over several, as they arrived
    assert len(got["buckets"]) >= 4, got["buckets"]
