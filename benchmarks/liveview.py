"""Live view and metrics at fabric scale, in process (no switches needed): how big the drawing and the
pushed frames are, how long a frame and a `/metrics` scrape take to build, at k=8 and k=16.

    python -m benchmarks.liveview --out benchmarks/results/liveview.json [--n 20] [--ks 8,16]

Counters are synthetic (every switch port busy at a seeded random rate); the routing is really computed
(ftree).  Render time in a browser is in docs/observability.md (measured with headless Chromium).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from benchmarks.out import out_file, percentiles, write_out
from controller.core.events import Start
from controller.core.fabric import FabricCore
from controller.observe.live import LiveOptions, LiveView
from controller.observe.metrics import controller_registry
from controller.observe.model import Layout
from controller.published import PortCounters, PortStats, Published
from controller.sm.manager import SubnetContext
from topologies.generators import fat_tree

ROOT = Path(__file__).resolve().parents[1]


def run(k: int, n: int, seed: int) -> dict[str, Any]:
    fabric = fat_tree(k)
    context = SubnetContext.build(fabric)
    core = FabricCore(context)
    state = core.handle(core.initial_state(), time.time(), Start()).state
    ports = [(r.node, r.port) for r in fabric.port_map if fabric.nodes[r.node].is_switch]
    rng = random.Random(seed)
    totals = dict.fromkeys(ports, 0)

    def poll(at: float) -> PortStats:
        for key in ports:
            totals[key] += rng.randrange(0, 25_000_000)
        return PortStats(at, {key: PortCounters(0, 0, v, v, 0, 0, 0, 0) for key, v in totals.items()})

    published = [Published(context, state, poll(0.0), 0.0, 0.0)]
    for i in range(1, n + 2):
        prev = published[-1]
        published.append(Published(context, state, poll(float(i)), 0.0, float(i), prev.stats))
    current = {"pub": published[1]}
    layout = Layout(fabric)
    view_ms, view_bytes = [], 0
    for _ in range(n):
        live = LiveView(lambda: current["pub"], Layout(fabric), options=LiveOptions())
        start = time.perf_counter()
        view_bytes = len(json.dumps(live.view(), separators=(",", ":")))
        view_ms.append((time.perf_counter() - start) * 1000)
    live = LiveView(lambda: current["pub"], layout, options=LiveOptions(frame_interval_s=0.25))
    frame_ms, frame_bytes = [], []
    for i, pub in enumerate(published[2:]):
        current["pub"] = pub
        start = time.perf_counter()
        frame = live.frame(now=10.0 + i)
        message, _ = live.message(frame, cursor=state.records[-1].id, util_sent=None)
        frame_ms.append((time.perf_counter() - start) * 1000)
        frame_bytes.append(len(message))
    registry, _, detailed = controller_registry(lambda: current["pub"], layout)
    scrape_ms, scrape_bytes, detail_ms, detail_bytes = [], 0, [], 0
    for _ in range(n):
        start = time.perf_counter()
        scrape_bytes = len(generate_latest(registry))
        scrape_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        detail_bytes = len(generate_latest(detailed))
        detail_ms.append((time.perf_counter() - start) * 1000)
    return {
        "fabric": fabric.summary(),
        "nodes": len(fabric.nodes),
        "links": len(fabric.links),
        "view_bytes": view_bytes,
        "view_build_ms": percentiles(view_ms, digits=3),
        "frame_with_utilisation_bytes": percentiles([float(b) for b in frame_bytes], digits=3),
        "frame_build_ms": percentiles(frame_ms, digits=3),
        "metrics_bytes": scrape_bytes,
        "metrics_scrape_ms": percentiles(scrape_ms, digits=3),
        "metrics_detail_ports_bytes": detail_bytes,
        "metrics_detail_ports_scrape_ms": percentiles(detail_ms, digits=3),
        "frames_per_second_max": round(1 / live.options.frame_interval_s, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_file)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--ks", default="8,16")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = {f"k{k}": run(int(k), args.n, args.seed) for k in args.ks.split(",")}
    doc = {
        "benchmark": "liveview",
        "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()},
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        write_out(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
