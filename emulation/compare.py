"""`fabriclab compare`: one scenario run once per routing policy — same seed, traffic and faults — on the
emulated fabric, and the figures that tell the policies apart.

Each policy gets a fresh controller (started with that policy) and a fresh Mininet fabric, exactly as
`scenario run` does (`emulation.runner`); only the policy differs, and the senders follow it (one seeded
source port per flow, or another port per packet under a per-packet policy).  Every run counts the
emulator's own drops (`emulation.headroom`), so a result the emulator distorted says so.

Per policy (`figures`): completion time, algbw/busbw of collectives, per-flow goodput and flow completion
times (p50/p99), max and mean link utilisation, flows per link (exact, from the controller's placement of
each flow's source port), reordered and lost packets, adaptive moves, and the headroom verdict.  The plots
and the report are `emulation.compare_report`'s.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from emulation import rocerun
from emulation.runner import Progress, run_scenario
from labspec import workplan
from labspec.scenario import Scenario
from labspec.workplan import Job
from traffic.figures import JOB_FIELDS, Flows, JobInfo, summarise
from traffic.patterns import bus_factor

#: A switch-to-switch link direction below this utilisation (mean over the run) counts as idle.
IDLE_UTIL = 0.02


# --- figures -----------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _links_of(path: str) -> list[str]:
    """Switch-to-switch link directions of a path as the runner records it ("h1:1 1>leaf1>3 1>agg1>3 ...")."""
    hops = [h.split(">") for h in path.split() if h.count(">") == 2]
    return [f"{a[1]}:{a[2]}" for a, _ in itertools.pairwise(hops)]


def flows_of(rep: dict[str, Any], jobs: list[Job], nic_bps: dict[str, float | None]) -> Flows:
    """One repetition's flows and RoCE messages as `traffic.figures.Flows` (payload bytes, seconds from the
    traffic's start): what the simulator records of its flows, measured."""
    by_job = {j.index: j for j in jobs}
    job, step, offered, delivered, start, fct, alone = [], [], [], [], [], [], []
    for f in rep["flows"]:
        job.append(int(f.get("job", 0)))
        step.append(0)
        size = float(f.get("size_bytes", 0))
        offered.append(int(f["sent"]) * size)
        delivered.append(int(f["received"]) * size)
        start.append(float(f.get("start_s", 0.0)))
        duration = float(f.get("duration_s") or 0.0)
        fct.append(float(f["fct_s"]) if f.get("fct_s") is not None else duration)
        alone.append(duration)
    for m in rep.get("roce_messages", []):
        j = by_job.get(int(m["job"]))
        if j is None or j.frame_bytes is None:
            continue
        job.append(j.index)
        step.append(int(m["step"]))
        payload = float(m["payload_bytes"])
        offered.append(payload)
        delivered.append(payload * int(m["received"]) / max(1, int(m["packets"])))
        begin = m["first_sent_s"] if j.schedule == "steps" and m["first_sent_s"] is not None else m["post_s"]
        start.append(float(begin))
        fct.append(float(m["done_s"]) - float(begin) if m["done_s"] is not None else math.inf)
        bits = 8.0 * m["packets"] * j.frame_bytes
        rate = min(j.rate_pps * 8.0 * j.frame_bytes if j.rate_pps else math.inf,
                   nic_bps.get(m["src"]) or math.inf, nic_bps.get(m["dst"]) or math.inf)  # fmt: skip
        alone.append(bits / rate if math.isfinite(rate) else math.nan)
    return Flows(
        np.array(job, dtype=np.int64),
        np.array(step, dtype=np.int64),
        np.array(offered),
        np.array(delivered),
        np.array(start),
        np.array(fct),
        np.array(alone),
        np.ones(len(job)),
    )


def job_infos(jobs: list[Job]) -> list[JobInfo]:
    return [JobInfo(j.index, j.label, j.schedule == "steps", j.collective,
                    bus_factor(j.collective[0], j.collective[1]) if j.collective else None,
                    timed=j.schedule == "timed", posted=j.schedule == "posted") for j in jobs]  # fmt: skip


