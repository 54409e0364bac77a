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
        self.rc = np.full(n, p.line_rate_bps)
        self.rt = self.rc.copy()
        self.alpha = np.ones(n)
        self.t_ev = np.zeros(n, dtype=np.int64)
        self.b_ev = np.zeros(n, dtype=np.int64)
        self.since = np.zeros(n)
        self.next_alpha = self.start_s + p.alpha_period_s
        self.next_inc = self.start_s + p.increase_period_s
        self.last_cnp = np.full(n, -np.inf)
        self.pending_cnp = np.zeros(n, dtype=bool)
        self.queue = np.zeros(net.cap_bps.size)

    def _increase(self, hit: np.ndarray) -> None:
        p = self.p
        hi = np.maximum(self.t_ev[hit], self.b_ev[hit])
        lo = np.minimum(self.t_ev[hit], self.b_ev[hit])
        rt = self.rt[hit]
        add = np.where(
            hi < p.fast_recovery_steps,
            0.0,
            np.where(
                lo > p.fast_recovery_steps, (lo - p.fast_recovery_steps) * p.hai_rate_bps, p.ai_rate_bps
            ),
        )
        rt = np.minimum(rt + add, p.line_rate_bps)
        self.rt[hit] = rt
        self.rc[hit] = np.minimum(p.line_rate_bps, (rt + self.rc[hit]) / 2)

    def run(self, until_s: float, sample_every: int = 100) -> FluidResult:
        net, p, dt = self.net, self.p, self.dt
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
            # the reaction point: a CNP from the last step cuts; then the timers due by now
            cut = self.pending_cnp & active
            if cut.any():
                self.rt[cut] = self.rc[cut]
                self.rc[cut] = np.maximum(p.min_rate_bps, self.rc[cut] * (1 - self.alpha[cut] / 2))
                self.alpha[cut] = (1 - p.g) * self.alpha[cut] + p.g
                self.t_ev[cut] = self.b_ev[cut] = 0
                self.since[cut] = 0.0
                self.next_alpha[cut] = now + p.alpha_period_s
                self.next_inc[cut] = now + p.increase_period_s
                cuts += cut
            self.pending_cnp[:] = False
            due = active & (self.next_alpha <= now)
            self.alpha[due] *= 1 - p.g
            self.next_alpha[due] += p.alpha_period_s
            due = active & (self.next_inc <= now)
            self.t_ev[due] += 1
            self.next_inc[due] += p.increase_period_s
            if due.any():
                self._increase(due)
            # sending: at the current rate, never past the flow's size
            rate = np.where(active, np.minimum(self.rc, self.demand) if self.cc else self.demand, 0.0)
            out = np.minimum(rate * dt / BITS, np.maximum(self.size - sent, 0.0))
            sent += out
            finish[(sent >= self.size) & np.isinf(finish)] = now + dt
            self.since += out
            over = active & (self.since >= p.byte_counter_bytes)
            if over.any():
                self.b_ev[over] += (self.since[over] // p.byte_counter_bytes).astype(np.int64)
                self.since[over] %= p.byte_counter_bytes
                self._increase(over)
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
            pm = _mark(self.queue, p)
            with np.errstate(divide="ignore"):  # log1p(-1) = -inf: a certain mark, exp(-inf) = 0
                path = 1 - np.exp(np.add.reduceat(np.log1p(-pm)[net.links], net.indptr[:-1]))
            marked += pk * path
            hit = self.rng.random(n) < 1 - np.power(1 - path, pk)
            answer = hit & (now - self.last_cnp >= p.cnp_interval_s)
            self.last_cnp[answer] = now
            self.pending_cnp |= answer
            cnps += answer
        return FluidResult(
            delivered_bytes=delivered, dropped_bytes=dropped, cnps=cnps, cuts=cuts, finish_s=finish,
            queue_peak_bytes=peak, marked_packets=marked, sent_packets=packets, t_s=np.array(ts),
            rate_bps=np.array(rates).reshape(len(ts), n),
            queue_bytes=np.array(queues).reshape(len(ts), n_links),
        )  # fmt: skip


def _mark(queue: F64, p: DcqcnParams) -> F64:
    """`traffic.dcqcn.mark_probability`, vectorised."""
    ramp = p.pmax * (queue - p.kmin_bytes) / (p.kmax_bytes - p.kmin_bytes)
    return np.where(queue <= p.kmin_bytes, 0.0, np.where(queue > p.kmax_bytes, 1.0, ramp))


def jain(x: F64) -> float:
    """Jain's fairness index of `x` (1: all equal)."""
    s = float(np.sum(x))
    return s * s / (x.size * float(np.sum(x * x))) if s > 0 else 0.0


__all__ = ["FluidDcqcn", "FluidLinks", "FluidResult", "jain"]
