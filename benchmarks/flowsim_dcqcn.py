"""`cc: dcqcn` in the flow-level simulator: how fast, and what it shows.

Prints (or writes with --out) one JSON document:

* `alltoall_1024` — a 1,024-GPU all-to-all (`topologies/leaf-spine-32x32.yaml`, 64 MiB per rank, one
  phase, real link speeds, 1,000-packet switch buffers) under DCQCN, per policy: the DCQCN run alone
  (placing the flows, then the fluid model) p50/p95/max over `--runs` runs (default 3: one run of the
  slowest policy takes tens of seconds on two cores), and once the whole `fabriclab sim` command (the
  max-min reference, the DCQCN run, the report) as a user runs it (bar: < 60 s), beside the max-min
  figures of the same policy.
* `incast_k4` — 8 senders into one receiver at 2x its link on the k=4 fat-tree (400G=2M, 256-packet
  buffers, 16 MiB each): max-min (what `cc: none` reports), the fluid model with the senders open-loop
  (what `cc: none` senders do), and DCQCN — loss, bottleneck utilisation, Jain, peak queue.
* `convergence` — two line-rate flows into one 100G link (at 1/100 speed), the second 1 s later: when
  their rates come within 10 % and stay (20-period averages, held 100 periods), per seed, against
  `flowsim.fluidmodel.predicted_convergence_s` (the DCQCN paper's fluid model).

Every part reports the machine's load average before and after:

    python -m benchmarks.flowsim_dcqcn --out benchmarks/results/flowsim-dcqcn.json
    python -m benchmarks.flowsim_dcqcn --quick        # small sizes, seconds
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.out import emit, out_file
from flowsim.ccmodel import convergence_s
from flowsim.ccresult import run_cc
from flowsim.ccsim import CcSimulator
from flowsim.engine import SimConfig, Simulator
from flowsim.fluidmodel import predicted_convergence_s
from flowsim.metrics import summarise
from flowsim.network import Network
from flowsim.scenario import cc_setup, workload_of
from labspec.scenario import load_scenario
from topologies.generators import fat_tree, leaf_spine
from topologies.loader import dump_yaml

ROOT = Path(__file__).resolve().parents[1]

FIGURES = ("slowdown", "completion_s", "goodput_gbps", "fct_slowdown_p50", "fct_slowdown_p99", "loss_pct")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def stats(samples: list[float]) -> dict[str, float]:
    arr = np.array(samples)
    return {
        "n": len(samples),
        "p50_s": round(float(np.percentile(arr, 50)), 3),
        "p95_s": round(float(np.percentile(arr, 95)), 3),
        "max_s": round(float(arr.max()), 3),
    }


def scenario_file(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(f"fabriclab: 1\nname: {name}\nduration_s: 60\n{body}")
    return path


def alltoall_text(topology: Path, hosts: int) -> str:
    return (
        f"topology: {topology.as_posix()}\nbuffer_packets: 1000\nseed: 1\ncc: dcqcn\n"
        "controller: {engine: ftree, policy: ecmp}\ntraffic:\n"
        f"  - {{kind: roce-collective, collective: alltoall, ranks: h1..h{hosts}, size: 64MiB, "
        "schedule: one-phase}\n"
    )


def part_alltoall(folder: Path, quick: bool, policies: list[str], runs: int) -> dict[str, Any]:
    if quick:
        topology = folder / "ls8.yaml"
        topology.write_text(dump_yaml(leaf_spine(8, 8, 8)))
        hosts = 64
    else:
        topology, hosts = ROOT / "topologies" / "leaf-spine-32x32.yaml", 1024
    path = scenario_file(folder, "alltoall-dcqcn", alltoall_text(topology, hosts))
    scenario = load_scenario(path)
    network = Network.build(scenario.fabric, scenario.scale)
    workload = workload_of(scenario, network)
    setup = cc_setup(scenario, network)
    ideal = Simulator(network, workload, SimConfig(ideal=True, seed=1)).run()
    rows: dict[str, Any] = {}
    for policy in policies:
        config = SimConfig(policy=policy, seed=1)
        before = load()
        maxmin = summarise(Simulator(network, workload, config).run(), ideal, network, workload)
        seconds: list[float] = []
        figures: dict[str, Any] = {}
        for _ in range(runs):
            started = time.perf_counter()
            result, cc = run_cc(CcSimulator(network, workload, config, setup))
            seconds.append(time.perf_counter() - started)
            figures = {**summarise(result, ideal, network, workload), "cc": cc.block()}
        out = folder / f"cli-{policy}"
        started = time.perf_counter()
        argv = [sys.executable, "-m", "fabriclab", "sim", str(path), "--policies", policy, "-o", str(out)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
        cli_s = time.perf_counter() - started
        block = figures["cc"]
        rows[policy] = {
            "dcqcn_run": stats(seconds),
            "cli_command_s": round(cli_s, 2) if done.returncode == 0 else None,
            "cli_error": None if done.returncode == 0 else done.stderr.strip()[-300:],
            "dcqcn": {f: figures[f] for f in FIGURES},
            "max_min": {f: maxmin[f] for f in FIGURES},
            "cc": {k: block[k] for k in ("cnps_sent", "marked_fraction", "loss_pct", "peak_queue_bytes",
                                          "peak_queue_link", "bottleneck", "dt_s", "steps", "jumped_steps")},
            "classes": int(figures["details"]["engine"].get("classes", 0)),
            "load_before": before,
            "load_after": load(),
        }  # fmt: skip
    return {
        "hosts": hosts,
        "size_per_rank": "64MiB",
        "link_speeds": "real (400G)",
        "bar_s": 60,
        "policies": rows,
    }


INCAST = """topology: {topology}
scale: 400G=2M
buffer_packets: 256
seed: 1
controller: {{engine: ftree, policy: ecmp}}
traffic:
  - {{kind: roce-incast, senders: h1..h8, receiver: h16, size: 16MiB, rate_pps: 58}}
