"""What a DCQCN run (`flowsim.ccsim`) hands back: its flows, groups and link counters as the engine's
`SimResult`, so the figures are computed as for max-min (`flowsim.metrics`, `traffic.figures`), and what
the controllers and queues did (`CcStats`).  Pure numpy, no I/O."""

from __future__ import annotations

import math

import numpy as np

from flowsim.ccmodel import BITS, CcStats
from flowsim.ccsim import CcSimulator
from flowsim.dcqcn import jain
from flowsim.network import I64
from flowsim.pool import GroupResult, SimResult
from traffic.figures import Flows


def run_cc(run: CcSimulator, until_s: float = math.inf) -> tuple[SimResult, CcStats]:
    """Run `run` to the last delivery (or `until_s`) and collect its figures."""
    run.advance(until_s)
    return collect(run)


def collect(run: CcSimulator) -> tuple[SimResult, CcStats]:
    """A finished run as the engine's `SimResult` (what `flowsim.metrics.summarise` scores), and its
    `CcStats`."""
    done = np.concatenate(run.finished) if run.finished else np.zeros(0, dtype=np.int64)
    timed = run.timed[done]
    payload = run.payload[done]
    offered = np.where(timed, run.line[done] / BITS * (run.end_s[done] - run.posted[done]), run.size[done])
    delivered = np.minimum(run.delivered[done], offered)
    flows = Flows(run.job[done], np.zeros(done.size, dtype=np.int64), offered * payload,
                  delivered * payload, run.posted[done], run.done_at[done] - run.posted[done],
                  run.alone[done], run.mult[done])  # fmt: skip
    groups = [
        GroupResult(g.name, math.inf, None, g.collective, g.bus_factor, job=g.job, timed=g.timed)
        for g in run.sim.groups
    ]
    for bi, g in enumerate(groups):
        mine = np.flatnonzero(run.owner == bi)
        if mine.size:
            g.start_s = float(run.posted[mine].min())
            if np.isfinite(run.done_at[mine]).all():
                g.end_s = float(run.done_at[mine].max())
    end = float(np.nanmax(run.done_at)) if np.isfinite(run.done_at).any() else run.now
    stats = dict(run.sim.stats)
    stats.update(steps=float(run.steps), jumped_steps=float(run.jumped))
    result = SimResult(
        policy=run.cfg.policy,
        end_s=max(end, run.now),
        groups=groups,
        flows=flows,
        fabric_links=run.fabric_ids,
        link_bytes=(run.departed + run.queue)[run.fabric_ids],  # what is still queued leaves too
        heat=run.heat,
        bin_s=run.bin_s,
        stats=stats,
        unfinished=int(run.mult.sum() - run.mult[done].sum()),
        wide_sets=run.sim.place.tables.wide,
    )
    return result, _stats(run, done)


def _stats(run: CcSimulator, done: I64) -> CcStats:
    m = run.mult
    r = run.roce
    stats = CcStats("dcqcn" if run.setup.enabled else "none (open-loop senders)", run.dt, run.steps,
                    run.jumped)  # fmt: skip
    stats.cnps = float((m * run.cnps).sum())
    stats.cuts = float((m * run.cuts).sum())
    stats.marked_packets = float((m * run.marked)[r].sum())
    stats.sent_packets = float((m * run.packets)[r].sum())
    stats.sent_bytes = float((m * run.sent).sum())
    stats.dropped_bytes = float((m * run.dropped).sum())
    stats.roce_sent_bytes = float((m * run.sent)[r].sum())
    stats.roce_dropped_bytes = float((m * run.dropped)[r].sum())
    stats.buffer_bytes = run.work.buffer_bytes
    if run.peak.size and run.peak.max() > 0:
        link = int(np.argmax(run.peak))
        stats.peak_queue_bytes = float(run.peak[link])
        stats.peak_queue_link = _name(run, link)
        cap = float(run.cap_bytes[link])
        span = _span(run, run.now + float(run.queue[link]) / cap if cap > 0 else 0.0)
        stats.bottleneck = {
            "link": stats.peak_queue_link,
            "capacity_gbps": float(run.sim.cap[link]),
            "utilisation": float((run.departed[link] + run.queue[link]) / (cap * span))
            if span > 0 and cap > 0
            else None,
        }
    for job in sorted(run.setup.incast_jobs):  # Jain's index needs two senders at least
        mine = done[run.job[done] == job]
        took = run.sent_at[mine] - run.began[mine]
        if mine.size > 1 and (took > 0).all():
            stats.jain_senders[job] = jain(run.sent[mine] / took)
    if run.samples:
        stats.sample_t_s = np.array([t for t, _ in run.samples])
        stats.sample_rate_bps = np.stack([x for _, x in run.samples])
    stats.row_job = run.job.astype(np.int64)
    stats.row_src = run.src.astype(np.int64)
    return stats


def _span(run: CcSimulator, drained_s: float) -> float:
    """From the first start to the last delivery (or to when a link's queue has drained)."""
    started = run.began[np.isfinite(run.began)]
    ended = run.done_at[np.isfinite(run.done_at)]
    if not (started.size and ended.size):
        return 0.0
    return float(max(float(ended.max()), drained_s) - started.min())


def _name(run: CcSimulator, link: int) -> str:
    sim, net = run.sim, run.net
    if link < net.n_links:
        return net.link_name(link)
    if sim.base_down <= link < sim.base_down + net.subnet.n_switches:
        return f"{net.subnet.switch_names[link - sim.base_down]}->hosts (bundle)"
    return f"link {link}"


__all__ = ["collect"]
