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
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from emulation.runner import Progress, run_scenario
from emulation.scenario import Scenario

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


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The comparison's figures of one policy's run (all repetitions together)."""
    flows = [f for rep in summary["repetitions"] for f in rep["flows"]]
    collectives = [c for rep in summary["repetitions"] for c in rep["collectives"]]
    reps = summary["repetitions"]
    goodput = [float(f["goodput_mbps"]) for f in flows]
    fcts = [float(f["fct_s"]) for f in flows if f.get("fct_s") is not None]
    fcts += [t for c in collectives for t in c.get("qp_fct_s", [])]
    sent = sum(int(f["sent"]) for f in flows) + sum(int(c["packets_expected"]) for c in collectives)
    lost = sum(int(f["lost"]) for f in flows) + sum(int(c["lost"]) for c in collectives)
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
    moves = sum(1 for rep in reps for e in rep["events"] if e["kind"] == "adaptive_move")
    result: dict[str, Any] = {
        "completion_s": _completion(flows, collectives),
        "algbw_gbps": _mean([c["algbw_gbps"] for c in collectives]),
        "busbw_gbps": _mean([c["busbw_gbps"] for c in collectives]),
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
        "max_link_util": round(max(util_means, default=0.0), 4),
        "mean_link_util": round(statistics.fmean(util_means), 4) if util_means else 0.0,
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
        "loss_pct": round(100.0 * lost / sent, 4) if sent else 0.0,
        "adaptive_moves": moves,
        "emulator_overloaded": any(h["emulator_overloaded"] for h in headroom) if headroom else None,
        "headroom": headroom,
    }
    return result


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 6) if values else None


def _completion(flows: list[dict[str, Any]], collectives: list[dict[str, Any]]) -> float | None:
    """The collective's time when there is one (as nccl-tests measures it), else the slowest flow's FCT."""
    if collectives:
        return _mean([c["seconds"] for c in collectives])
    fcts = [float(f["fct_s"]) for f in flows if f.get("fct_s") is not None]
    return max(fcts, default=None)


# --- running -----------------------------------------------------------------------------------------------


def run_compare(
    scenario: Scenario,
    policies: list[str],
    out_dir: Path,
    progress: Progress | None = None,
    capacity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `scenario` once per policy (fresh controller and fabric each) and write the comparison."""
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
        "repetitions": scenario.spec.repetitions,
        "engine": scenario.spec.controller.engine,
    }
    by_policy = {p: {"controller": runs[p]["controller"], **figures(runs[p])} for p in policies}
    summary["policies"] = by_policy
    summary["emulator_overloaded"] = any(f["emulator_overloaded"] for f in by_policy.values())
    write_comparison(summary, runs, out_dir)
    progress(1.0, "done")
    return summary


__all__ = ["figures", "run_compare"]
