"""Batched datagrams (`emulation.mmsg`) and the probe receiver that reads them a batch at a time.

The receiver used to read one datagram per system call and wake for each: at the emulator's capacity the
32 probes of a k=4 calibration cost more CPU than the switch.  Batching must not change what it reports:
the same sequence accounting when a reordered packet, a gap and a runt land in one batch or across the
boundary between two.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from emulation import mmsg
from emulation.flows import missing_seqs
from emulation.probe import _HEADER, RECV_BATCH

PROBE = [sys.executable, "-m", "emulation.probe"]


def _pair() -> tuple[socket.socket, socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, mmsg.SCM_TIMESTAMPNS, 1)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    return tx, rx


def test_a_batch_sent_in_one_call_arrives_whole_with_the_kernels_stamps() -> None:
    tx, rx = _pair()
    with tx, rx:
        out = mmsg.Batch(tx, 16, 100)
        out.data[:, 0] = np.arange(16, dtype=np.uint8)
        before = time.time()
        assert out.send(10, 100) == (10, 0)
        after = time.time()
        got = mmsg.Batch(rx, 32, 2048, control=True)
        count = got.receive()
        assert count == 10
        assert got.lengths(count).tolist() == [100] * 10
        assert got.data[:count, 0].tolist() == list(range(10))
        stamps = got.stamps(count)
        assert stamps is not None and (stamps >= before - 0.01).all() and (stamps <= after + 0.01).all()
        got.rearm(count)
        assert got.receive() == 0  # nothing left: no blocking, no error


def test_without_timestamps_a_batch_has_no_stamps_and_a_refused_send_is_counted_not_raised() -> None:
    tx, rx = _pair()
    with tx:
        got = mmsg.Batch(rx, 4, 64)  # no control buffers
        tx.send(b"x" * 20)
        assert got.receive() == 1 and got.stamps(1) is None
        rx.close()  # nobody listens now: loopback answers with port unreachable
        out = mmsg.Batch(tx, 4, 32)
        results = [out.send(4, 32) for _ in range(3)]
        time.sleep(0.05)
        results += [out.send(4, 32) for _ in range(3)]
    assert all(sent + failed == 4 for sent, failed in results), results
    assert sum(failed for _, failed in results) >= 1, results


def test_a_batch_needs_room() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, pytest.raises(ValueError, match="slots"):
        mmsg.Batch(sock, 0, 64)


def _receive_burst(port: int, datagrams: list[bytes]) -> dict[str, object]:
    """A real receiver, stopped while `datagrams` arrive (so it reads them in as few batches as it can)."""
    receiver = subprocess.Popen(
        [*PROBE, "recv", str(port), "30", "0.1", "--wait-end"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        receiver.send_signal(signal.SIGSTOP)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for datagram in datagrams:
                sock.sendto(datagram, ("127.0.0.1", port))
        receiver.send_signal(signal.SIGCONT)
        return dict(json.loads(receiver.communicate(f"{time.time() + 0.3}\n", timeout=30)[0]))
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def test_reordering_gaps_and_runts_in_one_batch_are_counted_as_one_at_a_time() -> None:
    """0 1 2 4 5 3 6 8 9 and a 4-byte runt, all read in one batch: one late packet two behind, gap 7."""
    now = time.time()
    got = _receive_burst(47315, [_HEADER.pack(s, now) for s in (0, 1, 2, 4, 5, 3, 6, 8, 9)] + [b"runt"])
    assert got["received"] == 9
    assert (got["out_of_order"], got["reorder_max"], got["max_seq"]) == (1, 2, 9)
    assert missing_seqs(got["gaps"]) == [7]  # type: ignore[arg-type]


def test_gaps_across_batch_boundaries() -> None:
    """Three batches' worth in order, with packets missing on either side of the boundaries between
    batches (RECV_BATCH datagrams each): the gaps are exactly those packets, and the last in-order
    arrival before each is its start."""
    missing = {RECV_BATCH - 1, RECV_BATCH, 2 * RECV_BATCH + 1, 3 * RECV_BATCH - 5}
    seqs = [s for s in range(3 * RECV_BATCH) if s not in missing]
    got = _receive_burst(47316, [_HEADER.pack(s, time.time()) for s in seqs] + [_HEADER.pack(1, time.time())])
    assert got["received"] == len(seqs) + 1
    assert (got["out_of_order"], got["max_seq"]) == (1, 3 * RECV_BATCH - 1)
    assert missing_seqs(got["gaps"]) == sorted(missing)  # type: ignore[arg-type]
    assert all(g["from"] <= g["to"] for g in got["gaps"])  # type: ignore[attr-defined]
