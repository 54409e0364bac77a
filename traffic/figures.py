"""Job- and flow-level figures of a run, defined once for the emulator and the flow-level simulator.

The question a user brings is "how much later does my job finish?", so jobs lead:

* **completion_s** of a job: when its last byte is delivered, from its first post.  Open-loop senders (the
  emulator's, and timed UDP flows everywhere) do not slow down under congestion, they lose packets; a flow
  that delivered only part of what it offered is counted as if the rest had to be delivered at the goodput
  it got: its *effective* FCT is `fct x offered / delivered` — exactly what a closed-loop (fluid) flow
  would take.  A job run in steps takes the sum over its steps of the step's slowest effective FCT (each
  measured from when its rank entered the step); a one-phase collective its last effective delivery.
  Jobs without a barrier between their flows — *timed* open-loop UDP flows, and *posted* messages (a
  trace, KV-cache transfers) — take their span (first post to last delivery) x the job's offered /
  delivered bytes: which of their flows a drop-tail queue starves is chance (the emulator's to show, not
  a fluid model's: the per-flow FCT slowdowns keep it).
* **slowdown** of a job: completion / completion of the same traffic on a non-blocking fabric with the same
  NICs (and the same pacing) — the reference run the simulator computes.  The headline `slowdown` is the
  slowest job's.
* **FCT slowdown** of a flow: its effective FCT / the FCT it would have alone on an idle fabric with its
  NICs and pacing (the flow-completion literature's normalisation), summarised as p50/p99 overall and by
  size bucket (`SIZE_BUCKETS`, payload bytes).
* **busbw_GBps** as nccl-tests prints it (GB/s = 1e9 bytes/s): per-rank size / completion x bus factor;
  **goodput_gbps**: delivered payload bits / the run's span (first post to last delivery), in Gb/s.
* **throughput_ratio** (kept, labelled for what it is: a *mean-rate* ratio): sum over flows of delivered
  bytes / FCT, over the same sum on the non-blocking fabric.  Short flows that finish early lift it, so it
  can read 1.0 while a job finishes twice as late; it never leads.

Inputs are columns (numpy arrays) so that millions of simulated flows (a class counted `mult` times) and a
few hundred emulated ones go through the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: The job-level figures of a run, in the order both instruments' summaries lead with them.
JOB_FIELDS = (
    "slowdown",
    "completion_s",
    "goodput_gbps",
    "fct_slowdown_p50",
    "fct_slowdown_p99",
    "busbw_GBps",
    "throughput_ratio",
)

#: Size buckets of the FCT slowdown (payload bytes, lower bound inclusive).
SIZE_BUCKETS: tuple[tuple[float, str], ...] = (
    (0.0, "<10KB"),
    (1e4, "10KB-100KB"),
    (1e5, "100KB-1MB"),
    (1e6, "1MB-10MB"),
    (1e7, ">=10MB"),
)


@dataclass(frozen=True)
class Flows:
    """What happened to every flow of a run (one row per flow, or per class of `mult` identical flows)."""

    job: I64
    step: I64
    offered: F64  # payload bytes the flow had to deliver
    delivered: F64  # payload bytes it delivered
    start_s: F64  # posted, from the run's start
    fct_s: F64  # measured: post to last byte delivered (timed flows: their duration)
    alone_s: F64  # FCT alone on an idle fabric with its NICs and pacing
    mult: F64

    @classmethod
    def empty(cls) -> Flows:
        z = np.zeros(0)
        return cls(z.astype(np.int64), z.astype(np.int64), z, z, z, z, z, z)

    @classmethod
    def concat(cls, parts: Sequence[Flows]) -> Flows:
        parts = [p for p in parts if p.job.size]
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))

    @property
    def effective_fct_s(self) -> F64:
        """FCT as if what was lost had to be delivered at the goodput the flow got."""
        ratio = np.where(self.delivered > 0, self.offered / np.maximum(self.delivered, 1e-300), np.inf)
        return np.where(self.offered > 0, self.fct_s * np.maximum(ratio, 1.0), self.fct_s)


def weighted_percentile(values: F64, weights: F64, q: float) -> float | None:
    """The q-th percentile (0..100) of values counted `weights` times (inverse of the weighted CDF)."""
    keep = np.isfinite(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return None
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    at = min(int(np.searchsorted(cum, q / 100.0 * cum[-1], side="left")), v.size - 1)
    return float(v[at])


def fct_slowdowns(flows: Flows) -> dict[str, Any]:
    """p50/p99 of effective FCT / alone FCT, overall and by size bucket."""
    ok = (flows.alone_s > 0) & np.isfinite(flows.alone_s)
    slow = np.full(flows.job.size, np.inf)
    slow[ok] = flows.effective_fct_s[ok] / flows.alone_s[ok]
    slow = np.maximum(slow, 1.0 - 1e-9) if slow.size else slow
    out: dict[str, Any] = {
        "p50": weighted_percentile(slow, flows.mult, 50),
        "p99": weighted_percentile(slow, flows.mult, 99),
        "by_size": {},
    }
    edges = [b for b, _ in SIZE_BUCKETS] + [math.inf]
    for (low, name), high in zip(SIZE_BUCKETS, edges[1:], strict=True):
        sel = (flows.offered >= low) & (flows.offered < high)
        if sel.any():
            out["by_size"][name] = {
                "flows": float(flows.mult[sel].sum()),
                "p50": weighted_percentile(slow[sel], flows.mult[sel], 50),
                "p99": weighted_percentile(slow[sel], flows.mult[sel], 99),
            }
    return out


def job_completion(flows: Flows, job: int, stepped: bool, aggregate: bool = False) -> float | None:
    """A job's effective completion from its flows (see the module doc); None if it has no flows."""
    sel = flows.job == job
    if not sel.any():
        return None
    if aggregate:
        mine = Flows(*(getattr(flows, f)[sel] for f in Flows.__dataclass_fields__))
        offered = float((mine.mult * mine.offered).sum())
        delivered = float((mine.mult * mine.delivered).sum())
        return _span(mine) * offered / delivered if delivered > 0 else math.inf
    eff = flows.effective_fct_s[sel]
    if not np.isfinite(eff).all():
        return math.inf
    if stepped:
        steps, inverse = np.unique(flows.step[sel], return_inverse=True)
        worst = np.zeros(steps.size)
        np.maximum.at(worst, inverse.ravel(), eff)
        return float(worst.sum())
    start = flows.start_s[sel]
    return float((start + eff).max() - start.min())