def figures(
    summary: dict[str, Any], scenario: Scenario | None = None, reference: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The comparison's figures of one policy's run (all repetitions together): first the job-level
    figures the simulator writes too (`traffic.figures`, with the non-blocking `reference` the simulator
    computed for the same scenario), then what only a packet emulator measures."""
    flows = [f for rep in summary["repetitions"] for f in rep["flows"]]
    collectives = [c for rep in summary["repetitions"] for c in rep["collectives"]]
    messages = [m for rep in summary["repetitions"] for m in rep.get("roce_messages", [])]
    reps = summary["repetitions"]
    goodput = [float(f["goodput_mbps"]) for f in flows]
    fcts = [float(f["fct_s"]) for f in flows if f.get("fct_s") is not None]
    fcts += [t for c in collectives for t in c.get("qp_fct_s", [])]
    sent = sum(int(f["sent"]) for f in flows) + sum(int(m["sent"]) for m in messages)
    lost = sum(int(f["lost"]) for f in flows) + sum(int(m["sent"]) - int(m["received"]) for m in messages)
    reordered = sum(int(f["out_of_order"]) for f in flows) + sum(int(c["out_of_order"]) for c in collectives)
    util_means: list[float] = []
    for rep in reps:
        groups = rep["utilisation"].get("groups", {})
        for name, series in rep["utilisation"]["links"].items():
            if groups.get(name, "").startswith("host"):
                continue  # hosts' own links: what they send, not how the fabric spreads it
            busy = series[1:-1] or series  # the first and last interval straddle the traffic's edges
            if busy:
                util_means.append(statistics.fmean(busy))
    placed = Counter(link for f in flows if f["path"] != "sprayed" for link in _links_of(f["path"]))
    headroom = [rep.get("headroom") for rep in reps if rep.get("headroom")]
    moves = sum(
        len(e.get("moves") or [None]) for rep in reps for e in rep["events"] if e["kind"] == "adaptive_move"
    )
    head = _job_figures(reps, scenario, reference)
    result: dict[str, Any] = {
        **{k: head.get(k) for k in JOB_FIELDS},
        "max_link_util": round(max(util_means, default=0.0), 4),
        "mean_link_util": round(statistics.fmean(util_means), 4) if util_means else 0.0,
        "loss_pct": round(100.0 * lost / sent, 4) if sent else 0.0,
        "adaptive_moves": moves,
        "jobs": head.get("jobs", []),
        "fct_slowdown_by_size": head.get("fct_slowdown_by_size", {}),
        "algbw_GBps": _mean([c["algbw_GBps"] for c in collectives]),
        "aggregate_goodput_mbps": round(sum(goodput) / max(1, len(reps)), 3),
        "goodput_mbps": {
            "min": min(goodput, default=None),
            "p50": _percentile(goodput, 0.5),
            "max": max(goodput, default=None),
            "per_flow": {f["name"]: f["goodput_mbps"] for f in reps[0]["flows"]} if reps else {},
        },
        "fct_p50_s": _percentile(fcts, 0.5),
        "fct_p99_s": _percentile(fcts, 0.99),
        "fct_s": sorted(fcts),
        "idle_links": sum(1 for u in util_means if u < IDLE_UTIL),
        "links_measured": len(util_means),
        "flows_per_link": {
            "max": max(placed.values(), default=0),
            "links_with_2plus_flows": sum(1 for n in placed.values() if n >= 2),
            "placed_flows": sum(1 for f in flows if f["path"] != "sprayed"),
            "sprayed_flows": sum(1 for f in flows if f["path"] == "sprayed"),
        },
        "reordered_packets": reordered,
        "lost_packets": lost,
        "emulator_overloaded": any(h["emulator_overloaded"] for h in headroom) if headroom else None,
        "headroom": headroom,
        "cc": cc_figures(reps),
    }
    return result


def cc_figures(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Congestion control over all repetitions: CNPs, cuts, marked fractions (at the receivers and at the
    switches), the deepest marked queue, and how many ports marked."""
    parts = [rep.get("cc") or {"cc": "none"} for rep in reps]
    if not parts or parts[0].get("cc") != "dcqcn":
        return {"cc": "none"}
    total = {k: sum(int(p.get(k, 0)) for p in parts) for k in ("cnps_sent", "cnps_received", "rate_cuts",
                                                                 "ce_received", "data_received")}  # fmt: skip
    marks = [p.get("marking") or {} for p in parts]
    ect = sum(int(m.get("ect_packets", 0)) for m in marks)
    switch_marked = sum(int(m.get("marked", 0)) for m in marks)
    return {
        "cc": "dcqcn",
        **total,
        "marked_fraction": round(total["ce_received"] / total["data_received"], 6)
        if total["data_received"]
        else None,
        "switch_marked": switch_marked,
        "switch_marked_fraction": round(switch_marked / ect, 6) if ect else None,
        "peak_queue_bytes": max((int(m.get("peak_queue_bytes", 0)) for m in marks), default=0),
        "ports_with_marks": max((int(m.get("ports_with_marks", 0)) for m in marks), default=0),
        "marking_ports": max((int(m.get("marking_ports", 0)) for m in marks), default=0),
    }


def _job_figures(
    reps: list[dict[str, Any]], scenario: Scenario | None, reference: dict[str, Any] | None
) -> dict[str, Any]:
    """`traffic.figures.summarise` per repetition; numbers averaged over repetitions."""
    if scenario is None or not reps:
        return {}
    jobs = workplan.jobs(scenario)
    nic = rocerun.prepare(scenario).nic_bps if any(j.roce for j in jobs) else {}
    per_rep = [summarise(flows_of(rep, jobs, nic), job_infos(jobs), reference) for rep in reps]
    out: dict[str, Any] = dict(per_rep[0])
    for key in JOB_FIELDS:
        values = [r[key] for r in per_rep]
        out[key] = statistics.fmean(values) if all(isinstance(v, int | float) for v in values) else None
    return out


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 6) if values else None


