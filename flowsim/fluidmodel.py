"""The DCQCN paper's fluid model: what DCQCN's parameters predict for N flows sharing one link.

Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (SIGCOMM 2015, §5) model DCQCN by the
expected rates of its reaction points: per flow the current rate R_C, the target R_T and α; one queue q
marked with the RED-like profile p(q) (`traffic.dcqcn.mark_probability`), seen after a feedback delay τ*.
With p and R (R_C) taken τ* ago, rates in packets per second, and the paper's names — τ the CNP interval,
τ' the α period, T the increase timer, B the byte counter in packets, F the fast-recovery steps:

    a = 1 − (1−p)^(τR)                    P(at least one CNP in an interval)
    b = p / ((1−p)^(−B) − 1)              byte-counter increase events per packet
    c = b · (1−p)^(FB)                    ... past fast recovery (additive increase)
    d = p / ((1−p)^(−TR) − 1)             timer events per packet, e = d · (1−p)^(FTR)
    dα/dt   = g/τ' · ((1 − (1−p)^(τ'R)) − α)
    dR_T/dt = −(R_T − R_C)·a/τ + R_AI·R·(c + e)
    dR_C/dt = −R_C·α·a/(2τ) + (R_T − R_C)/2 · R·(b + d)
    dq/dt   = Σ R_C − C                   (q ≥ 0)

(as p → 0: a → 0, b, c → 1/B, d, e → 1/(TR)).  The model has no hyper increase, as the paper's has
none.  The feedback delay defaults to one CNP interval, as in the fluid model its co-authors published
with "ECN or Delay" (Zhu et al., CoNEXT 2016).

This is the *prediction* the instruments are judged against (`predicted_convergence_s`, used by
`benchmarks/converge.py` and the tests): a deterministic mean-field model, so it converges smoothly where
the packet-level emulator and the stochastic simulator (`flowsim.dcqcn`) wander around it.  Integrated by
Euler steps of at most a twentieth of the CNP interval; pure numpy, no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flowsim.network import F64
from traffic.dcqcn import DcqcnParams

BITS = 8.0
#: Euler steps per CNP interval (and per marking ramp crossed at line rate).
STEPS_PER_INTERVAL = 20


@dataclass(frozen=True)
class FluidTrace:
    """The model's solution, sampled every step: per flow R_C (bits/s, 0 before its start) and α; the
    queue."""

    t_s: F64
    rate_bps: F64  # (samples, flows)
    alpha: F64  # (samples, flows)
    queue_bytes: F64
    dt_s: float


def _terms(p: float, r: F64, tau: float, b_pkts: float, f: int, timer: float) -> tuple[F64, ...]:
    """a, b, c, d, e of the module docstring at marking probability `p` and delayed rates `r` (pkt/s)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if p <= 0.0:
            zeros = np.zeros_like(r)
            d = np.where(r > 0, 1.0 / np.maximum(timer * r, 1e-300), 0.0)
            return zeros, np.full_like(r, 1.0 / b_pkts), np.full_like(r, 1.0 / b_pkts), d, d
        if p >= 1.0:
            zeros = np.zeros_like(r)
            return np.ones_like(r), zeros, zeros, zeros, zeros
        ln = math.log1p(-p)  # < 0
        a = -np.expm1(tau * r * ln)
        b = p / math.expm1(-b_pkts * ln)
        c = b * math.exp(f * b_pkts * ln)
        d = np.where(r > 0, p / np.expm1(-timer * r * ln), 0.0)
        e = d * np.exp(f * timer * r * ln)
        return a, np.full_like(r, b), np.full_like(r, c), d, e