def aggregate_rate(flows: Flows) -> float:
    """Sum over flows of delivered payload bytes / FCT (bytes/s), members counted."""
    ok = flows.fct_s > 0
    return float((flows.mult[ok] * flows.delivered[ok] / flows.fct_s[ok]).sum())


@dataclass(frozen=True)
class JobInfo:
    index: int
    label: str
    stepped: bool
    #: (kind, ranks, per-rank bytes) when scored like nccl-tests.
    collective: tuple[str, int, int] | None = None
    bus_factor: float | None = None
    #: Open-loop flows sent for a duration (their completion is always derived from the flows).
    timed: bool = False
    #: Messages posted at their times (a trace, KV-cache transfers): no barrier between them.
    posted: bool = False


def summarise(
    flows: Flows,
    jobs: Sequence[JobInfo],
    reference: Mapping[str, Any] | None,
    completions: Mapping[int, float | None] | None = None,
) -> dict[str, Any]:
    """The leading figures of one run.  `reference`: {"jobs": {index: ideal completion s}, "aggregate_rate":
    bytes/s} of the non-blocking run (None: slowdowns and the ratio are unknown); `completions`: job
    completions the instrument measured itself (the simulator's), else they are derived from the flows."""
    rows = []
    ideal = {int(k): v for k, v in (reference or {}).get("jobs", {}).items()}
    for job in jobs:
        done = (completions or {}).get(job.index) if completions is not None else None
        if done is None:
            done = job_completion(flows, job.index, job.stepped, job.timed or job.posted)
        base = ideal.get(job.index)
        row: dict[str, Any] = {
            "job": job.index,
            "name": job.label,
            "completion_s": _num(done),
            "ideal_completion_s": _num(base),
            "slowdown": _num(done / base) if done is not None and base else None,
        }
        if job.collective is not None and done and math.isfinite(done):
            kind, n, size = job.collective
            algbw = size / done / 1e9
            row.update(kind=kind, ranks=n, size_bytes=size, algbw_GBps=algbw,
                       busbw_GBps=algbw * (job.bus_factor or 1.0))  # fmt: skip
        rows.append(row)
    slowdowns = [r["slowdown"] for r in rows]
    known = [s for s in slowdowns if s is not None]
    completions_all = [r["completion_s"] for r in rows]
    span = _span(flows)
    delivered = float((flows.mult * flows.delivered).sum())
    offered = float((flows.mult * flows.offered).sum())
    ideal_rate = (reference or {}).get("aggregate_rate")
    first = next((r for r in rows if "busbw_GBps" in r), None)
    fct = fct_slowdowns(flows)
    return {
        "slowdown": max(known) if known and len(known) == len(slowdowns) else None,
        "completion_s": max(completions_all) if completions_all and None not in completions_all else None,
        "goodput_gbps": delivered * 8 / span / 1e9 if span else None,
        "fct_slowdown_p50": fct["p50"],
        "fct_slowdown_p99": fct["p99"],
        "busbw_GBps": first["busbw_GBps"] if first else None,
        "throughput_ratio": aggregate_rate(flows) / ideal_rate if ideal_rate else None,
        "delivered_pct": 100.0 * delivered / offered if offered else None,
        "jobs": rows,
        "fct_slowdown_by_size": fct["by_size"],
    }


def _span(flows: Flows) -> float:
    ok = np.isfinite(flows.fct_s) & (flows.delivered > 0)
    if not ok.any():
        return 0.0
    return float((flows.start_s[ok] + flows.fct_s[ok]).max() - flows.start_s.min())


def _num(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


__all__ = [
    "JOB_FIELDS",
    "SIZE_BUCKETS",
    "Flows",
    "JobInfo",
    "aggregate_rate",
    "fct_slowdowns",
    "job_completion",
    "summarise",
    "weighted_percentile",
]