# --- running -----------------------------------------------------------------------------------------------


def run_compare(
    scenario: Scenario,
    policies: list[str],
    out_dir: Path,
    progress: Progress | None = None,
    capacity: dict[str, Any] | None = None,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `scenario` once per policy (fresh controller and fabric each) and write the comparison.
    `reference`: the non-blocking run of the same scenario ({"jobs": {index: completion s},
    "aggregate_rate": bytes/s}, as `flowsim.metrics.reference` gives it) for slowdowns and ratios."""
    from emulation.compare_report import write_comparison  # noqa: PLC0415 - matplotlib only when writing

    progress = progress or (lambda fraction, what: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    for index, policy in enumerate(policies):

        def step(fraction: float, what: str, index: int = index, policy: str = policy) -> None:
            progress((index + fraction) / len(policies), f"{policy}: {what}")

        variant = scenario.with_policy(policy)
        runs[policy] = run_scenario(variant, out_dir / policy, step, capacity, write=False)
    summary = {
        "scenario": scenario.spec.name,
        "file": str(scenario.file),
        "fabric": scenario.fabric.summary(),
        "seed": scenario.spec.seed,
        "scale": scenario.spec.scale,
        "duration_s": scenario.spec.duration_s,
        "cc": scenario.spec.cc,
        "repetitions": scenario.spec.repetitions,
        "engine": scenario.spec.controller.engine,
        "reference": reference,
    }
    by_policy = {
        p: {"controller": runs[p]["controller"], **figures(runs[p], scenario, reference)} for p in policies
    }
    summary["policies"] = by_policy
    summary["emulator_overloaded"] = any(f["emulator_overloaded"] for f in by_policy.values())
    write_comparison(summary, runs, out_dir)
    progress(1.0, "done")
    return summary


__all__ = ["cc_figures", "figures", "run_compare"]
