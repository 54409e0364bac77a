"""`emulate up --dask` across namespace "machines" beside the same shards on one machine, in one run.

For each run: `fabriclab emulate up TOPOLOGY --shards N --no-cli` once on this machine (the baseline: every
shard here, VXLAN between them — the same tunnels), and once with `--dask` on a `NamespaceCluster`
(tests/cluster_support.py: a head namespace with the scheduler and the controller, `--machines` machine
namespaces each with its own `dask worker`), both then stopped with SIGTERM.  Figures are what `emulate up`
says: fabric built, tables installed, all pairs verified (seconds from its start), pairs reachable, and the
teardown.  Both share this machine's cores, so the two-"machine" figure is what the coordination costs,
not what a second machine's cores would add.

    python -m benchmarks.cluster --topology topologies/fat-tree-k4.yaml --shards 2 --runs 20 \\
        --out benchmarks/results/cluster-k4.json

Needs root, Open vSwitch and Dask's `distributed`.  Names: `q<2 hex>` (fabric) and `bk<4 hex>` (cluster).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.out import emit, machine, out_file, percentiles
from tests.cluster_support import NamespaceCluster, cluster_available

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {
    "built_s": re.compile(r"up in ([\d.]+) s"),
    "tables_s": re.compile(r"tables installed on every switch at ([\d.]+) s"),
    "verified_s": re.compile(r"reachable, verified at ([\d.]+) s"),
    "removed_s": re.compile(r"fabric removed in ([\d.]+) s"),
}
PAIRS = re.compile(r"all pairs: (\d+)/(\d+) reachable")


def _run(argv: list[str], popen: Any, timeout_s: float) -> dict[str, Any]:
    """One `emulate up`: started, read until it runs, stopped with SIGTERM; its figures."""
    proc = popen(argv)
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("running;") or time.monotonic() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    text = "\n".join(lines) + out
    figures: dict[str, Any] = {"exit": proc.returncode}
    for name, pattern in FIGURES.items():
        found = pattern.search(text)
        figures[name] = float(found.group(1)) if found else None
    pairs = PAIRS.search(text)
    figures["pairs_reachable"], figures["pairs"] = (
        (int(pairs.group(1)), int(pairs.group(2))) if pairs else (0, 0)
    )
    if figures["verified_s"] is None:
        figures["output_tail"] = text[-1500:]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topology", type=Path, default=ROOT / "topologies" / "fat-tree-k4.yaml")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one bring-up may take")
    parser.add_argument("--out", type=out_file)
    args = parser.parse_args()
    reason = cluster_available()
    if reason:
        print(f"benchmarks.cluster: {reason}", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "fabriclab", "emulate", "up", str(args.topology.resolve()), "--no-cli",
            "--shards", str(args.shards), "--ready-timeout", str(int(args.timeout))]  # fmt: skip
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"one_machine": [], "cluster": []}
    tag = secrets.token_hex(2)
    with NamespaceCluster(f"bk{tag}", machines=args.machines, subnet="10.213.9") as cluster:
        for i in range(args.runs):
            prefix = f"q{tag[:2]}"  # short: k=16 names q1as100-eth16 must fit 15 characters

            def here(argv: list[str]) -> subprocess.Popen[str]:
                return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)  # fmt: skip

            def there(argv: list[str]) -> subprocess.Popen[str]:
                return cluster.popen_in(cluster.head, argv, cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)  # fmt: skip

            crossing = (
                ["--crossing", "vxlan"] if args.shards > 1 else []
            )  # the same tunnels as across machines
            runs["one_machine"].append(_run(base + crossing + ["--name-prefix", prefix], here, args.timeout))
            runs["cluster"].append(_run([*base, "--dask", cluster.scheduler_address, "--name-prefix", prefix],
                                        there, args.timeout))  # fmt: skip
            print(f"run {i + 1}/{args.runs}: one machine {runs['one_machine'][-1]['verified_s']} s, "
                  f"cluster {runs['cluster'][-1]['verified_s']} s", file=sys.stderr, flush=True)  # fmt: skip
    report: dict[str, Any] = {
        "benchmark": "cluster",
        "topology": str(args.topology),
        "shards": args.shards,
        "machines": args.machines,
        "runs": args.runs,
        "summary": {
            kind: {name: percentiles(r[name] for r in rs if r[name] is not None) for name in FIGURES}
            | {"all_pairs_every_run": all(r["pairs"] and r["pairs_reachable"] == r["pairs"] for r in rs)}
            for kind, rs in runs.items()
        },
        "runs_detail": runs,
        **machine(load_before),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
