"""DCQCN for flows: the rate controller of `traffic.dcqcn`, vectorised over every flow, on fluid queues.

The ideal max-min solver (`flowsim.maxmin`) gives each flow its fair share at once; no NIC does that.  Here
each flow runs DCQCN's reaction point (the same algorithm and parameters as `traffic.dcqcn.Dcqcn`, which the
emulator's senders run and `tests/test_flowsim_dcqcn.py` checks this against), links hold fluid queues that
fill at the sum of their flows' rates minus their capacity, the congestion point marks with DCQCN's RED-like
profile of the queue, and a flow's receiver answers a marked packet with a CNP at most once per interval.

Time-stepped at `dt_s` (default a quarter of the shortest DCQCN timer, so every timer fires at most once per
step).  Marking is random as in a switch, from a seeded generator: the same inputs give the same run.
Feedback takes one step (the CNP acts on the next step's rate) — a fabric's round trip is microseconds, well
under DCQCN's 50–55 µs timers.  A flow's rate arrives whole at every link of its path (no upstream
shaping), as in the DCQCN paper's fluid model (Zhu et al. 2015, §4).  A queue past `buffer_bytes` drops the
excess, from each flow in proportion to its rate.

Pure numpy: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.network import F64, I64
from traffic.dcqcn import DcqcnParams

BITS = 8.0


@dataclass(frozen=True)
class FluidLinks:
    """Links and flows: flow f crosses links `links[indptr[f]:indptr[f+1]]`."""

    cap_bps: F64
    indptr: I64
    links: I64
    buffer_bytes: F64  # per link; np.inf: never drops

    def __post_init__(self) -> None:
        if self.indptr.size < 1 or self.indptr[0] != 0 or np.any(np.diff(self.indptr) < 1):
            raise ValueError("indptr: every flow needs at least one link")
        if self.links.size != self.indptr[-1] or (self.links.size and self.links.max() >= self.cap_bps.size):
            raise ValueError("links: out of range of cap_bps")

    @property
    def n_flows(self) -> int:
        return int(self.indptr.size - 1)


@dataclass(frozen=True)
class FluidResult:
    """Per flow: bytes not dropped (delivered, or still queued at the end), dropped, CNPs, rate cuts; per
    link: peak queue; samples every
    `sample_every` steps of time, every flow's rate and every link's queue."""

    delivered_bytes: F64
    dropped_bytes: F64
    cnps: I64
    cuts: I64
    finish_s: F64  # when the flow's last byte was sent (np.inf: not finished)
    queue_peak_bytes: F64
    marked_packets: F64  # per flow: expected CE-marked packets
    sent_packets: F64
    t_s: F64
    rate_bps: F64  # (samples, flows)
    queue_bytes: F64  # (samples, links)


class ReactionPoints:
    """DCQCN's reaction point (`traffic.dcqcn.Dcqcn`) of many QPs at once, as state arrays.

    One copy of the algorithm for both fluid models here and in `flowsim.ccsim`, so that what
    `tests/test_flowsim_dcqcn.py` checks against the scalar rate machine holds for both.  `line_bps` is
    every QP's highest (and starting) rate: its NIC's line rate, or less where a pacer caps the job.  Every
    method takes integer row indices; `timers` fires each timer at most once, so call it at least once per
    timer period (the models step at a quarter of it), or use `skip` across a quiet stretch."""

    def __init__(self, p: DcqcnParams, line_bps: F64, start_s: F64) -> None:
        n = line_bps.size
        self.p = p
        self.line = line_bps.astype(np.float64)
        self.rc = self.line.copy()  # RoCE starts at line rate: no slow start
        self.rt = self.line.copy()
        self.alpha = np.ones(n)
        self.t_ev = np.zeros(n, dtype=np.int64)
        self.b_ev = np.zeros(n, dtype=np.int64)
        self.since = np.zeros(n)
        self.next_alpha = start_s + p.alpha_period_s
        self.next_inc = start_s + p.increase_period_s
        self.last_cnp = np.full(n, -np.inf)
        self.pending = np.zeros(n, dtype=bool)

    def restart_timers(self, rows: I64, now: float | F64) -> None:
        """Rows that start sending at `now` (one time, or one per row): their timers count from there."""
        self.next_alpha[rows] = now + self.p.alpha_period_s
        self.next_inc[rows] = now + self.p.increase_period_s

    def cut(self, rows: I64, now: float) -> None:
        """A CNP: the target becomes the current rate, the rate drops by α/2, α rises; recovery restarts."""
        p = self.p
        self.rt[rows] = self.rc[rows]
        self.rc[rows] = np.maximum(p.min_rate_bps, self.rc[rows] * (1 - self.alpha[rows] / 2))
        self.alpha[rows] = (1 - p.g) * self.alpha[rows] + p.g
        self.t_ev[rows] = 0
        self.b_ev[rows] = 0
        self.since[rows] = 0.0
        self.restart_timers(rows, now)

    def timers(self, rows: I64, now: float) -> None:
        """α decay and the rate-increase timer, for those of `rows` due by `now` (each at most once)."""
        p = self.p
        due = rows[self.next_alpha[rows] <= now]
        self.alpha[due] *= 1 - p.g
        self.next_alpha[due] += p.alpha_period_s
        due = rows[self.next_inc[rows] <= now]
        if due.size:
            self.t_ev[due] += 1
            self.next_inc[due] += p.increase_period_s
            self.increase(due)

    def count_bytes(self, rows: I64, out_bytes: F64) -> None:
        """The byte counter: a rate-increase event per `byte_counter_bytes` sent."""
        p = self.p
        self.since[rows] += out_bytes
        over = rows[self.since[rows] >= p.byte_counter_bytes]
        if over.size:
            self.b_ev[over] += (self.since[over] // p.byte_counter_bytes).astype(np.int64)
            self.since[over] %= p.byte_counter_bytes
            self.increase(over)

    def increase(self, rows: I64) -> None:
        """One rate-increase event: fast recovery, additive or hyper increase by the two counters."""
        p = self.p
        hi = np.maximum(self.t_ev[rows], self.b_ev[rows])
        lo = np.minimum(self.t_ev[rows], self.b_ev[rows])
        add = np.where(
            hi < p.fast_recovery_steps,
            0.0,
            np.where(
                lo > p.fast_recovery_steps, (lo - p.fast_recovery_steps) * p.hai_rate_bps, p.ai_rate_bps
            ),
        )
        line = self.line[rows]
        rt = np.minimum(self.rt[rows] + add, line)
        self.rt[rows] = rt
        self.rc[rows] = np.minimum(line, (rt + self.rc[rows]) / 2)

    def at_line(self, rows: I64) -> bool:
        """Every one of `rows` is at its highest rate with its target there too: timers change nothing."""
        return bool(np.all(self.rc[rows] >= self.line[rows]) and np.all(self.rt[rows] >= self.line[rows]))

    def skip(self, rows: I64, until_s: float) -> None:
        """Fire every timer due by `until_s` at once; exact only for rows `at_line` (α decays, counters
        count, rates stay at line rate)."""
        p = self.p
        fired = _fired(self.next_alpha[rows], p.alpha_period_s, until_s)
        self.next_alpha[rows] += fired * p.alpha_period_s
        self.alpha[rows] *= np.power(1 - p.g, fired)
        fired = _fired(self.next_inc[rows], p.increase_period_s, until_s)
        self.next_inc[rows] += fired * p.increase_period_s
        self.t_ev[rows] += fired.astype(np.int64)


def _fired(next_s: F64, period_s: float, until_s: float) -> F64:
    """How many times a periodic timer next due at `next_s` fires by `until_s`."""
    return np.where(next_s <= until_s, np.floor((until_s - next_s) / period_s) + 1, 0.0)


class FluidDcqcn:
    """Run `FluidLinks` with flows starting at `start_s`, each sending `size_bytes` (np.inf: until the end)
    at most at `demand_bps` (the application's pace; default the NIC's), under DCQCN with parameters `p`
    (`p.line_rate_bps` is every flow's NIC rate).  `cc=False` runs the same flows without a controller:
    every flow at its demand, whatever the queues say."""

    def __init__(
        self,
        net: FluidLinks,
        p: DcqcnParams,
        start_s: F64,
        size_bytes: F64,
        mtu_bytes: int = 1024,
        dt_s: float | None = None,
        seed: int = 0,
        demand_bps: F64 | None = None,
        cc: bool = True,
    ) -> None:
        n = net.n_flows
        if start_s.shape != (n,) or size_bytes.shape != (n,):
            raise ValueError(f"start_s and size_bytes need one value per flow ({n})")
        self.net, self.p, self.mtu = net, p, float(mtu_bytes)
        self.start_s, self.size = start_s.astype(float), size_bytes.astype(float)
        self.dt = dt_s if dt_s is not None else min(p.increase_period_s, p.alpha_period_s) / 4
        if not self.dt > 0:
            raise ValueError(f"dt_s must be positive, not {self.dt!r}")
        self.rng = np.random.default_rng(seed)
        self.demand = (
            np.full(n, p.line_rate_bps) if demand_bps is None else np.minimum(demand_bps, p.line_rate_bps)
        )
        self.cc = cc
        self.flow_of = np.repeat(np.arange(n), np.diff(net.indptr))
        self.rp = ReactionPoints(p, np.full(n, p.line_rate_bps), self.start_s)
        self.queue = np.zeros(net.cap_bps.size)

    @property
    def pending_cnp(self) -> np.ndarray:
        """Per flow: a CNP waiting to act at the next step (tests force one here)."""
        return self.rp.pending

    def run(self, until_s: float, sample_every: int = 100) -> FluidResult:
        net, p, dt, rp = self.net, self.p, self.dt, self.rp
        n, n_links = net.n_flows, net.cap_bps.size
        sent = np.zeros(n)
        delivered = np.zeros(n)
        dropped = np.zeros(n)
        cnps = np.zeros(n, dtype=np.int64)
        cuts = np.zeros(n, dtype=np.int64)
        marked = np.zeros(n)
        packets = np.zeros(n)
        finish = np.full(n, np.inf)
        peak = np.zeros(n_links)
        ts: list[float] = []
        rates: list[F64] = []
        queues: list[F64] = []
        steps = int(np.ceil(until_s / dt))
        for step in range(steps):
            now = step * dt
            active = (self.start_s <= now) & (sent < self.size)
            rows = np.flatnonzero(active)
            # the reaction point: a CNP from the last step cuts; then the timers due by now
            cut = rp.pending & active
            if cut.any():
                rp.cut(np.flatnonzero(cut), now)
                cuts += cut
            rp.pending[:] = False
            rp.timers(rows, now)
            # sending: at the current rate, never past the flow's size
            rate = np.where(active, np.minimum(rp.rc, self.demand) if self.cc else self.demand, 0.0)
            out = np.minimum(rate * dt / BITS, np.maximum(self.size - sent, 0.0))
            sent += out
            finish[(sent >= self.size) & np.isinf(finish)] = now + dt
            rp.count_bytes(rows, out[rows])
            # the links: fluid queues, drops past the buffer, in proportion to each flow's share
            offered = np.bincount(net.links, weights=(out * BITS / dt)[self.flow_of], minlength=n_links)
            q = self.queue + (offered - net.cap_bps) * dt / BITS
            q = np.maximum(q, 0.0)
            excess = np.maximum(q - net.buffer_bytes, 0.0)
            self.queue = q - excess
            peak = np.maximum(peak, self.queue)
            share = np.divide(excess, offered * dt / BITS, out=np.zeros(n_links), where=offered > 0)
            lost = 1 - np.exp(np.add.reduceat(np.log1p(-np.minimum(share, 1.0))[net.links], net.indptr[:-1]))
            dropped += out * lost
            delivered += out * (1 - lost)
            pk = out / self.mtu
            packets += pk
            if step % sample_every == 0:
                ts.append(now)
                rates.append(rate.copy())
                queues.append(self.queue.copy())
            if not self.cc:  # no ECN, no CNPs: the rates stay the demands
                continue
            # the congestion point marks; the notification point answers once per interval
            pm = mark_probability(self.queue, p)
            with np.errstate(divide="ignore"):  # log1p(-1) = -inf: a certain mark, exp(-inf) = 0
                path = 1 - np.exp(np.add.reduceat(np.log1p(-pm)[net.links], net.indptr[:-1]))
            marked += pk * path
            hit = self.rng.random(n) < 1 - np.power(1 - path, pk)
            answer = hit & (now - rp.last_cnp >= p.cnp_interval_s)
            rp.last_cnp[answer] = now
            rp.pending |= answer
            cnps += answer
        return FluidResult(
            delivered_bytes=delivered, dropped_bytes=dropped, cnps=cnps, cuts=cuts, finish_s=finish,
            queue_peak_bytes=peak, marked_packets=marked, sent_packets=packets, t_s=np.array(ts),
            rate_bps=np.array(rates).reshape(len(ts), n),
            queue_bytes=np.array(queues).reshape(len(ts), n_links),
        )  # fmt: skip


def mark_probability(queue: F64, p: DcqcnParams) -> F64:
    """`traffic.dcqcn.mark_probability`, vectorised: P(a packet is CE-marked) at each queue length."""
    ramp = p.pmax * (queue - p.kmin_bytes) / (p.kmax_bytes - p.kmin_bytes)
    return np.where(queue <= p.kmin_bytes, 0.0, np.where(queue > p.kmax_bytes, 1.0, ramp))


def jain(x: F64) -> float:
    """Jain's fairness index of `x` (1: all equal)."""
    s = float(np.sum(x))
    return s * s / (x.size * float(np.sum(x * x))) if s > 0 else 0.0


__all__ = ["FluidDcqcn", "FluidLinks", "FluidResult", "ReactionPoints", "jain", "mark_probability"]
