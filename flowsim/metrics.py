"""Figures of a run, the summary schema shared with the emulator's `compare`, and how far two summaries are.

Per policy (`summary.json`: `{"policies": {NAME: {...}}}`):

* `completion_s` — when the last transfer finished (a collective's completion time when it is alone).
* `busbw_gbps` — nccl-tests' bus bandwidth in GB/s (1e9 bytes/s, as nccl-tests prints and as
  `traffic.patterns.score` reports it): per-rank size / time x the collective's bus factor; for plain
  patterns (permutation, shift, incast) the mean bytes a sending host sent / completion time (bus factor 1).
  With several collectives, the first one's.
* `throughput_ratio` — achieved aggregate rate / ideal aggregate rate: the sum over flows of bytes / FCT
  (timed flows: bytes delivered / duration), divided by the same sum for the same traffic on a
  non-blocking fabric with the same NICs (every flow of a permutation at its NIC's line rate).
* `fct_p50_s`, `fct_p99_s` — flow completion time percentiles, flows weighted by their members.
* `max_link_util`, `mean_link_util` — switch-to-switch link directions, bytes carried / (capacity x
  completion time): the busiest link and the average over all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowsim.engine import BYTES_PER_GBIT, SimResult
from flowsim.network import F64, Network

FIELDS = (
    "completion_s",
    "busbw_gbps",
    "throughput_ratio",
    "fct_p50_s",
    "fct_p99_s",
    "max_link_util",
    "mean_link_util",
)


def weighted_percentile(values: F64, weights: F64, q: float) -> float:
    """The q-th percentile (0..100) of values counted `weights` times (inverse of the weighted CDF)."""
    if values.size == 0:
        return math.nan
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    target = q / 100.0 * cum[-1]
    return float(v[min(int(np.searchsorted(cum, target, side="left")), v.size - 1)])


def aggregate_rate(result: SimResult) -> float:
    """Sum of per-flow achieved rates (bytes/s), members counted."""
    sized = float((result.mult * result.size_bytes / np.maximum(result.fct_s, 1e-300)).sum())
    timed = float((result.timed_mult * result.timed_bytes / np.maximum(result.timed_s, 1e-300)).sum())
    return sized + timed


def summarise(result: SimResult, ideal: SimResult, network: Network) -> dict[str, Any]:
    """One policy's figures (the summary schema) plus details for the report."""
    end = result.end_s
    caps = network.cap_gbps[result.fabric_links]
    util = result.link_bytes / np.maximum(caps * BYTES_PER_GBIT * max(end, 1e-300), 1e-300)
    ideal_rate = aggregate_rate(ideal)
    first = next((g for g in result.groups if g.collective is not None), None)
    busbw: float | None = None
    groups = []
    for g in result.groups:
        row: dict[str, Any] = {"name": g.name, "start_s": _num(g.start_s), "end_s": _num(g.end_s)}
        if g.collective is not None and g.end_s is not None and g.end_s > g.start_s:
            kind, n, size = g.collective
            seconds = g.end_s - g.start_s
            algbw = size / seconds / 1e9
            factor = g.bus_factor if g.bus_factor is not None else 1.0
            row.update(
                kind=kind,
                ranks=n,
                size_bytes=size,
                seconds=seconds,
                algbw_gbps=algbw,
                busbw_gbps=algbw * factor,
                skipped_steps=g.skipped_steps,
            )
            if g is first:
                busbw = algbw * factor
        groups.append(row)
    if busbw is None and result.fct_s.size and end > 0:
        busbw = _pattern_busbw(result, end)
    return {
        "completion_s": end,
        "busbw_gbps": busbw,
        "throughput_ratio": aggregate_rate(result) / ideal_rate if ideal_rate > 0 else None,
        "fct_p50_s": _num(weighted_percentile(result.fct_s, result.mult, 50)),
        "fct_p99_s": _num(weighted_percentile(result.fct_s, result.mult, 99)),
        "max_link_util": float(util.max()) if util.size else 0.0,
        "mean_link_util": float(util.mean()) if util.size else 0.0,
        "details": {
            "ideal_completion_s": ideal.end_s,
            "unfinished_flows": result.unfinished,
            "groups": groups,
            "engine": {k: int(v) for k, v in result.stats.items()},
        },
    }


def _pattern_busbw(result: SimResult, end: float) -> float:
    """Mean bytes per flow / completion (GB/s): nccl-tests' sendrecv busbw when every sender sends one
    flow (permutations, shifts, incast — the patterns this is used for)."""
    members = float(result.mult.sum())
    total = float((result.mult * result.size_bytes).sum())
    return total / max(members, 1.0) / end / 1e9


