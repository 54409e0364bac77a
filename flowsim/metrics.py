"""Figures of a simulated run (the summary schema the emulator's `compare` writes too), and how far a
simulation and an emulation of the same scenario are apart (`comparison.json`).

Per policy (`summary.json`: `{"policies": {NAME: {...}}}`), job-level figures first (`traffic.figures`):

* `slowdown` — the slowest job's completion / its completion on a non-blocking fabric with the same NICs
  and pacing (the reference run, done every time); `completion_s` — the last job's completion;
* `goodput_gbps` — delivered payload / the run's span; `fct_slowdown_p50`/`_p99` — per flow, FCT over its
  FCT alone, by size bucket in `details.fct_slowdown_by_size`;
* `busbw_GBps` — nccl-tests' bus bandwidth in GB/s (1e9 bytes/s) of the first collective;
* `throughput_ratio` — the *mean-rate* ratio (sum of bytes / FCT over the non-blocking run's): kept for
  what it is; it reads 1.0 while a job finishes late when short flows finish early;
* `max_link_util`, `mean_link_util` — switch-to-switch link directions, bytes / (capacity x run time);
* `loss_pct` — what open-loop (timed) flows offered beyond what they got: the fluid model's loss;
* `adaptive_moves` — slot moves of the controller's `adaptive` (or re-splits of `local-ar`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowsim.engine import BYTES_PER_GBIT, SimResult
from flowsim.network import F64, Network
from flowsim.workload import Workload
from topologies.scale import Scale
from traffic import figures
from traffic.figures import JobInfo, weighted_percentile

FIELDS = (
    *figures.JOB_FIELDS,
    "max_link_util",
    "mean_link_util",
    "loss_pct",
    "adaptive_moves",
)
#: What agreement between the simulator and the emulator is judged on (ordering by the first).
JUDGED = ("slowdown", "completion_s", "goodput_gbps")
TOLERANCE = 0.15


def job_completions(result: SimResult, jobs: Sequence[JobInfo]) -> dict[int, float | None]:
    """Simulated completion of every job that is not timed (timed jobs' come from their flows)."""
    timed = {j.index for j in jobs if j.timed}
    out: dict[int, float | None] = {}
    for g in result.groups:
        if g.job in timed or g.timed:
            continue
        if g.end_s is not None and math.isfinite(g.start_s):
            out[g.job] = max(out.get(g.job) or 0.0, g.end_s - g.start_s)
    return out


def reference(ideal: SimResult, jobs: Sequence[JobInfo]) -> dict[str, Any]:
    """What the non-blocking run gives the figures: per job completion, and the aggregate rate."""
    done = job_completions(ideal, jobs)
    for job in jobs:
        if job.index not in done:
            done[job.index] = figures.job_completion(
                ideal.flows, job.index, job.stepped, job.timed or job.posted
            )
    return {"jobs": done, "aggregate_rate": figures.aggregate_rate(ideal.flows)}


def summarise(result: SimResult, ideal: SimResult, network: Network, workload: Workload) -> dict[str, Any]:
    """One policy's figures (the summary schema) plus details for the report."""
    jobs = workload.job_infos()
    end = result.end_s
    caps = network.cap_gbps[result.fabric_links]
    util = result.link_bytes / np.maximum(caps * BYTES_PER_GBIT * max(end, 1e-300), 1e-300)
    head = figures.summarise(result.flows, jobs, reference(ideal, jobs), job_completions(result, jobs))
    delivered = head.pop("delivered_pct")
    flows = result.flows
    groups = []
    for g in result.groups:
        row: dict[str, Any] = {
            "name": g.name,
            "job": g.job,
            "start_s": _num(g.start_s),
            "end_s": _num(g.end_s),
        }
        if g.skipped_steps:
            row["skipped_steps"] = g.skipped_steps
        groups.append(row)
    return {
        "slowdown": head["slowdown"],
        "completion_s": head["completion_s"],
        "goodput_gbps": head["goodput_gbps"],
        "fct_slowdown_p50": head["fct_slowdown_p50"],
        "fct_slowdown_p99": head["fct_slowdown_p99"],
        "busbw_GBps": head["busbw_GBps"],
        "throughput_ratio": head["throughput_ratio"],
        "max_link_util": float(util.max()) if util.size else 0.0,
        "mean_link_util": float(util.mean()) if util.size else 0.0,
        "loss_pct": max(0.0, round(100.0 - delivered, 6)) if delivered is not None else None,
        "adaptive_moves": int(result.stats.get("moves", 0)),
        "jobs": head["jobs"],
        "details": {
            "fct_slowdown_by_size": head["fct_slowdown_by_size"],
            "fct_p50_s": weighted_percentile(flows.effective_fct_s, flows.mult, 50),
            "fct_p99_s": weighted_percentile(flows.effective_fct_s, flows.mult, 99),
            "unfinished_flows": result.unfinished,
            "groups": groups,
            "engine": {k: int(v) for k, v in result.stats.items()},
            "wide_sets": result.wide_sets,
            "adaptive_reasons": list(result.adaptive_reasons[:20]),
        },
    }


def _num(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def fct_cdf(result: SimResult, points: int = 200) -> tuple[F64, F64]:
    """(effective fct seconds, cumulative fraction) sampled at `points` quantiles, members weighted."""
    flows = result.flows
    if flows.job.size == 0:
        return np.zeros(0), np.zeros(0)
    qs = np.linspace(0, 100, points)
    eff = flows.effective_fct_s
    values = [weighted_percentile(eff, flows.mult, q) for q in qs]
    keep = [i for i, v in enumerate(values) if v is not None]
    return np.array([values[i] for i in keep], dtype=np.float64), qs[keep] / 100.0


def hottest_links(result: SimResult, network: Network, count: int = 24) -> tuple[list[str], F64, float]:
    """Names and utilisation-over-time rows (bins) of the busiest switch-to-switch links."""
    if result.heat.size == 0:
        return [], np.zeros((0, 0)), result.bin_s
    used_bins = max(1, min(result.heat.shape[0], math.ceil(result.end_s / result.bin_s)))
    heat = result.heat[:used_bins]
    caps = network.cap_gbps[result.fabric_links]
    util = heat / (caps * BYTES_PER_GBIT * result.bin_s)
    top = np.argsort(-result.link_bytes, kind="stable")[:count]
    names = [network.link_name(int(result.fabric_links[i])) for i in top]
    return names, util[:, top].T, result.bin_s


# --- cross-validation with the emulator --------------------------------------------------------------


def ordering(summary: Mapping[str, Any], field: str = "slowdown") -> list[str]:
    """Policies from best to worst on `field` (lower slowdown first; higher is better for other fields)."""
    rows = summary.get("policies", {})
    have = [(name, row.get(field)) for name, row in rows.items() if _is_num(row.get(field))]
    sign = 1.0 if field in ("slowdown", "completion_s") else -1.0
    return [name for name, _ in sorted(have, key=lambda item: (sign * float(item[1]), item[0]))]


def compare(sim: Mapping[str, Any], emu: Mapping[str, Any], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """How far a simulation summary is from an emulation `compare` summary of the same scenario.

    Comparable only when both ran the same scenario at the same link speeds, the emulator kept up (its
    headroom verdict clean under every policy), and every judged figure (`JUDGED`) exists on both sides —
    a figure missing on either side makes the comparison not comparable, with the reason; it never reads
    as agreement.  Then they agree when the ordering by slowdown is the same (policies whose emulated
    slowdowns lie within the tolerance of each other count as tied) and every judged figure is within the
    tolerance (relative to the emulated one)."""
    sim_rows, emu_rows = sim.get("policies", {}), emu.get("policies", {})
    common = [name for name in sim_rows if name in emu_rows]
    why: list[str] = []
    if not common:
        why.append("no policy ran in both")
    if sim.get("scenario") and emu.get("scenario") and sim.get("scenario") != emu.get("scenario"):
        why.append(
            f"different scenarios (simulated {sim.get('scenario')!r}, emulated {emu.get('scenario')!r})"
        )
    if _factor(sim.get("scale")) != _factor(emu.get("scale")):
        why.append(f"different link speeds (simulated at scale {sim.get('scale') or 'real'}, emulated at "
                   f"{emu.get('scale') or 'unshaped'})")  # fmt: skip
    overloaded = [n for n in common if emu_rows[n].get("emulator_overloaded")]
    if overloaded:
        why.append(f"the emulator was overloaded under {', '.join(overloaded)}: its figures describe the "
                   "machine, not the modelled fabric")  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    diffs: list[float] = []
    for name in common:
        row: dict[str, Any] = {}
        for field in FIELDS:
            a, b = sim_rows[name].get(field), emu_rows[name].get(field)
            row[field] = {"sim": a, "emu": b, "rel_diff": _rel(a, b)}
        for field in JUDGED:
            a, b = sim_rows[name].get(field), emu_rows[name].get(field)
            if not _is_num(a) or not _is_num(b):
                side = " and ".join(s for s, v in (("simulation", a), ("emulation", b)) if not _is_num(v))
                why.append(f"{name}: {field} missing in the {side}")
            else:
                diffs.append(row[field]["rel_diff"])
        rows[name] = row
    sim_order = [n for n in ordering(sim) if n in common]
    emu_order = [n for n in ordering(emu) if n in common]
    comparable = not why
    same = _same_order(sim_order, emu_rows, tolerance) if comparable else False
    max_diff = max(diffs) if diffs and comparable else None
    return {
        "comparable": comparable,
        "why_not": "; ".join(why) if why else None,
        "same_order": same,
        "max_rel_diff": max_diff,
        "agree": bool(comparable and same and max_diff is not None and max_diff <= tolerance),
        "tolerance": tolerance,
        "judged": list(JUDGED),
        "order_by": "slowdown",
        "sim_order": sim_order,
        "emu_order": emu_order,
        "policies": rows,
        "not_modelled": {
            name: {
                "emulated_loss_pct": emu_rows[name].get("loss_pct"),
                "simulated_loss_pct": sim_rows[name].get("loss_pct"),
                "emulated_reordered_packets": emu_rows[name].get("reordered_packets"),
            }
            for name in common
        },
        "only_sim": [n for n in sim_rows if n not in emu_rows],
        "only_emu": [n for n in emu_rows if n not in sim_rows],
    }


def _factor(text: Any) -> float | str | None:
    """A scale as emulated / real speed (so 400G=500K and 400G=0.5M are the same); None: real speeds."""
    if not text:
        return None
    try:
        return round(Scale.parse(str(text)).factor, 15)
    except ValueError:
        return str(text)


def _same_order(sim_order: Sequence[str], emu_rows: Mapping[str, Any], tolerance: float) -> bool:
    """The simulated order never ranks a policy above one the emulation measured clearly better."""
    for i, better in enumerate(sim_order):
        for worse in sim_order[i + 1 :]:
            a = emu_rows[better].get("slowdown")
            b = emu_rows[worse].get("slowdown")
            if _is_num(a) and _is_num(b) and a > b * (1 + tolerance):
                return False
    return True


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _rel(a: Any, b: Any) -> float | None:
    if not _is_num(a) or not _is_num(b):
        return None
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return abs(float(a) - float(b)) / abs(float(b))


def comparison_markdown(result: Mapping[str, Any]) -> str:
    """The report section: how far apart simulation and emulation are, and the verdict."""
    tol = result["tolerance"]
    if not result["comparable"]:
        verdict = f"**Not comparable**: {result['why_not']}."
    else:
        verdict = (
            f"{'**Agree**' if result['agree'] else '**Disagree**'}: ordering by slowdown "
            f"{'the same' if result['same_order'] else 'DIFFERENT'} (ties within {tol:.0%}); largest "
            f"difference on {', '.join(result['judged'])} {_pct(result['max_rel_diff'])} "
            f"(tolerance {tol:.0%})."
        )
    lines = [
        "## Simulation vs emulation",
        "",
        verdict,
        "",
        f"Order by slowdown — simulated: {' < '.join(result['sim_order']) or '-'}; "
        f"emulated: {' < '.join(result['emu_order']) or '-'}.",
        "",
        "| policy | slowdown sim | slowdown emu | diff | completion sim s | completion emu s | diff "
        "| goodput sim Gb/s | goodput emu Gb/s | diff | loss % sim (fluid) | loss % emu |",
        "| --- | " + " | ".join(["---:"] * 11) + " |",
    ]
    for name, row in result["policies"].items():
        s, c, g, loss = row["slowdown"], row["completion_s"], row["goodput_gbps"], row["loss_pct"]
        lines.append(
            f"| {name} | {_fmt(s['sim'])} | {_fmt(s['emu'])} | {_pct(s['rel_diff'])} | {_fmt(c['sim'])} "
            f"| {_fmt(c['emu'])} | {_pct(c['rel_diff'])} | {_fmt(g['sim'])} | {_fmt(g['emu'])} "
            f"| {_pct(g['rel_diff'])} | {_fmt(loss['sim'])} | {_fmt(loss['emu'])} |"
        )
    for side, names in (("simulation", result["only_sim"]), ("emulation", result["only_emu"])):
        if names:
            lines += ["", f"Only in the {side}: {', '.join(names)}."]
    lines += [
        "",
        "What the fluid model does not have: packet loss of closed-loop traffic (the emulator's senders are "
        "open-loop, so congestion shows there as loss; both count a flow as if its lost bytes had to be "
        "delivered at the goodput it got), reordering under spraying, queueing beyond full buffers, CPU "
        "limits of the emulating machine (its headroom verdict).",
        "",
    ]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if _is_num(value) else "-"


def _pct(value: Any) -> str:
    return f"{value:.1%}" if _is_num(value) else "-"


__all__ = [
    "FIELDS",
    "JUDGED",
    "TOLERANCE",
    "compare",
    "comparison_markdown",
    "fct_cdf",
    "hottest_links",
    "job_completions",
    "ordering",
    "reference",
    "summarise",
]
