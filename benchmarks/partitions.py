"""Partition enforcement cost in the controller: what the edge-switch layer adds to a computation, how many
flows it installs, and how small a membership change's rollout is.

For fat-trees k=4 and k=8 (hosts split into two tenants, every host a limited member of the default
partition, as a partitions file without a Default rule gives), in one process:

* `compute_ms`: `SubnetContext.compute` of a fresh generation without partitions (the baseline) and with
  them, n repetitions each, p50/p95/max;
* `flows`: flows per edge switch and in the whole fabric, without and with partitions;
* `change`: one host moved from one tenant to the other — the core's recomputation (p50/p95/max) and the
  rollout's size (switches touched, flow-mods), against a full reinstall.

    python -m benchmarks.partitions --out benchmarks/results/partitions.json
    python -m benchmarks.partitions --k 4 --repeats 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.out import out_file, write_out
from controller.sm.intents import ForwardingOptions, rollout
from controller.sm.manager import SubnetContext
from controller.sm.partitions import Partitions
from controller.sm.partitions_conf import parse_conf, resolve
from topologies.generators import fat_tree
from topologies.model import Fabric

ROOT = Path(__file__).resolve().parents[1]


def stats_ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(samples), "p50_ms": round(statistics.median(ordered) * 1e3, 3),
            "p95_ms": round(p95 * 1e3, 3), "max_ms": round(ordered[-1] * 1e3, 3)}  # fmt: skip


def tenants(fabric: Fabric, moved: bool = False) -> Partitions:
    hosts = [h.name for h in fabric.hosts]
    half = len(hosts) // 2
    a, b = hosts[:half], hosts[half:]
    if moved:
        a, b = a[:-1], [a[-1], *b]
    text = f"a=0x1 : {', '.join(h + '=full' for h in a)} ;\nb=0x2 : {', '.join(h + '=full' for h in b)} ;\n"
    return resolve(parse_conf(text), fabric)


def run(k: int, repeats: int) -> dict[str, Any]:
    fabric = fat_tree(k)
    context = SubnetContext.build(fabric)
    options = ForwardingOptions()
    parts, moved = tenants(fabric), tenants(fabric, moved=True)
    timings: dict[str, list[float]] = {"baseline": [], "partitions": [], "change": []}
    plain = with_parts = None
    for _ in range(repeats):
        for key, chosen in (("baseline", None), ("partitions", parts)):
            start = time.perf_counter()
            result = context.compute("ftree", options, {}, 1, partitions=chosen)
            timings[key].append(time.perf_counter() - start)
            if key == "baseline":
                plain = result
            else:
                with_parts = result
    assert plain is not None and with_parts is not None
    deltas: dict[str, Any] = {}
    for _ in range(repeats):
        start = time.perf_counter()
        after = context.compute("ftree", options, {}, 2, with_parts, partitions=moved)
        deltas = rollout(dict(with_parts.programs), after.programs)
        timings["change"].append(time.perf_counter() - start)
    edges = [a.switch for a in context.attached]
    per_edge = {n: len(with_parts.programs[n].flows) for n in set(edges)}
    return {
        "fabric": fabric.summary(),
        "hosts": len(fabric.hosts),
        "compute": {key: stats_ms(v) for key, v in timings.items() if key != "change"},
        "flows": {
            "per_edge_switch_baseline": max(len(plain.programs[n].flows) for n in per_edge),
            "per_edge_switch_partitions": max(per_edge.values()),
            "fabric_baseline": sum(len(p.flows) for p in plain.programs.values()),
            "fabric_partitions": sum(len(p.flows) for p in with_parts.programs.values()),
        },
        "change": {
            "what": "one host moved from tenant a to tenant b",
            "compute_and_diff": stats_ms(timings["change"]),
            "switches_touched": len(deltas),
            "flow_mods": sum(d.n_messages for d in deltas.values()),
            "full_reinstall_flow_mods": sum(len(p.flows) for p in with_parts.programs.values()),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", type=int, action="append", help="fat-tree k (repeatable; default 4 and 8)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=out_file, help="also write the JSON here")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "benchmark": "partitions",
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "results": [run(k, args.repeats) for k in args.k or [4, 8]],
    }
    report["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        write_out(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
