"""Routing benchmark: time, peak memory and quality of every engine on fabrics up to 27,648 hosts.

Prints one JSON document.  Each (fabric, engine) case runs in a fresh subprocess so that its peak memory is
its own: the peak resident set is reset (/proc/self/clear_refs) after the fabric is built, so
`route_peak_mb` is what the routing step itself added.  `route_s` is the engine call only (OpenSM's
"routing step"); building the fabric and compiling it into arrays (`prepare_s`, OpenSM's discovery) is
reported apart.

OpenSM 3.3.23 reference times for the same fabrics, measured earlier on this kind of machine (the
foundation issue's figures), are included with the ratio `opensm_ref_route_s / route_s`.

    python benchmarks/routing.py                 # everything (a few minutes)
    python benchmarks/routing.py --quick         # k <= 16 and the small fabrics
    python benchmarks/routing.py --cases ft32 --engines ftree,sssp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The repository first, before this script's own folder (whose emulation.py would shadow the package).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent)]

from controller.sm.engines import default_registry  # noqa: E402
from controller.sm.quality import quality  # noqa: E402
from controller.sm.subnet import Subnet  # noqa: E402
from controller.sm.verify import verify  # noqa: E402
from topologies.generators import fat_tree, leaf_spine, rail  # noqa: E402
from topologies.model import Fabric  # noqa: E402

CASES: dict[str, Callable[[], Fabric]] = {
    "ft8": lambda: fat_tree(8),
    "ft16": lambda: fat_tree(16),
    "ft24": lambda: fat_tree(24),
    "ft32": lambda: fat_tree(32),
    "ft48": lambda: fat_tree(48),
    "leafspine2048": lambda: leaf_spine(leaves=64, spines=32, hosts_per_leaf=32),
    "rail1024": lambda: rail(servers=32, gpus=8, groups=4, spines=16, parallel=2),
}
QUICK = ("ft8", "ft16", "leafspine2048", "rail1024")

#: OpenSM 3.3.23 routing-step times (seconds) and all-to-all max/mean, from the issue's reference run.
OPENSM_REFERENCE: dict[tuple[str, str], dict[str, float]] = {
    ("ft16", "ftree"): {"route_s": 0.081},
    ("ft24", "ftree"): {"route_s": 1.10},
    ("ft32", "ftree"): {"route_s": 3.56},
    ("ft48", "ftree"): {"route_s": 74.7},
    ("ft24", "sssp"): {"route_s": 1.66, "max_over_mean": 1.79},
    ("ft32", "sssp"): {"route_s": 7.2},
    ("ft24", "minhop"): {"route_s": 1.60, "max_over_mean": 11.8},
}

#: Above this many hosts, shift permutations are sampled (evenly spread shifts) to bound the run time.
SHIFT_SAMPLE_ABOVE = 8192
SHIFT_SAMPLES = 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_case(case: str, engine_name: str, max_shifts: int | None) -> dict[str, Any]:
    """One measurement, in this process (the parent runs each in a fresh subprocess)."""
    started = time.perf_counter()
    fabric = CASES[case]()
    subnet = Subnet.build(fabric)
    _ = subnet.dest_switch, subnet.dest_port, subnet.has_hosts  # compile lazily derived arrays up front
    prepare_s = time.perf_counter() - started
    engine = default_registry().create(engine_name)
    peak_reset = _reset_peak()
    before_kb = _status_kb("VmRSS")
    started = time.perf_counter()
    tables = engine.route(subnet)
    route_s = time.perf_counter() - started
    peak_kb = _status_kb("VmHWM")
    started = time.perf_counter()
    result = verify(tables)
    verify_s = time.perf_counter() - started
    hosts = len(fabric.hosts)
    if max_shifts is None and hosts > SHIFT_SAMPLE_ABOVE:
        max_shifts = SHIFT_SAMPLES
    started = time.perf_counter()
    figures = quality(tables, max_shifts=max_shifts)
    quality_s = time.perf_counter() - started
    assert figures.shift is not None and result.deadlock is not None
    row: dict[str, Any] = {
        "case": case,
        "fabric": fabric.name,
        "hosts": hosts,
        "switches": subnet.n_switches,
        "lids": len(subnet.lids),
        "engine": engine_name,
        "prepare_s": round(prepare_s, 3),
        "route_s": round(route_s, 4),
        "route_peak_mb": round((peak_kb - before_kb) / 1024, 1) if peak_reset else None,
        "process_peak_mb": round(peak_kb / 1024, 1),
        "verify_s": round(verify_s, 3),
        "quality_s": round(quality_s, 3),
        "verified": result.ok,
        "unreachable_pairs": result.unreachable_pairs,
        "deadlock_free_1vl": result.deadlock.acyclic,
        "mean_hops": round(result.mean_hops, 4),
        "all_to_all_max_over_mean": round(figures.switch_links.max_over_mean, 4),
        "all_to_all_worst_tier_max_over_mean": round(max(t.max_over_mean for t in figures.all_to_all), 4),
        "shift_worst_max_flows": figures.shift.worst_max_flows,
        "shifts_evaluated": figures.shift.shifts_evaluated,
        "shifts_with_contention": figures.shift.shifts_with_contention,
        "digest": tables.digest(),
    }
    reference = OPENSM_REFERENCE.get((case, engine_name))
    if reference:
        row["opensm_ref_route_s"] = reference["route_s"]
        row["speedup_vs_opensm_ref"] = round(reference["route_s"] / route_s, 2)
        if "max_over_mean" in reference:
            row["opensm_ref_max_over_mean"] = reference["max_over_mean"]
    return row


def _subprocess(case: str, engine: str, max_shifts: int | None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", case, engine]
    if max_shifts is not None:
        command += ["--max-shifts", str(max_shifts)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        return {"case": case, "engine": engine, "error": done.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", help=f"comma-separated subset of: {', '.join(CASES)}")
    parser.add_argument("--engines", help="comma-separated subset of the engines")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--max-shifts", type=int, default=None)
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_case(args.worker[0], args.worker[1], args.max_shifts)))
        return 0
    registry = default_registry()
    engines = args.engines.split(",") if args.engines else registry.names()
    cases = args.cases.split(",") if args.cases else list(QUICK if args.quick else CASES)
    unknown = [c for c in cases if c not in CASES] + [e for e in engines if e not in registry]
    if unknown:
        parser.error(f"unknown case/engine: {', '.join(unknown)}")
    rows = []
    for case in cases:
        for engine in engines:
            row = _subprocess(case, engine, args.max_shifts)
            rows.append(row)
            print(f"{case:>14} {engine:<7} {row.get('route_s', row.get('error'))}", file=sys.stderr)
    report: dict[str, Any] = {
        "benchmark": "routing",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "shift_sampling": f"all shifts up to {SHIFT_SAMPLE_ABOVE} hosts, else {SHIFT_SAMPLES} evenly spread",
        "results": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