def solve(
    p: DcqcnParams,
    capacity_bps: float,
    start_s: Sequence[float],
    until_s: float,
    frame_bytes: int = 1082,
    delay_s: float | None = None,
) -> FluidTrace:
    """Flows starting at `start_s` (each at line rate, α = 1, as `traffic.dcqcn.Dcqcn`) into one link of
    `capacity_bps`, to `until_s`.  `delay_s`: the feedback delay τ* (default the CNP interval)."""
    if capacity_bps <= 0 or frame_bytes <= 0 or not start_s:
        raise ValueError("fluid model: capacity_bps, frame_bytes and at least one flow are needed")
    pkt = BITS * frame_bytes
    cap, line = capacity_bps / pkt, p.line_rate_bps / pkt
    r_min, r_ai = p.min_rate_bps / pkt, p.ai_rate_bps / pkt
    b_pkts = p.byte_counter_bytes / frame_bytes
    tau, tau_a, timer = p.cnp_interval_s, p.alpha_period_s, p.increase_period_s
    ramp_s = (p.kmax_bytes - p.kmin_bytes) / frame_bytes / line
    dt = min(x for x in (tau / STEPS_PER_INTERVAL, tau_a / STEPS_PER_INTERVAL, ramp_s / 8) if x > 0)
    lag = max(1, round((tau if delay_s is None else delay_s) / dt))
    n_steps = math.ceil(until_s / dt) + 1
    starts = np.asarray(start_s, float)
    n = starts.size
    rc, rt, alpha = np.zeros(n), np.full(n, line), np.ones(n)
    q = 0.0
    rates, alphas, queue = np.zeros((n_steps, n)), np.zeros((n_steps, n)), np.zeros(n_steps)
    for k in range(n_steps):
        now = k * dt
        joining = (starts <= now) & (rc == 0) & (starts > now - dt)
        rc[joining] = line
        on = starts <= now
        rates[k], alphas[k], queue[k] = rc, alpha, q
        past = max(0, k - lag)
        q_then, r_then = queue[past], np.where(on, rates[past], 0.0)
        mark = 0.0 if q_then * frame_bytes <= p.kmin_bytes else (
            1.0 if q_then * frame_bytes > p.kmax_bytes
            else p.pmax * (q_then * frame_bytes - p.kmin_bytes) / (p.kmax_bytes - p.kmin_bytes))  # fmt: skip
        a, b, c, d, e = _terms(mark, r_then, tau, b_pkts, p.fast_recovery_steps, timer)
        alpha_marked = -np.expm1(tau_a * r_then * math.log1p(-mark)) if 0 < mark < 1 else np.full(n, mark)
        d_alpha = p.g / tau_a * (alpha_marked - alpha)
        d_rt = -(rt - rc) * a / tau + r_ai * r_then * (c + e)
        d_rc = -rc * alpha * a / (2 * tau) + (rt - rc) / 2 * r_then * (b + d)
        alpha = np.where(on, np.clip(alpha + dt * d_alpha, 0.0, 1.0), alpha)
        rt = np.where(on, np.clip(rt + dt * d_rt, r_min, line), rt)
        rc = np.where(on, np.clip(rc + dt * d_rc, r_min, line), rc)
        q = max(0.0, q + dt * (float(rc[on].sum()) - cap))
    t: F64 = np.arange(n_steps, dtype=np.float64) * dt
    return FluidTrace(t, rates * pkt, alphas, queue * frame_bytes, dt)


def settled_after(t_s: F64, gap: F64, within: float = 0.1) -> float | None:
    """The first time in `t_s` after which `gap` stays at or below `within` to the end (the first sample's
    time if it always is); None: it is above `within` at the end."""
    outside = np.flatnonzero(gap > within)
    if outside.size == 0:
        return float(t_s[0]) if t_s.size else None
    last = int(outside[-1])
    return None if last + 1 >= t_s.size else float(t_s[last + 1])


def settled_s(t_s: F64, a: F64, b: F64, start_s: float, within: float = 0.1) -> float | None:
    """How long after `start_s` the rates `a` and `b` come within `within` of each other (relative to the
    faster) and stay there to the end of the trace; None: they do not."""
    keep = t_s >= start_s
    gap = np.abs(a[keep] - b[keep]) / np.maximum(np.maximum(a[keep], b[keep]), 1e-300)
    at = settled_after(t_s[keep], gap, within)
    return None if at is None else at - start_s


def smoothed_gap(a_runs: F64, b_runs: F64, window: int) -> F64:
    """|Ā − B̄| / max(Ā, B̄) of two flows' rates on a common grid: `a_runs`, `b_runs` are (runs, samples)
    (or one run), Ā and B̄ the mean over runs, each a centred moving average over `window` samples (the
    result has `samples - window + 1` values, the k-th centred on sample k + window // 2).  Averaging the
    runs first is what a mean-field model predicts: one run's rates wander around it (docs/congestion.md)."""
    if window < 1:
        raise ValueError("window must be at least one sample")
    a, b = np.atleast_2d(a_runs).mean(axis=0), np.atleast_2d(b_runs).mean(axis=0)
    kernel = np.ones(window) / window
    ma, mb = np.convolve(a, kernel, mode="valid"), np.convolve(b, kernel, mode="valid")
    gap: F64 = np.abs(ma - mb) / np.maximum(np.maximum(ma, mb), 1e-300)
    return gap


def convergence_figures(
    t_s: F64, a_runs: F64, b_runs: F64, window: int, within: float = 0.1
) -> dict[str, float | list[float] | None]:
    """Two flows' rates on the grid `t_s` (seconds since the second started; `a_runs`, `b_runs` as in
    `smoothed_gap`): when their `window`-sample averages, over the runs, come within `within` of each
    other for good (`settled_s`), and the gap every `window` samples (`gaps`)."""
    gap = smoothed_gap(a_runs, b_runs, window)
    centres = t_s[window // 2 : window // 2 + gap.size]
    return {
        "settled_s": settled_after(centres, gap, within),
        "gaps": [round(float(g), 3) for g in gap[::window]],
    }


def predicted_convergence_s(
    p: DcqcnParams,
    capacity_bps: float,
    head_start_s: float,
    within: float = 0.1,
    frame_bytes: int = 1082,
    horizon_periods: int = 20_000,
) -> float | None:
    """Two flows at line rate into one link, the second `head_start_s` after the first: how long after it
    starts the fluid model's rates are within `within` of each other for good (None: not within
    `horizon_periods` timer periods of it)."""
    until = head_start_s + horizon_periods * p.increase_period_s
    trace = solve(p, capacity_bps, [0.0, head_start_s], until, frame_bytes)
    return settled_s(trace.t_s, trace.rate_bps[:, 0], trace.rate_bps[:, 1], head_start_s, within)


__all__ = [
    "FluidTrace",
    "convergence_figures",
    "predicted_convergence_s",
    "settled_after",
    "settled_s",
    "smoothed_gap",
    "solve",
]
