"""DCQCN: the RoCEv2 rate controller of NVIDIA NICs, as three small machines driven by `now`.

Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015, §3: the congestion point
(CP, a switch egress) marks ECN CE with a RED-like probability of the queue length; the notification point
(NP, the receiver) answers CE-marked packets of a QP with at most one CNP per `cnp_interval_s`; the
reaction point (RP, the sender) cuts its rate on a CNP and recovers without one — fast recovery, then
additive, then hyper increase, paced by a timer and a byte counter.

Nothing here reads a clock, sleeps or does I/O: every method takes `now` (seconds), so the sender's fast
path, the simulator's fluid model and the tests (with a fake clock) run the same code.

Scaling.  The emulator runs links `scale` times slower than the fabric they model (400G=200M: 1/2000).
`DcqcnParams.scaled(scale)` keeps the dynamics' shape: rates times `scale`, durations divided by it, byte
quantities (queue thresholds, the byte counter) unchanged — so a queue of Kmin bytes drains in the same
number of timer periods, and the byte counter fires after the same number of timer periods at line rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class DcqcnParams:
    """DCQCN's parameters; defaults from the paper (Zhu et al. 2015: Kmin 5 KB, Kmax 200 KB, Pmax 1 %,
    g 1/256, the 55 µs timers, the 10 MB byte counter, R_AI 40 Mb/s) and, where the paper leaves a value
    open, from its authors' ns-3 model (ns3-rdma `mix/config.txt`: R_HAI 200 Mb/s, F 5, CNP interval
    50 µs).  Rates in bits per second, durations in seconds, sizes in bytes."""

    line_rate_bps: float = 400e9  # the QP's starting and highest rate (the NIC's line rate)
    g: float = 1 / 256  # α's EWMA gain
    alpha_period_s: float = 55e-6  # K: α decays once per period without a CNP
    increase_period_s: float = 55e-6  # T: the rate-increase timer
    byte_counter_bytes: int = 10 * MIB  # B: a rate-increase event per B bytes sent
    fast_recovery_steps: int = 5  # F
    ai_rate_bps: float = 40e6  # R_AI
    hai_rate_bps: float = 200e6  # R_HAI
    min_rate_bps: float = 100e6  # a cut never goes below (NVIDIA: rpg_min_rate)
    cnp_interval_s: float = 50e-6  # N: at most one CNP per QP per interval at the receiver
    kmin_bytes: int = 5 * KIB  # the CP's marking profile: 0 below Kmin ...
    kmax_bytes: int = 200 * KIB  # ... rising linearly to Pmax at Kmax, 1 above
    pmax: float = 0.01

    def __post_init__(self) -> None:
        checks = {
            "line_rate_bps": self.line_rate_bps > 0,
            "g": 0 < self.g <= 1,
            "alpha_period_s": self.alpha_period_s > 0,
            "increase_period_s": self.increase_period_s > 0,
            "byte_counter_bytes": self.byte_counter_bytes > 0,
            "fast_recovery_steps": self.fast_recovery_steps >= 1,
            "ai_rate_bps": self.ai_rate_bps > 0,
            "hai_rate_bps": self.hai_rate_bps >= self.ai_rate_bps,
            "min_rate_bps": 0 < self.min_rate_bps <= self.line_rate_bps,
            "cnp_interval_s": self.cnp_interval_s >= 0,
            "kmin_bytes": self.kmin_bytes >= 0,
            "kmax_bytes": self.kmax_bytes > self.kmin_bytes,
            "pmax": 0 < self.pmax <= 1,
        }
        bad = [name for name, ok in checks.items() if not (ok and _finite(getattr(self, name)))]
        if bad:
            raise ValueError(f"DCQCN parameter {bad[0]} out of range: {getattr(self, bad[0])!r}")

    def scaled(self, scale: float) -> DcqcnParams:
        """The same controller for links `scale` times the modelled speed (see the module docstring)."""
        if not (_finite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive number, not {scale!r}")
        return replace(
            self,
            line_rate_bps=self.line_rate_bps * scale,
            ai_rate_bps=self.ai_rate_bps * scale,
            hai_rate_bps=self.hai_rate_bps * scale,
            min_rate_bps=self.min_rate_bps * scale,
            alpha_period_s=self.alpha_period_s / scale,
            increase_period_s=self.increase_period_s / scale,
            cnp_interval_s=self.cnp_interval_s / scale,
        )


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def mark_probability(queue_bytes: float, p: DcqcnParams) -> float:
    """The CP's RED-like profile: P(mark CE) for a packet that finds `queue_bytes` queued at the egress."""
    if queue_bytes <= p.kmin_bytes:
        return 0.0
    if queue_bytes > p.kmax_bytes:
        return 1.0
    return p.pmax * (queue_bytes - p.kmin_bytes) / (p.kmax_bytes - p.kmin_bytes)


