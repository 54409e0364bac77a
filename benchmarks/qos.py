"""QoS on the emulated k=4 fat-tree, real packets: weighted shares, a rate cap, strict-priority latency.

    python -m benchmarks.qos --out benchmarks/results/qos.json [--link-pps 150] [--runs 5] [--duration 6]

One fabric (Mininet + userspace OVS, links scaled so a link carries `--link-pps` 1042-byte probe packets a
second); first the strict-priority run without QoS (plain FIFO links), then the policy of
scenarios/qos-tenants.yaml on every switch port (`emulation.qosqueues`), and per run:

* weighted: training (VL1, weight 192) and kvcache (VL2, weight 64) from h1 and h2, each at the link rate,
  into h3: the ratio of their received rates (configured 3.0);
* capped: bulk (SL3, 100 of 400 Gb/s) from h1 at the link rate: received rate / cap;
* strict: two default-class senders fill h3's downlink twice over while h2 sends 50 small control packets a
  second (VL7, strict): the control flow's one-way latency, with and without QoS.

Each run's headroom verdict (did the emulator keep up) is recorded with the machine's load.  Wrap it in the
team's emulation lock: `flock /work/briefing/emu.lock python -m benchmarks.qos ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.out import out_file, write_out
from controller.formats.qosload import load_policy
from emulation.mnfabric import remove
from emulation.ovs import OvsDaemon
from emulation.qosrun import ClassFlow, QosBench, link_scale

ROOT = Path(__file__).resolve().parents[1]

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
POLICY = ROOT / "scenarios" / "qos-tenants.yaml"
PREFIX = "bq16"


def strict_flows(link_pps: float) -> list[ClassFlow]:
    return [
        ClassFlow("load1", "h1", "h3", 0, link_pps),
        ClassFlow("load2", "h4", "h3", 0, link_pps),
        ClassFlow("control", "h2", "h3", 28, 50, 200),
    ]


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_file, required=True)
    parser.add_argument("--link-pps", type=float, default=150.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=float, default=6.0)
    args = parser.parse_args()
    daemon = OvsDaemon()
    daemon.ensure_running()
    link = args.link_pps
    report: dict[str, Any] = {
        "benchmark": "qos",
        "link_pps": link,
        "scale": str(link_scale(link)),
        "duration_s": args.duration,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "runs": {"baseline_strict": [], "weighted": [], "capped": [], "strict": []},
    }
    bench = QosBench(TOPOLOGY, link_scale(link), Path(tempfile.mkdtemp(prefix="qosbench")), PREFIX)
    bench.start()
    try:
        for _ in range(args.runs):
            report["runs"]["baseline_strict"].append(bench.run(strict_flows(link), args.duration))
        bench.apply_qos(load_policy(POLICY, bench.fabric))
        for _ in range(args.runs):
            pair = [ClassFlow("training", "h1", "h3", 4, link), ClassFlow("kvcache", "h2", "h3", 8, link)]
            report["runs"]["weighted"].append(bench.run(pair, args.duration))
            report["runs"]["capped"].append(
                bench.run([ClassFlow("bulk", "h1", "h3", 12, link)], args.duration)
            )
            report["runs"]["strict"].append(bench.run(strict_flows(link), args.duration))
        report["queue_counters_h3_downlink"] = bench.net.qos_counters().get("leaf2:1")
    finally:
        bench.stop()
        remove([f"{PREFIX}{k}{i}" for k in "sh" for i in range(64)])
        daemon.stop_if_started()
    runs = report["runs"]
    ratios = [
        r["flows"]["training"]["rate_pps"] / max(r["flows"]["kvcache"]["rate_pps"], 1e-9)
        for r in runs["weighted"]
    ]
    cap = link * 100 / 400
    report["results"] = {
        "weighted_ratio_configured": 3.0,
        "weighted_ratio": summary(ratios),
        "weighted_link_use": summary(
            [
                (r["flows"]["training"]["rate_pps"] + r["flows"]["kvcache"]["rate_pps"]) / link
                for r in runs["weighted"]
            ]
        ),
        "capped_rate_over_cap": summary([r["flows"]["bulk"]["rate_pps"] / cap for r in runs["capped"]]),
        "control_p99_ms_without_qos": summary(
            [r["flows"]["control"]["latency_ms"]["p99"] for r in runs["baseline_strict"]]
        ),
        "control_p99_ms_with_qos": summary(
            [r["flows"]["control"]["latency_ms"]["p99"] for r in runs["strict"]]
        ),
        "control_p50_ms_without_qos": summary(
            [r["flows"]["control"]["latency_ms"]["p50"] for r in runs["baseline_strict"]]
        ),
        "control_p50_ms_with_qos": summary(
            [r["flows"]["control"]["latency_ms"]["p50"] for r in runs["strict"]]
        ),
        "runs_overloaded": sum(r["headroom"]["emulator_overloaded"] for kind in runs.values() for r in kind),
        "runs_total": sum(len(kind) for kind in runs.values()),
    }
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_out(args.out, json.dumps(report, indent=1))
    print(json.dumps(report["results"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
