"""The pieces of a DCQCN run (`flowsim.ccsim`): what it is given (`CcSetup`: the controller's parameters,
each NIC's line rate, the time step), what it reports (`CcStats`, the `cc` block of a policy's summary),
what it refuses (`check_supported`), and how a NIC shares its line rate among its QPs (`waterfill`).
Pure numpy, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.sm.policies import PolicyParams
from flowsim.network import F64, I64, SimInputError
from flowsim.policies import sim_policies
from flowsim.workload import Workload
from traffic.dcqcn import DcqcnParams

BITS = 8.0
#: A queue filling at a NIC's line rate crosses the marking ramp (Kmin..Kmax) in at least this many steps.
RAMP_STEPS = 8
#: The time step follows short messages down to this fraction of the step the timers and the ramp ask for.
MESSAGE_FLOOR = 16
#: Rounds of the NIC water-filling per step (exact after as many rounds as distinct demands on a NIC).
WATERFILL_ROUNDS = 8
#: A run needing more steps than this is refused (the default; `CcSetup.max_steps`).
MAX_STEPS = 5_000_000
#: Bytes per packet on the wire when a job does not say (1024-byte RDMA WRITEs, `traffic.wire`).
DEFAULT_FRAME_BYTES = 1082


@dataclass(frozen=True)
class CcSetup:
    """What the DCQCN run needs beyond the workload.  `params` holds the timers and the marking profile,
    at the run's link speeds (`DcqcnParams.scaled`); `line_bps` every host endpoint's NIC line rate (its
    QPs' highest rate).  `enabled=False` runs the same fluid model with the controllers off: RoCE senders
    open-loop at their pace, as `cc: none` makes the emulator's senders."""

    params: DcqcnParams
    line_bps: F64
    enabled: bool = True
    #: Per job: bytes per RoCE packet on the wire (what marks and CNPs count).
    frame_bytes: Mapping[int, int] = field(default_factory=dict)
    #: Jobs that are incasts (their senders' fairness is reported).
    incast_jobs: frozenset[int] = frozenset()
    dt_s: float | None = None
    max_steps: int = MAX_STEPS

    def step_s(self, message_s: F64 | None = None) -> float:
        """A quarter of the shortest timer, and at most 1/RAMP_STEPS of the marking ramp at line rate; with
        `message_s` (each message's time at its highest rate), also at most half the shortest tenth of
        them, but never below 1/MESSAGE_FLOOR of the ramp's bound (a trace of single packets at full speed
        would otherwise take billions of steps): messages shorter than a step are approximated
        (`flowsim.ccsim`)."""
        if self.dt_s is not None:
            return self.dt_s
        p = self.params
        timers = min(p.increase_period_s, p.alpha_period_s) / 4
        fastest = float(self.line_bps.max()) / BITS if self.line_bps.size else 0.0
        ramp = (p.kmax_bytes - p.kmin_bytes) / (RAMP_STEPS * fastest) if fastest > 0 else math.inf
        step = min(timers, ramp)
        if message_s is not None and (finite := message_s[np.isfinite(message_s)]).size:
            step = min(step, max(float(np.percentile(finite, 10)) / 2, step / MESSAGE_FLOOR))
        return step


@dataclass
class CcStats:
    """What the controllers and the queues did (member-weighted totals)."""

    cc: str
    dt_s: float
    steps: int = 0
    jumped_steps: int = 0
    cnps: float = 0.0
    cuts: float = 0.0
    marked_packets: float = 0.0
    sent_packets: float = 0.0
    sent_bytes: float = 0.0
    dropped_bytes: float = 0.0
    roce_sent_bytes: float = 0.0
    roce_dropped_bytes: float = 0.0
    peak_queue_bytes: float = 0.0
    peak_queue_link: str | None = None
    buffer_bytes: float | None = None
    bottleneck: dict[str, Any] | None = None
    jain_senders: dict[int, float] = field(default_factory=dict)
    #: Rates (bits/s per member) of every row at `sample_t_s` when sampling was asked for.
    sample_t_s: F64 = field(default_factory=lambda: np.zeros(0))
    sample_rate_bps: F64 = field(default_factory=lambda: np.zeros((0, 0)))
    row_job: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    row_src: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def block(self) -> dict[str, Any]:
        """The `cc` block of a policy's summary."""
        jains = list(self.jain_senders.values())
        return {
            "cc": self.cc,
            "cnps_sent": round(self.cnps),
            "rate_cuts": round(self.cuts),
            "marked_fraction": self.marked_packets / self.sent_packets if self.sent_packets else 0.0,
            "loss_pct": 100.0 * self.dropped_bytes / self.sent_bytes if self.sent_bytes else 0.0,
            "roce_loss_pct": 100.0 * self.roce_dropped_bytes / self.roce_sent_bytes
            if self.roce_sent_bytes
            else 0.0,
            "peak_queue_bytes": self.peak_queue_bytes,
            "peak_queue_link": self.peak_queue_link,
            "buffer_bytes": self.buffer_bytes,
            "bottleneck": self.bottleneck,
            "jain_senders": min(jains) if jains else None,
            "jain_senders_by_job": {str(k): v for k, v in sorted(self.jain_senders.items())},
            "dt_s": self.dt_s,
            "steps": self.steps,
            "jumped_steps": self.jumped_steps,
        }


def check_supported(workload: Workload, policies: list[str], params: PolicyParams) -> None:
    """What the DCQCN model does not run, refused before any work (SimInputError naming `cc`)."""
    if workload.collectives:
        raise SimInputError(
            f"dcqcn: {workload.collectives[0].name} runs in steps; the simulator's DCQCN model runs posted "
            "and one-phase jobs (give the collective `schedule: one-phase`, or cc: none)",
            "cc",
        )
    if workload.faults:
        raise SimInputError("dcqcn: the simulator's DCQCN model does not reroute at faults yet (cc: none "
                            "runs them)", "cc")  # fmt: skip
    registry = sim_policies()
    for name in policies:
        policy = registry.create(name, params)
        if policy.adaptive or name == "local-ar":
            raise SimInputError(
                f"dcqcn: policy {name} moves traffic while it runs, which the simulator's DCQCN model does "
                "not follow yet (static, ecmp and spray run under it)",
                "cc",
            )


def water_levels(demand: F64, mult: F64, group: I64, cap: F64, n_groups: int) -> F64:
    """The level of every group (a NIC, a pacer) serving its QPs round robin: each QP of group g gets
    min(its demand, level[g]), the level as high as the group's capacity allows (members counted `mult`
    times; -1: in no group); inf where a group is not saturated.  Approached from below (Newton on a
    concave function), so a group never exceeds its capacity."""
    level = np.full(n_groups, np.inf)
    has = group >= 0
    if not has.any():
        return level
    g, d, m = group[has], demand[has], mult[has]
    want = np.bincount(g, weights=m * d, minlength=n_groups)
    over = want > cap * (1 + 1e-12)
    if not over.any():
        return level
    members = np.bincount(g, weights=m, minlength=n_groups)
    level[over] = cap[over] / np.maximum(members[over], 1e-300)
    for _ in range(WATERFILL_ROUNDS):
        lv = level[g]
        served = np.bincount(g, weights=m * np.minimum(d, lv), minlength=n_groups)
        rising = np.bincount(g, weights=m * (d > lv), minlength=n_groups)
        gap = np.divide(cap - served, rising, out=np.zeros(n_groups), where=over & (rising > 0))
        if not (gap > cap * 1e-9).any():
            break
        level += gap
    return level


def waterfill(demand: F64, mult: F64, group: I64, cap: F64, n_groups: int) -> F64:
    """Rates of QPs served round robin by their group: min(demand, the group's level) (`water_levels`)."""
    level = water_levels(demand, mult, group, cap, n_groups)
    out: F64 = np.where(group >= 0, np.minimum(demand, level[np.maximum(group, 0)]), demand)
    return out


def convergence_s(
    t_s: F64, rate_a: F64, rate_b: F64, start_s: float, window_s: float, hold_s: float, within: float = 0.1
) -> float | None:
    """How long after `start_s` two flows' rates, averaged over windows of `window_s`, come within
    `within` of each other (relative to the faster) and stay there for `hold_s`; None: not in the run."""
    keep = t_s >= start_s
    t, a, b = t_s[keep], rate_a[keep], rate_b[keep]
    if t.size < 2:
        return None
    index = np.floor((t - start_s) / window_s).astype(np.int64)
    n = int(index.max()) + 1
    count = np.bincount(index, minlength=n)
    full = count > 0
    mean_a = np.bincount(index, weights=a, minlength=n)[full] / count[full]
    mean_b = np.bincount(index, weights=b, minlength=n)[full] / count[full]
    gap = np.abs(mean_a - mean_b) / np.maximum(np.maximum(mean_a, mean_b), 1e-300)
    hold = max(1, math.ceil(hold_s / window_s))
    starts = np.flatnonzero(full)
    for i in range(gap.size - hold + 1):
        if (gap[i : i + hold] <= within).all():
            return float(starts[i] * window_s)
    return None


__all__ = [
    "BITS",
    "DEFAULT_FRAME_BYTES",
    "MAX_STEPS",
    "RAMP_STEPS",
    "CcSetup",
    "CcStats",
    "check_supported",
    "convergence_s",
    "water_levels",
    "waterfill",
]
