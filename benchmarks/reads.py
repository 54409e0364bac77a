"""Reads while the controller recomputes (issue 29's `reads_during_recompute`).

A real controller process (`fabriclab controller`, as users run it) on a k=16 fat-tree (320 switches, 1,024
hosts), no switches connected: the recomputation and the REST server are the whole load.  One client thread
reads `GET /health`, `/routes?src&dst` and `/fabric` in turn, one request at a time on a kept-alive
connection, and notes each latency.  The same reads run twice in the same process:

- `idle`: nothing else happens (the baseline);
- `during_recompute`: while the worst changes a user can ask for at k=16 run, one after another: an engine
  change (`PUT /routing` to sssp and back to ftree: a full table computation, verification and compile)
  and a partition change (`POST /pkeys`: a new partition over half the hosts, then its deletion).  Only
  reads that *started* while a change was being computed count.

    python -m benchmarks.reads --out benchmarks/results/reads-during-recompute.json [--k 16] [--changes 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.out import emit, out_file, percentiles
from controller.rest.client import wait_for
from emulation.controlproc import ControllerProcess
from topologies.generators import fat_tree
from topologies.loader import dump_yaml

TARGET_P99_MS = 20.0


class Reader(threading.Thread):
    """Reads the three paths in turn until stopped; each sample is (started, path, latency in ms)."""

    def __init__(self, port: int, paths: list[str]) -> None:
        super().__init__(name="reader", daemon=True)
        self.port, self.paths = port, paths
        self.samples: list[tuple[float, str, float]] = []
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        i = 0
        while not self.stop.is_set():
            path = self.paths[i % len(self.paths)]
            i += 1
            started = time.perf_counter()
            try:
                conn.request("GET", "/api/v1/" + path)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.errors.append(f"{path}: {exc}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                continue
            took_ms = 1000 * (time.perf_counter() - started)
            if response.status != 200:
                self.errors.append(f"{path}: HTTP {response.status}")
            self.samples.append((started, path.split("?")[0], took_ms))
            time.sleep(0.002)  # a reader, not a flood: ~one request every few ms
        conn.close()


def _summary(samples: list[tuple[float, str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"all": percentiles([ms for _, _, ms in samples], p99=True)}
    for name in sorted({p for _, p, _ in samples}):
        out[name] = percentiles([ms for _, p, ms in samples if p == name], p99=True)
    return out


def _changes(ctl: ControllerProcess, hosts: list[str], n: int) -> list[tuple[str, float, float]]:
    """n changes, alternating engine and partition changes; (kind, started, ended) of each."""
    windows: list[tuple[str, float, float]] = []
    members = [{"host": h, "membership": "full"} for h in hosts[: len(hosts) // 2]]
    plan = [
        ("engine", "PUT", "routing", {"engine": "sssp"}),
        ("engine", "PUT", "routing", {"engine": "ftree"}),
        ("partition", "POST", "pkeys", {"pkey": "0x0123", "name": "bench", "members": members}),
        ("partition", "DELETE", "pkeys/0x0123", None),
    ]
    for i in range(n):
        kind, method, path, body = plan[i % len(plan)]
        started = time.perf_counter()
        status, reply = ctl.request(method, path, json.dumps(body) if body is not None else None)
        ended = time.perf_counter()
        if status not in (200, 201):
            raise RuntimeError(f"{method} {path}: HTTP {status}: {reply}")
        windows.append((kind, started, ended))
    return windows


def run(k: int, n_changes: int, idle_s: float, gc_policy: str) -> dict[str, Any]:
    fabric = fat_tree(k)
    hosts = [n.name for n in fabric.hosts]
    paths = ["health", f"routes?src={hosts[0]}&dst={hosts[-1]}", "fabric"]
    with tempfile.TemporaryDirectory(prefix="fabriclab-reads-") as tmp:
        work = Path(tmp)
        topology = work / f"ft{k}.yaml"
        topology.write_text(dump_yaml(fabric))
        ctl = ControllerProcess(topology, work / "state", work / "controller.log", "--gc", gc_policy)
        ctl.start()
        try:
            wait_for(lambda: ctl.request("GET", "routing")[0] == 200, 120, "the first tables")
            loads = [os.getloadavg()[0]]
            idle = Reader(ctl.api_port, paths)
            idle.start()
            time.sleep(idle_s)
            idle.stop.set()
            idle.join()
            busy = Reader(ctl.api_port, paths)
            busy.start()
            windows = _changes(ctl, hosts, n_changes)
            busy.stop.set()
            busy.join()
            loads.append(os.getloadavg()[0])
        finally:
            ctl.stop()
        log = (work / "controller.log").read_text(errors="replace")
        full_collections = [line.split(": ", 2)[-1] for line in log.splitlines() if "full collection" in line]
    during = [s for s in busy.samples if any(a <= s[0] <= b for _, a, b in windows)]
    by_kind = {
        kind: _summary([s for s in busy.samples if any(a <= s[0] <= b for kk, a, b in windows if kk == kind)])
        for kind in sorted({w[0] for w in windows})
    }
    worst_p99 = _summary(during)["all"].get("p99")
    return {
        "fabric": fabric.summary(),
        "gc": gc_policy,
        "changes": n_changes,
        "change_ms": percentiles([1000 * (b - a) for _, a, b in windows], p99=True),
        "change_ms_by_kind": {
            kind: percentiles([1000 * (b - a) for kk, a, b in windows if kk == kind], p99=True)
            for kind in sorted(by_kind)
        },
        "idle_ms": _summary(idle.samples),
        "during_recompute_ms": _summary(during),
        "during_recompute_ms_by_change": by_kind,
        "errors": idle.errors + busy.errors,
        "controller_full_collections": full_collections,
        "target": {"p99_below_ms": TARGET_P99_MS, "met": worst_p99 is not None and worst_p99 < TARGET_P99_MS},
        "load_avg_1min": loads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--changes", type=int, default=8, help="changes to run (alternating kinds; ≥ 4)")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument(
        "--gc",
        default="cpython,frozen",
        help="controller --gc policies to run, in this order (default: the interpreter's, then ours)",
    )
    parser.add_argument("--out", type=out_file, help="also write the JSON here")
    args = parser.parse_args()
    machine: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    report = {
        "command": " ".join(["python -m benchmarks.reads", *sys.argv[1:]]),
        "machine": machine,
        f"k{args.k}": {
            policy: run(args.k, args.changes, args.idle_s, policy) for policy in args.gc.split(",")
        },
    }
    machine["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