def _num(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def fct_cdf(result: SimResult, points: int = 200) -> tuple[F64, F64]:
    """(fct seconds, cumulative fraction) sampled at `points` quantiles, members weighted."""
    if result.fct_s.size == 0:
        return np.zeros(0), np.zeros(0)
    qs = np.linspace(0, 100, points)
    return np.array([weighted_percentile(result.fct_s, result.mult, q) for q in qs]), qs / 100.0


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


def ordering(summary: Mapping[str, Any], field: str = "throughput_ratio") -> list[str]:
    """Policies from best to worst on `field` (higher is better for throughput and busbw)."""
    rows = summary.get("policies", {})
    have = [(name, row.get(field)) for name, row in rows.items() if isinstance(row.get(field), int | float)]
    return [name for name, _ in sorted(have, key=lambda item: (-float(item[1]), item[0]))]


def compare(sim: Mapping[str, Any], emu: Mapping[str, Any], tolerance: float = 0.15) -> dict[str, Any]:
    """How far a simulation summary is from an emulation `compare` summary (same schema).

    Agreement means: the same per-policy ordering by throughput ratio (policies whose emulated ratios lie
    within the tolerance of each other count as tied, so noise cannot fail it), and every policy's
    throughput ratio within `tolerance` (relative to the emulated one)."""
    sim_rows, emu_rows = sim.get("policies", {}), emu.get("policies", {})
    common = [name for name in sim_rows if name in emu_rows]
    rows = []
    within = True
    for name in common:
        row: dict[str, Any] = {"policy": name}
        for field in FIELDS:
            a, b = sim_rows[name].get(field), emu_rows[name].get(field)
            row[field] = {"sim": a, "emu": b, "rel_diff": _rel(a, b)}
        diff = row["throughput_ratio"]["rel_diff"]
        row["ratio_within_tolerance"] = diff is not None and diff <= tolerance
        within &= bool(row["ratio_within_tolerance"])
        rows.append(row)
    sim_order = [n for n in ordering(sim) if n in common]
    emu_order = [n for n in ordering(emu) if n in common]
    return {
        "policies": common,
        "only_sim": [n for n in sim_rows if n not in emu_rows],
        "only_emu": [n for n in emu_rows if n not in sim_rows],
        "sim_order": sim_order,
        "emu_order": emu_order,
        "same_order": _same_order(sim_order, emu_rows, tolerance),
        "tolerance": tolerance,
        "ratios_within_tolerance": within and bool(common),
        "rows": rows,
    }


def _same_order(sim_order: Sequence[str], emu_rows: Mapping[str, Any], tolerance: float) -> bool:
    """The simulated order never ranks a policy above one the emulation measured clearly better."""
    for i, better in enumerate(sim_order):
        for worse in sim_order[i + 1 :]:
            a = emu_rows[better].get("throughput_ratio")
            b = emu_rows[worse].get("throughput_ratio")
            if isinstance(a, int | float) and isinstance(b, int | float) and b > a * (1 + tolerance):
                return False
    return True


def _rel(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return None
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return abs(float(a) - float(b)) / abs(float(b))


def comparison_markdown(result: Mapping[str, Any]) -> str:
    """The report section: how far apart simulation and emulation are, and the verdict."""
    tol = result["tolerance"]
    lines = [
        "## Simulation vs emulation",
        "",
        f"Policies in both: {', '.join(result['policies']) or 'none'}.  "
        f"Order by throughput ratio — simulated: {' > '.join(result['sim_order']) or '-'}; "
        f"emulated: {' > '.join(result['emu_order']) or '-'} "
        f"({'same' if result['same_order'] else 'DIFFERENT'} ordering, ties within {tol:.0%}).  "
        f"Throughput ratios {'all' if result['ratios_within_tolerance'] else 'NOT all'} within {tol:.0%}.",
        "",
        "| policy | ratio sim | ratio emu | diff | completion sim s | completion emu s "
        "| busbw sim | busbw emu |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        r, c, b = row["throughput_ratio"], row["completion_s"], row["busbw_gbps"]
        lines.append(
            f"| {row['policy']} | {_fmt(r['sim'])} | {_fmt(r['emu'])} | {_pct(r['rel_diff'])} "
            f"| {_fmt(c['sim'])} | {_fmt(c['emu'])} | {_fmt(b['sim'])} | {_fmt(b['emu'])} |"
        )
    for side, names in (("simulation", result["only_sim"]), ("emulation", result["only_emu"])):
        if names:
            lines += ["", f"Only in the {side}: {', '.join(names)}."]
    lines += [
        "",
        "Why they differ: the emulator shapes links to a scaled speed on a 2-core machine (CPU limits and "
        "packet loss show up as lower ratios), sends packets with real hashing and queues, and measures "
        "over its run time; the simulator assumes fluid max-min sharing at real link speeds with no loss, "
        "no queueing delay and instant rerouting.",
        "",
    ]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) and math.isfinite(value) else "-"


__all__ = [
    "FIELDS",
    "aggregate_rate",
    "compare",
    "comparison_markdown",
    "fct_cdf",
    "hottest_links",
    "ordering",
    "summarise",
    "weighted_percentile",
]
