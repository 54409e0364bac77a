"""Flow-level simulator benchmark: solver speed, the issue's big cases, and how time grows with fabric size.

Prints (or writes with --out) one JSON document:

* `solve` — one max-min solve of a 1,024-host all-to-all, every flow on its own (1,047,552 flows, 4,096
  links, ECMP routes): p50/p95/max over n runs, flows solved per second, and the same for the baseline in
  the same process (the textbook progressive filling, one bottleneck level per round).
* `alltoall_1024` — the whole 1,024-GPU all-to-all simulated to completion under all four policies plus
  the non-blocking reference (bar: < 10 s in total).
* `ring_16384` — a 16,384-GPU ring all-reduce (1 GiB, rail-aware rank order) on a rail-optimised fabric,
  and `moe_4096` — `scenarios/moe-alltoall-4096gpu.yaml` (16.8 M flows); each policy in its own fresh
  process, with its peak RSS (bars: < 60 s and < 8 GB each).
* `scaling` — a permutation of 64 MiB flows on 3-tier fat-trees k = 8 ... 48 (128 ... 27,648 hosts):
  time per policy, flows per second.

Every case reports the machine's load average before and after; the integrator re-runs final figures on a
quiet machine:

    python -m benchmarks.simspeed --out benchmarks/results/flowsim.json
    python -m benchmarks.simspeed --quick            # small sizes, seconds (what the test runs)
    python -m benchmarks.simspeed --parts solve,scaling --max-k 24
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.out import emit, out_file
from flowsim import maxmin
from flowsim.engine import SimConfig, Simulator
from flowsim.network import Network, route_fabric
from flowsim.routes import SlotPick, five_tuple_hash, walk
from flowsim.slots import SlotTables
from flowsim.workload import Workload, adhoc, ring
from topologies.generators import fat_tree, leaf_spine, rail
from traffic.entropy import seeded_sport_array

ROOT = Path(__file__).resolve().parents[1]

POLICIES = ("static", "ecmp", "spray", "adaptive")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def stats(samples: list[float]) -> dict[str, float]:
    arr = np.array(samples)
    return {
        "n": len(samples),
        "p50_s": round(float(np.percentile(arr, 50)), 4),
        "p95_s": round(float(np.percentile(arr, 95)), 4),
        "max_s": round(float(arr.max()), 4),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


# --- parts ----------------------------------------------------------------------------------------------


def part_solve(quick: bool, runs: int) -> dict[str, Any]:
    leaves, per_leaf = (8, 8) if quick else (32, 32)
    net = Network.build(leaf_spine(leaves, leaves, per_leaf))
    routing = route_fabric(net, "ftree")
    n = net.n_hosts
    src = np.repeat(np.arange(n, dtype=np.int32), n - 1)
    dst = ((src + np.tile(np.arange(1, n, dtype=np.int32), n)) % n).astype(np.int32)
    sport = seeded_sport_array(1, src.size)
    pick = SlotPick(SlotTables(routing, {}), sport, five_tuple_hash(routing, src, dst, sport, 1))
    routes = walk(routing, src, dst, pick)
    counts = np.diff(routes.indptr) + 1
    indptr = np.zeros(src.size + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    links = np.empty(int(indptr[-1]), np.int32)
    links[indptr[:-1]] = net.host_up[src]
    body = np.ones(links.size, bool)
    body[indptr[:-1]] = False
    links[body] = routes.links
    weight, mult, cap = np.ones(links.size), np.ones(src.size), np.full(src.size, np.inf)

    def solve() -> maxmin.Allocation:
        return maxmin.max_min(net.cap_gbps, indptr, links, weight, mult, cap)

    before = load()
    batched = [timed(solve) for _ in range(runs)]
    saved = maxmin.BATCH_LINKS
    maxmin.BATCH_LINKS = 1
    try:
        baseline = [timed(solve) for _ in range(max(3, runs // 4))]
    finally:
        maxmin.BATCH_LINKS = saved
    # the same answer, up to the order floating-point sums are taken in (6e-8 relative at worst here)
    assert np.allclose(batched[0][1].rate, baseline[0][1].rate, rtol=1e-6)
    fast, slow = stats([t for t, _ in batched]), stats([t for t, _ in baseline])
    return {
        "flows": int(src.size),
        "links": net.n_links,
        "nonzeros": int(links.size),
        "rounds": batched[0][1].rounds,
        "solve": fast,
        "flows_per_s": round(src.size / fast["p50_s"]),
        "baseline_one_level_per_round": {**slow, "rounds": baseline[0][1].rounds},
        "speedup_p50": round(slow["p50_s"] / fast["p50_s"], 2),
        "throughput_ratio_check": round(float(batched[0][1].rate.sum()) / (n * 400.0), 4),
        "load_before": before,
        "load_after": load(),
    }


def run_policies(net: Network, work: Workload, policies: tuple[str, ...], **cfg: Any) -> dict[str, Any]:
    """The reference and each policy, timed; rows say how much was simulated."""
    rows: dict[str, Any] = {}
    total = 0.0
    for name in ("ideal", *policies):
        config = SimConfig(policy="static" if name == "ideal" else name, ideal=name == "ideal", seed=1, **cfg)
        started = time.perf_counter()
        result = Simulator(net, work, config).run()
        seconds = time.perf_counter() - started
        total += seconds
        members = float(result.flows.mult.sum())
        rows[name] = {
            "seconds": round(seconds, 3),
            "simulated_s": result.end_s,
            "flows": int(members),
            "flows_per_s": round(members / seconds) if seconds > 0 else None,
            "events": int(result.stats["events"]),
            "classes": int(result.stats["classes"]),
            "skipped_steps": int(result.stats["skipped_steps"]),
        }
    return {"policies": rows, "total_s": round(total, 3)}


def part_alltoall(quick: bool) -> dict[str, Any]:
    leaves = 8 if quick else 32
    net = Network.build(leaf_spine(leaves, leaves, leaves))
    before = load()
    out = run_policies(net, adhoc("alltoall", net, 64 * 2**20, 1), POLICIES)
    out.update(
        hosts=net.n_hosts, size_per_rank="64MiB", bar_total_s=10, load_before=before, load_after=load()
    )
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def case_ring(policy: str, quick: bool) -> dict[str, Any]:
    from traffic.patterns import rail_aware_order  # noqa: PLC0415

    fabric = rail(servers=16, gpus=8, groups=2) if quick else rail(servers=128, gpus=8, groups=16, spines=126)
    net = Network.build(fabric)
    order = rail_aware_order(
        [h.name for h in fabric.hosts],
        {h.name: h.rail or 0 for h in fabric.hosts},
        {h.name: h.server or h.name for h in fabric.hosts},
    )
    work = Workload(collectives=(ring("allreduce", "allreduce-ring", net.hosts(order), 2**30),))
    return {"hosts": net.n_hosts, "size": "1GiB", **run_policies(net, work, (policy,))}


def case_moe(policy: str, quick: bool) -> dict[str, Any]:
    from flowsim.scenario import workload_of  # noqa: PLC0415
    from labspec.scenario import load_scenario  # noqa: PLC0415

    if quick:
        net = Network.build(rail(servers=8, gpus=8, groups=2))
        work = adhoc("alltoall", net, 64 * 2**20, 1)
    else:
        scenario = load_scenario(ROOT / "scenarios" / "moe-alltoall-4096gpu.yaml")
        net = Network.build(scenario.fabric)
        work = workload_of(scenario, net)
    return {"hosts": net.n_hosts, **run_policies(net, work, (policy,))}


CASES: dict[str, Callable[[str, bool], dict[str, Any]]] = {"ring_16384": case_ring, "moe_4096": case_moe}


def part_big(case: str, quick: bool, policies: tuple[str, ...]) -> dict[str, Any]:
    """Each policy in a fresh process, so its peak RSS is its own."""
    rows: dict[str, Any] = {}
    for policy in policies:
        argv = [sys.executable, "-m", "benchmarks.simspeed", "--case", case, "--policy", policy] + (
            ["--quick"] if quick else []
        )
        before = load()
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600, cwd=ROOT)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            rows[policy] = {
                "error": done.stderr.strip().splitlines()[-1:] or ["failed"],
                "wall_s": round(wall, 1),
            }
            continue
        rows[policy] = {**json.loads(done.stdout), "process_wall_s": round(wall, 2), "load_before": before,
                        "load_after": load()}  # fmt: skip
    return {"bar_s": 60, "bar_rss_mb": 8192, "runs": rows}


def part_scaling(quick: bool, max_k: int) -> dict[str, Any]:
    ks = [k for k in ((4, 8) if quick else (8, 16, 24, 32, 48)) if k <= max_k]
    rows = []
    for k in ks:
        started = time.perf_counter()
        net = Network.build(fat_tree(k))
        build_s = time.perf_counter() - started
        work = adhoc("permutation", net, 64 * 2**20, 1)
        before = load()
        out = run_policies(net, work, POLICIES)
        rows.append({"k": k, "hosts": net.n_hosts, "links": net.n_links, "build_s": round(build_s, 3),
                     **out, "load_before": before, "load_after": load()})  # fmt: skip
    return {"workload": "permutation, 64 MiB per flow", "fabrics": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--parts", default="solve,alltoall,ring,moe,scaling")
    parser.add_argument("--runs", type=int, default=20, help="repetitions of the solver timing")
    parser.add_argument("--max-k", type=int, default=48, help="largest fat-tree of the scaling part")
    parser.add_argument("--policies", default=",".join(POLICIES), help="policies of the big cases")
    parser.add_argument("--out", type=out_file, help="write the JSON here (default: stdout)")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # a child process: one big case, one policy
        row = CASES[args.case](args.policy, args.quick)
        row["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(row))
        return 0
    parts = set(args.parts.split(","))
    policies = tuple(args.policies.split(","))
    report: dict[str, Any] = {
        "benchmark": "flowsim",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": args.quick,
        "load_start": load(),
    }
    if "solve" in parts:
        report["solve"] = part_solve(args.quick, max(3, args.runs if not args.quick else 5))
    if "alltoall" in parts:
        report["alltoall_1024"] = part_alltoall(args.quick)
    if "ring" in parts:
        report["ring_16384"] = part_big("ring_16384", args.quick, policies)
    if "moe" in parts:
        report["moe_4096"] = part_big("moe_4096", args.quick, policies)
    if "scaling" in parts:
        report["scaling"] = part_scaling(args.quick, args.max_k)
    report["load_end"] = load()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
