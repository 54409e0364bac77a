"""`scenario run --dask` across namespace "machines" beside the same run on one machine: do they agree?

For each run: `fabriclab scenario run SCENARIO --shards N --crossing vxlan` on this machine (the baseline:
every shard and every probe here, the same VXLAN tunnels) and `--dask` on a `NamespaceCluster`
(tests/cluster_support.py), where each flow is sent on its source's "machine" and received on its
destination's.  Per run and side: packets sent and received, loss, probe latency (p50 of the flows' p50s,
worst p99), the emulator's headroom verdict and the run's wall time; per flow, the loss on each side.  The
comparison: the total loss of the two sides, and the largest difference of one flow's loss between two
runs across the sides beside the same between two runs of one side (under ecmp a flow's loss varies from
run to run on one machine too).

    python -m benchmarks.cluster_scenario --scenario scenarios/permutation-k4.yaml --runs 5 \\
        --out benchmarks/results/cluster-scenario-permutation-k4.json

Both share this machine's cores; latency across real machines also carries their clocks' offset (see
docs/sharding.md).  Needs root, Open vSwitch and Dask's `distributed`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

from benchmarks.out import emit, machine, out_file, percentiles
from tests.cluster_support import NamespaceCluster, cluster_available

ROOT = Path(__file__).resolve().parents[1]


def _figures(folder: Path, wall_s: float, code: int, said: str) -> dict[str, Any]:
    """What one `scenario run` measured (its summary.json)."""
    if code != 0 or not (folder / "summary.json").is_file():
        return {"exit": code, "output_tail": said[-1500:]}
    rep = json.loads((folder / "summary.json").read_text())["repetitions"][0]
    flows = rep["flows"]
    sent, received = sum(f["sent"] for f in flows), sum(f["received"] for f in flows)
    p50s = [f["latency_ms"]["p50"] for f in flows if f.get("latency_ms")]
    p99s = [f["latency_ms"]["p99"] for f in flows if f.get("latency_ms")]
    return {
        "exit": code,
        "wall_s": round(wall_s, 1),
        "sent": sent,
        "received": received,
        "loss_pct": round(100.0 * (sent - received) / sent, 3) if sent else None,
        "flow_loss_pct": {f["name"]: f["loss_pct"] for f in flows},
        "latency_p50_ms": round(median(p50s), 3) if p50s else None,
        "latency_p99_max_ms": max(p99s, default=None),
        "emulator_overloaded": rep["headroom"]["emulator_overloaded"],
        "all_pairs_reachable": rep["all_pairs"]["reachable"] == rep["all_pairs"]["pairs"],
    }


def _flow_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference of one flow's loss between two runs (percentage points)."""
    return float(max(abs(a["flow_loss_pct"][f] - b["flow_loss_pct"][f]) for f in a["flow_loss_pct"]))


def _mean_difference(one: list[dict[str, Any]], two: list[dict[str, Any]]) -> float | None:
    """The largest difference of a flow's mean loss over the runs of each side (percentage points)."""
    if not one or not two:
        return None
    flows = one[0]["flow_loss_pct"]
    return round(float(max(abs(mean(r["flow_loss_pct"][f] for r in one)
                               - mean(r["flow_loss_pct"][f] for r in two)) for f in flows)), 2)  # fmt: skip


def _run(argv: list[str], folder: Path, run: Any) -> dict[str, Any]:
    start = time.monotonic()
    done = run([*argv, "-o", str(folder)])
    return _figures(folder, time.monotonic() - start, done.returncode, done.stdout + done.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "permutation-k4.yaml")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=out_file)
    args = parser.parse_args()
    reason = cluster_available()
    if reason:
        print(f"benchmarks.cluster_scenario: {reason}", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "fabriclab", "scenario", "run", str(args.scenario.resolve()), "--force",
            "--shards", str(args.shards)]  # fmt: skip
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"one_machine": [], "cluster": []}
    with (
        NamespaceCluster(f"bs{secrets.token_hex(2)}", machines=args.machines, subnet="10.213.10") as cluster,
        tempfile.TemporaryDirectory(prefix="fabriclab-bench-") as scratch,
    ):
        for i in range(args.runs):

            def here(argv: list[str]) -> subprocess.CompletedProcess[str]:
                return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                                      check=False)  # fmt: skip

            def there(argv: list[str]) -> subprocess.CompletedProcess[str]:
                return cluster.run_in(cluster.head, argv, timeout_s=900, cwd=ROOT)

            here_run = _run([*base, "--crossing", "vxlan"], Path(scratch) / f"one{i}", here)
            there_run = _run([*base, "--dask", cluster.scheduler_address], Path(scratch) / f"two{i}", there)
            runs["one_machine"].append(here_run)
            runs["cluster"].append(there_run)
            print(f"run {i + 1}/{args.runs}: loss one machine {here_run.get('loss_pct')} %, cluster "
                  f"{there_run.get('loss_pct')} %", file=sys.stderr, flush=True)  # fmt: skip
    done = {kind: [r for r in rs if "flow_loss_pct" in r] for kind, rs in runs.items()}
    one, two = done["one_machine"], done["cluster"]
    # A flow's loss under ecmp differs between two runs on the same machine too (which of two colliding
    # flows loses more is timing): the cross-side differences are judged against the same-side ones.
    # Runs where a side did not complete are left out and counted: not comparable, never "the same".
    differences = {
        "one_machine_vs_cluster": [_flow_difference(a, b) for a in one for b in two],
        "one_machine_vs_one_machine": [_flow_difference(a, b) for a, b in itertools.combinations(one, 2)],
        "cluster_vs_cluster": [_flow_difference(a, b) for a, b in itertools.combinations(two, 2)],
    }
    figures = ("wall_s", "loss_pct", "latency_p50_ms", "latency_p99_max_ms")
    summary = {
        kind: {name: percentiles(r[name] for r in rs if r.get(name) is not None) for name in figures}
        | {"completed": sum(1 for r in rs if r.get("exit") == 0),
           "overloaded": sum(1 for r in rs if r.get("emulator_overloaded")),
           "all_pairs_every_run": all(r.get("all_pairs_reachable") for r in rs)}
        for kind, rs in runs.items()
    }  # fmt: skip
    report: dict[str, Any] = {
        "benchmark": "cluster_scenario",
        "scenario": str(args.scenario),
        "shards": args.shards,
        "machines": args.machines,
        "runs": args.runs,
        "summary": summary,
        "loss_pct_difference_pp": percentiles(abs(a["loss_pct"] - b["loss_pct"]) for a in one for b in two),
        "flow_loss_difference_pp": {kind: percentiles(values) for kind, values in differences.items()},
        "flow_mean_loss_difference_pp": _mean_difference(one, two),
        "comparable_runs": {kind: len(rs) for kind, rs in done.items()},
        "runs_detail": runs,
        **machine(load_before),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