"""


def part_incast(folder: Path) -> dict[str, Any]:
    path = scenario_file(
        folder, "incast-k4", INCAST.format(topology=(ROOT / "topologies/fat-tree-k4.yaml").as_posix())
    )
    scenario = load_scenario(path)
    network = Network.build(scenario.fabric, scenario.scale)
    workload = workload_of(scenario, network)
    config = SimConfig(policy="ecmp", seed=1)
    ideal = Simulator(network, workload, SimConfig(ideal=True, seed=1)).run()
    before = load()
    maxmin = summarise(Simulator(network, workload, config).run(), ideal, network, workload)
    link_gbps = 0.002
    rows: dict[str, Any] = {
        "none (max-min, what `fabriclab sim` reports)": {
            "loss_pct": maxmin["loss_pct"],
            "goodput_over_link": maxmin["goodput_gbps"] / link_gbps,
            "completion_s": maxmin["completion_s"],
        }
    }
    for label, enabled in (("none (open-loop senders, fluid)", False), ("dcqcn", True)):
        started = time.perf_counter()
        result, cc = run_cc(CcSimulator(network, workload, config, cc_setup(scenario, network, enabled)))
        row = summarise(result, ideal, network, workload)
        block = cc.block()
        rows[label] = {
            "loss_pct": block["loss_pct"],
            "goodput_over_link": row["goodput_gbps"] / link_gbps,
            "bottleneck_utilisation": (block["bottleneck"] or {}).get("utilisation"),
            "jain_senders": block["jain_senders"],
            "peak_queue_bytes": block["peak_queue_bytes"],
            "buffer_bytes": block["buffer_bytes"],
            "cnps_sent": block["cnps_sent"],
            "completion_s": row["completion_s"],
            "seconds": round(time.perf_counter() - started, 3),
        }
    return {"senders": 8, "offered_over_link": 8 * 58 * 1082 * 8 / 2e6, "rows": rows, "load_before": before,
            "load_after": load()}  # fmt: skip


TWO = """topology: ft100.yaml
scale: 100G=1G
seed: {seed}
cc: dcqcn
controller: {{engine: ftree, policy: static}}
traffic:
  - {{kind: roce-incast, senders: h1, receiver: h2, size: 40GiB, start_s: 0}}
  - {{kind: roce-incast, senders: h3, receiver: h2, size: 40GiB, start_s: 1}}
"""


def part_convergence(folder: Path, seeds: list[int]) -> dict[str, Any]:
    (folder / "ft100.yaml").write_text(dump_yaml(fat_tree(4, bw_gbps=100.0)))
    before = load()
    rows = []
    predicted = None
    for seed in seeds:
        scenario = load_scenario(scenario_file(folder, f"two-flows-{seed}", TWO.format(seed=seed)))
        network = Network.build(scenario.fabric, scenario.scale)
        setup = cc_setup(scenario, network)
        period = setup.params.increase_period_s
        predicted = predicted_convergence_s(setup.params, 1e9, head_start_s=1.0, horizon_periods=3000)
        assert predicted is not None
        started = time.perf_counter()
        config = SimConfig(policy="static", seed=seed)
        sim = CcSimulator(network, workload_of(scenario, network), config, setup, sample_every_s=period / 4)
        _, cc = run_cc(sim, until_s=1.0 + 2 * predicted)
        first = cc.row_job == 0
        rates = cc.sample_rate_bps
        took = convergence_s(cc.sample_t_s, rates[:, first][:, 0], rates[:, ~first][:, 0], 1.0, 20 * period,
                             100 * period)  # fmt: skip
        rows.append({"seed": seed, "converged_s": took, "over_predicted": took / predicted if took else None,
                     "timer_periods": took / period if took else None, "cnps": round(cc.cnps),
                     "seconds": round(time.perf_counter() - started, 2)})  # fmt: skip
    return {
        "link": "100G at 1/100 (1 Gb/s), second flow 1 s after the first",
        "predicted_s": predicted,
        "runs": rows,
        "load_before": before,
        "load_after": load(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--parts", default="alltoall,incast,convergence")
    parser.add_argument("--policies", default="ecmp,static,spray", help="policies of the all-to-all")
    parser.add_argument("--runs", type=int, default=3, help="DCQCN runs per policy of the all-to-all")
    parser.add_argument("--seeds", default="1,2,3,4,5", help="seeds of the convergence part")
    parser.add_argument("--out", type=out_file, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {
        "benchmark": "flowsim-dcqcn",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": args.quick,
        "load_start": load(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-dcqcn.") as tmp:
        folder = Path(tmp)
        if "alltoall" in parts:
            runs = 1 if args.quick else max(1, args.runs)
            report["alltoall_1024"] = part_alltoall(folder, args.quick, args.policies.split(","), runs)
        if "incast" in parts:
            report["incast_k4"] = part_incast(folder)
        if "convergence" in parts:
            seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",")]
            report["convergence"] = part_convergence(folder, seeds)
    report["load_end"] = load()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
