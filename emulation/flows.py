"""One probe flow's two ends, apart from the process that runs them: a `FlowSender` (its schedule and
its batch of datagrams) and a `FlowRecord` (what arrived: sequence gaps, reordering, delays, rate over
time).  A probe process runs one of them (`emulation.probe`); a fleet runs every flow of a step from two
processes (`emulation.fleet`) — the packets and the accounting are the same either way.

The datagram is ours from the UDP payload on: a sequence number and the wall-clock send time (`HEADER`),
then padding to the size asked for.  With a fixed source port or spraying, the sender writes the UDP
header too, on a raw IP socket (the kernel adds the IP header; checksum 0, which IPv4 allows), so any port
is possible without a socket per port.
"""

from __future__ import annotations

import bisect
import math
import random
import socket
import struct
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from emulation import mmsg
from traffic.entropy import spray_sport
from traffic.fastpath import receive_buffer

HEADER = struct.Struct("!Qd")  # sequence number, send time
UDP = struct.Struct("!HHHH")  # source port, destination port, length, checksum
#: Packet k leaves at a seeded random point of its slot [k, k + 1) x interval: exactly the rate on average,
#: but never in lockstep with another flow of the same rate (periodic senders phase-lock at a drop-tail
#: queue, and one of them loses everything the queue drops: Floyd & Jacobson's phase effects).
JITTER_SLOTS = 4096
#: Datagrams per sendmmsg / recvmmsg call (`emulation.mmsg`), and a receiver's room for each (jumbo).
SEND_BATCH = 64
RECV_BATCH = 64
RECV_SLOT_BYTES = 9216
#: A receiver reads what arrived every POLL_S instead of waking for each packet: a wake-up costs more than
#: the read, and the kernel stamps each packet's arrival time (SO_TIMESTAMPNS) whenever it is read.
POLL_S = 0.001


def sender_socket(dst: str, port: int, raw: bool, dscp: int = 0) -> socket.socket:
    """Connected to `dst`: a UDP socket, or a raw one whose UDP header the sender writes."""
    if raw:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        sock.connect((dst, 0))
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect((dst, port))
    if dscp:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    return sock