class CnpPacer:
    """The NP: whether a CE-marked packet of a QP is answered by a CNP (at most one per interval per QP,
    as NICs do)."""

    __slots__ = ("interval_s", "last_s")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.last_s: dict[int, float] = {}

    def on_marked(self, qpn: int, now: float) -> bool:
        last = self.last_s.get(qpn)
        if last is not None and now - last < self.interval_s:
            return False
        self.last_s[qpn] = now
        return True


class Dcqcn:
    """The RP of one QP: `rate_bps` is what the sender may send at; call `on_sent` for the bytes it sends,
    `on_cnp` for each CNP and `advance` (any time; `on_sent` and `on_cnp` do it first) so the timers fire
    in order.  Counters for reports: `cnps`, `cuts`, `increases`."""

    __slots__ = (
        "alpha",
        "byte_events",
        "bytes_since",
        "cnps",
        "cuts",
        "increases",
        "next_alpha_s",
        "next_increase_s",
        "p",
        "rate_bps",
        "target_bps",
        "timer_events",
    )  # fmt: skip

    def __init__(self, p: DcqcnParams, now: float) -> None:
        self.p = p
        self.rate_bps = p.line_rate_bps  # RoCE starts at line rate: no slow start
        self.target_bps = p.line_rate_bps
        self.alpha = 1.0
        self.timer_events = 0
        self.byte_events = 0
        self.bytes_since = 0
        self.next_alpha_s = now + p.alpha_period_s
        self.next_increase_s = now + p.increase_period_s
        self.cnps = 0
        self.cuts = 0
        self.increases = 0

    def advance(self, now: float) -> None:
        """Fire every timer due by `now`, in time order (α decay and rate-increase timer)."""
        p = self.p
        while True:
            due = min(self.next_alpha_s, self.next_increase_s)
            if due > now:
                return
            if self.next_alpha_s <= self.next_increase_s:
                self.alpha *= 1 - p.g
                self.next_alpha_s += p.alpha_period_s
            else:
                self.timer_events += 1
                self._increase()
                self.next_increase_s += p.increase_period_s

    def on_sent(self, n_bytes: int, now: float) -> None:
        self.advance(now)
        self.bytes_since += n_bytes
        while self.bytes_since >= self.p.byte_counter_bytes:
            self.bytes_since -= self.p.byte_counter_bytes
            self.byte_events += 1
            self._increase()

    def on_cnp(self, now: float) -> None:
        """Cut: remember the rate as the target, cut by α/2, raise α; restart recovery and both timers."""
        self.advance(now)
        p = self.p
        self.cnps += 1
        self.cuts += 1
        self.target_bps = self.rate_bps
        self.rate_bps = max(p.min_rate_bps, self.rate_bps * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.timer_events = self.byte_events = self.bytes_since = 0
        self.next_alpha_s = now + p.alpha_period_s
        self.next_increase_s = now + p.increase_period_s

    def _increase(self) -> None:
        p = self.p
        stage_max = max(self.timer_events, self.byte_events)
        stage_min = min(self.timer_events, self.byte_events)
        if stage_max < p.fast_recovery_steps:
            pass  # fast recovery: halfway back to the target
        elif stage_min > p.fast_recovery_steps:  # hyper increase
            self.target_bps += (stage_min - p.fast_recovery_steps) * p.hai_rate_bps
        else:  # additive increase
            self.target_bps += p.ai_rate_bps
        self.target_bps = min(self.target_bps, p.line_rate_bps)
        before = self.rate_bps
        self.rate_bps = min(p.line_rate_bps, (self.target_bps + self.rate_bps) / 2)
        if self.rate_bps > before:
            self.increases += 1

    def phase(self) -> str:
        """Where recovery is: "fast", "additive" or "hyper" (for reports and tests)."""
        stage_max = max(self.timer_events, self.byte_events)
        stage_min = min(self.timer_events, self.byte_events)
        if stage_max < self.p.fast_recovery_steps:
            return "fast"
        return "hyper" if stage_min > self.p.fast_recovery_steps else "additive"


__all__ = ["CnpPacer", "Dcqcn", "DcqcnParams", "mark_probability"]