def receiver_socket(port: int) -> tuple[socket.socket, bool]:
    """A non-blocking UDP socket bound to `port` with an 8 MB buffer, and whether the kernel stamps each
    datagram's arrival (SO_TIMESTAMPNS; not outside Linux, where the receiver's clock stands in)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receive_buffer(sock, 8 << 20)
    try:
        sock.setsockopt(socket.SOL_SOCKET, mmsg.SCM_TIMESTAMPNS, 1)
        stamped = True
    except OSError:
        stamped = False
    sock.bind(("0.0.0.0", port))
    sock.setblocking(False)
    return sock, stamped


class FlowSender:
    """`rate_pps` datagrams of `size` payload bytes a second on `sock` (from `sender_socket`), each at its
    jittered time.  `sport`: a fixed source port; `spray`: another one per packet (`traffic.entropy`,
    from this offset); both need a raw socket.  `start_s` / `duration_s`: when, after the run's start,
    the flow begins and for how long it sends (None: until the run ends) — a scenario's flows come and go
    while one process sends them all."""

    def __init__(self, sock: socket.socket, dst: str, port: int, rate_pps: float, size: int = 64,
                 sport: int | None = None, spray: int | None = None, start_s: float = 0.0,
                 duration_s: float | None = None, dscp: int = 0) -> None:  # fmt: skip
        if rate_pps <= 0:
            raise ValueError(f"rate_pps must be > 0, got {rate_pps}")
        if start_s < 0 or (duration_s is not None and duration_s < 0):
            raise ValueError(f"start_s and duration_s must be >= 0, got {start_s}, {duration_s}")
        self.start_s, self.dscp = start_s, dscp  # dscp: reported; the socket marks the packets
        self.stop_s = math.inf if duration_s is None else start_s + duration_s
        self.sock, self.rate_pps, self.size, self.spray = sock, rate_pps, size, spray
        self.entropy = "spray" if spray is not None else ("fixed" if sport is not None else "kernel")
        self.interval = 1.0 / rate_pps
        raw = sport is not None or spray is not None
        body = max(HEADER.size, size)
        at = UDP.size if raw else 0  # where our header starts in a datagram
        self.length = at + body
        self.batch = mmsg.Batch(sock, SEND_BATCH, self.length)
        if raw:  # the UDP header: ours, the same for every packet but the source port when spraying
            header = UDP.pack(sport or 0, port, UDP.size + body, 0)
            self.batch.data[:, : UDP.size] = np.frombuffer(header, np.uint8)
        self._seq_col = self.batch.data[:, at : at + 8].view(">u8")[:, 0]
        self._time_col = self.batch.data[:, at + 8 : at + 16].view(">f8")[:, 0]
        self._sport_col = self.batch.data[:, 0:2].view(">u2")[:, 0]
        self._first: memoryview = self.batch.data[0].data  # slot 0, exactly one datagram long
        rng = random.Random(f"{dst}:{port}:{sport}:{spray}")
        self.offset = [rng.random() for _ in range(JITTER_SLOTS)]
        self.seq = self.errors = 0
        self.late_s = (
            0.0  # the most a packet left after it was due: a stalled sender sends its backlog at once
        )
        self.wall0 = 0.0

    def due_at(self, k: int) -> float:
        """Seconds after the start when packet k is due."""
        return (k + self.offset[k % JITTER_SLOTS]) * self.interval

    def next_due(self) -> float:
        return self.due_at(self.seq)

    def send_due(self, elapsed: float) -> int:
        """Send every packet due by `elapsed` seconds after the start (`wall0`): how many."""
        # packet k is due once (k + offset[k]) * interval has passed: every k below floor(elapsed /
        # interval) is, and that one if its offset has
        last = int(elapsed / self.interval)
        if self.due_at(last) > elapsed:
            last -= 1
        if last < self.seq:
            return 0
        first = self.seq
        self.late_s = max(self.late_s, elapsed - self.due_at(first))
        while last >= self.seq:
            count = min(SEND_BATCH, last - self.seq + 1)
            self._seq_col[:count] = np.arange(self.seq, self.seq + count, dtype=np.uint64)
            self._time_col[:count] = self.wall0 + elapsed
            if self.spray is not None:
                self._sport_col[:count] = [
                    spray_sport(k, self.spray) for k in range(self.seq, self.seq + count)
                ]
            if count == 1:  # one datagram: a plain send costs less than building a sendmmsg call
                try:
                    self.sock.send(self._first)
                except OSError:  # ENOBUFS under load: loss, as it should be
                    self.errors += 1
            else:
                _sent, failed = self.batch.send(count, self.length)
                self.errors += failed
            self.seq += count
        return self.seq - first

    def result(self) -> dict[str, Any]:
        return {"sent": self.seq, "start": self.wall0, "rate_pps": self.rate_pps, "size": self.size,
                "entropy": self.entropy, "send_errors": self.errors, "dscp": self.dscp,
                "late_max_ms": round(self.late_s * 1000, 2)}  # fmt: skip


def run_senders(senders: list[FlowSender], duration_s: float, start_at: float | None = None) -> None:
    """Run `senders` together from `start_at` (wall clock; now if None) for `duration_s`, each in its own
    window (`FlowSender.start_s`, `stop_s`).  Between packets the loop sleeps until the next is due (at
    least 0.5 ms: a few packets per wake-up at high rates), so a slow flow costs a few hundred wake-ups a
    second, not two thousand, and no core is burnt busy-waiting (on a 2-core machine busy-waiting senders
    starve ovs-vswitchd's forwarding thread and cause the loss they are meant to measure)."""
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    wall0, start = time.time(), time.perf_counter()
    for sender in senders:
        sender.wall0 = wall0 + sender.start_s
    end = start + duration_s
    starts = np.array([sender.start_s for sender in senders], dtype=np.float64)
    stops = np.array([sender.stop_s for sender in senders], dtype=np.float64)
    # when each flow's next packet is due (run time): a tick looks at the flows whose time has come, not
    # at all of them (1,024 flows at k=16: a Python call per flow per tick was most of a core)
    due = np.array([sender.next_due() for sender in senders], dtype=np.float64) + starts
    due[due >= stops] = math.inf
    while True:
        now = time.perf_counter()
        if now >= end or not senders or math.isinf(float(due.min())):
            break
        elapsed = now - start
        for i in np.flatnonzero(due <= elapsed).tolist():
            sender = senders[i]
            # a flow sends what fell due inside its window, and not a packet after it
            sender.send_due(min(elapsed, stops[i]) - starts[i])
            due[i] = sender.next_due() + starts[i]
            if due[i] >= stops[i]:
                due[i] = math.inf
        wait = float(due.min()) - (time.perf_counter() - start)
        time.sleep(min(0.01, max(0.0005, wait)))


class FlowRecord:
    """What one receiver saw, absorbed a batch at a time in arrival order."""

    def __init__(self, bucket_s: float = 0.1) -> None:
        self.bucket_s = bucket_s
        self.last_seq, self.last_time = -1, 0.0
        self.received = self.out_of_order = self.reorder_max = self.bytes = 0
        self.first: float | None = None
        self.last_arrival = 0.0
        self.buckets: dict[int, int] = {}
        self.gaps: list[dict[str, float]] = []
        self.late: set[int] = set()  # arrived behind a later packet: each fills a place in a gap
        self.delays: list[npt.NDArray[np.float64]] = []

    def read(self, batch: mmsg.Batch, fd: int | None = None) -> int:
        """Receive what waits on `batch`'s socket (or `fd`) into this record: how many datagrams (0: none)."""
        count = batch.receive(fd)
        if count:
            self.absorb(batch, count)
            batch.rearm(count)
        return count

    def absorb(self, batch: mmsg.Batch, count: int) -> None:
        """The first `count` datagrams of `batch` (just received; the caller rearms it after)."""
        lengths = batch.lengths(count)
        stamps = batch.stamps(count)
        times = stamps if stamps is not None else np.full(count, time.time())
        whole = lengths >= HEADER.size
        seqs = batch.data[:count, 0:8].view(">u8")[:, 0][whole].astype(np.int64)
        sent = batch.data[:count, 8:16].view(">f8")[:, 0][whole].astype(np.float64)
        times = times[whole]
        if not len(seqs):
            return
        self.delays.append(times - sent)  # one clock for every namespace: a true one-way delay
        self.received += len(seqs)
        self.bytes += int(lengths[whole].sum())
        self.first = float(times[0]) if self.first is None else self.first
        self.last_arrival = float(times[-1])
        keys, counts = np.unique(np.floor(times / self.bucket_s).astype(np.int64), return_counts=True)
        for key, n in zip(keys.tolist(), counts.tolist(), strict=True):
            self.buckets[key] = self.buckets.get(key, 0) + n
        # the highest sequence number seen before each packet: one below it arrived late, one more than a
        # step above it opened a gap
        before = np.maximum.accumulate(np.concatenate(([self.last_seq], seqs)))[:-1]
        behind = seqs < before
        if behind.any():
            self.out_of_order += int(behind.sum())
            self.reorder_max = max(self.reorder_max, int((before - seqs)[behind].max()))
            self.late.update(seqs[behind].tolist())
        in_order = np.flatnonzero(~behind)
        for i in np.flatnonzero(~behind & (seqs > before + 1) & (before >= 0)).tolist():
            j = int(np.searchsorted(in_order, i)) - 1
            since = float(times[in_order[j]]) if j >= 0 else self.last_time
            self.gaps.append({"after_seq": int(before[i]), "missing": int(seqs[i] - before[i] - 1),
                              "from": since, "to": float(times[i])})  # fmt: skip
        if len(in_order):
            self.last_seq = max(self.last_seq, int(seqs[in_order].max()))
            self.last_time = float(times[in_order[-1]])

    def result(self) -> dict[str, Any]:
        delays = np.concatenate(self.delays).tolist() if self.delays else []
        return {
            "received": self.received,
            "bytes": self.bytes,
            "max_seq": self.last_seq,
            "out_of_order": self.out_of_order,
            "reorder_max": self.reorder_max,
            "first": self.first,
            "last": self.last_arrival,
            "bucket_s": self.bucket_s,
            "buckets": sorted(self.buckets.items()),
            "gaps": net_gaps(self.gaps, self.late),
            "latency_ms": percentiles_ms(delays),
        }


def missing_seqs(gaps: Iterable[dict[str, float]]) -> list[int]:
    """The sequence numbers a receiver's gaps say never arrived, in order."""
    return [
        seq
        for gap in gaps
        for seq in range(int(gap["after_seq"]) + 1, int(gap["after_seq"]) + 1 + int(gap["missing"]))
    ]


def net_gaps(gaps: list[dict[str, float]], late: Iterable[int]) -> list[dict[str, float]]:
    """The gaps less the sequence numbers that arrived late: a gap a late packet falls in is split around
    it (each part keeps the gap's times), one it fills entirely disappears.  A gap is
    `{"after_seq", "missing", "from", "to"}`: `missing` numbers after `after_seq` had not arrived when
    the next one did."""
    arrived = sorted(set(late))
    if not arrived:
        return gaps
    out: list[dict[str, float]] = []
    for gap in gaps:
        first = int(gap["after_seq"]) + 1
        last = first + int(gap["missing"]) - 1
        start = first
        for seq in arrived[bisect.bisect_left(arrived, first) : bisect.bisect_right(arrived, last)]:
            if seq > start:
                out.append({**gap, "after_seq": start - 1, "missing": seq - start})
            start = seq + 1
        if start <= last:
            out.append({**gap, "after_seq": start - 1, "missing": last - start + 1})
    return out


def percentiles_ms(delays: list[float]) -> dict[str, float] | None:
    if not delays:
        return None
    ordered = sorted(delays)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(1000 * ordered[-1], 3)}


__all__ = [
    "HEADER",
    "JITTER_SLOTS",
    "POLL_S",
    "RECV_BATCH",
    "RECV_SLOT_BYTES",
    "SEND_BATCH",
    "UDP",
    "FlowRecord",
    "FlowSender",
    "missing_seqs",
    "net_gaps",
    "percentiles_ms",
    "receiver_socket",
    "run_senders",
    "sender_socket",
]
