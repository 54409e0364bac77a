"""Two RoCE flows converging under DCQCN, on both instruments, against the DCQCN paper's fluid model.

`scenarios/converge-k4.yaml`: h1 -> h16 at line rate from 0 s, h3 -> h16 from 7.15 s (182 timer periods
at the emulator's 10G=14M), both through h16's port.  The prediction is the fluid model of Zhu et al.
(SIGCOMM 2015, `flowsim.fluidmodel`) at the scenario's scaled parameters.  For the model and for each
instrument: the two flows' rates (DCQCN's current rate of each QP) for 1,000 timer periods from the second
flow's start, averaged over the runs and over a moving 100-period window — when that gap comes within 10 %
for good (`settled_s`).  The model is a mean-field model, so the instruments are judged by the mean of
their runs; what one run does (its own gap, which wanders) is reported beside it.

    python -m benchmarks.converge --out benchmarks/results/converge.json    # 16 sim seeds + 6 emulated runs
    python -m benchmarks.converge --emulated 0                               # the simulator only

The emulated runs need Open vSwitch and Mininet (root); each takes about 70 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.out import emit, out_file
from emulation.ovs import OvsDaemon
from emulation.runner import run_scenario
from flowsim.converge import (
    JUDGED_PERIODS,
    WINDOW_PERIODS,
    WITHIN,
    ConvergeCase,
    emulated_rates,
    judge,
    per_run,
    simulated_rates,
)
from labspec.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = ROOT / "scenarios" / "converge-k4.yaml"
#: The measured mean-of-runs time may differ from the model's by this factor either way and still "hold".
TOLERANCE = 1.5


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def verdict(measured: float | None, predicted: float | None) -> str:
    if measured is None or predicted is None:
        return "not comparable" if predicted is None else "not converged"
    return "held" if predicted / TOLERANCE <= measured <= predicted * TOLERANCE else "not held"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sim-seeds", type=int, default=16, help="simulator runs (seeds 1..N)")
    parser.add_argument("--emulated", type=int, default=6, help="emulated runs (0: none)")
    parser.add_argument("--out", type=out_file, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    case = ConvergeCase.of(load_scenario(SCENARIO))
    fluid = case.fluid()
    report: dict[str, Any] = {
        "benchmark": "converge",
        "scenario": str(SCENARIO.relative_to(ROOT)),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "timer_period_s": case.period_s,
        "head_start_s": case.head_start_s,
        "criterion": f"mean of the runs, {WINDOW_PERIODS}-period moving averages within {WITHIN:.0%} "
        f"to {JUDGED_PERIODS} periods after the second flow's start; held within {TOLERANCE}x of the model",
        "fluid_model": {**fluid, "raw_settled_s": case.fluid_raw_settled_s()},
        "load_start": load(),
    }
    started = time.perf_counter()
    sim = [simulated_rates(case, seed) for seed in range(1, args.sim_seeds + 1)]
    report["simulator"] = summarise(case, sim, fluid["settled_s"], time.perf_counter() - started)
    report["load_after_simulator"] = load()
    if args.emulated:
        daemon = OvsDaemon()
        daemon.ensure_running()
        runs = []
        try:
            with tempfile.TemporaryDirectory(prefix="bench-converge.") as tmp:
                for i in range(args.emulated):
                    t0 = time.perf_counter()
                    summary = run_scenario(case.scenario, Path(tmp) / str(i), write=False)
                    runs.append(
                        emulated_rates(case, summary) | {"seconds": round(time.perf_counter() - t0, 1)}
                    )
                    report.setdefault("load_during_emulation", []).append(load())
        finally:
            daemon.stop_if_started()
        report["emulator"] = summarise(case, runs, fluid["settled_s"], sum(r["seconds"] for r in runs))
    report["load_end"] = load()
    emit(report, args.out)
    return 0


def summarise(
    case: ConvergeCase, runs: list[dict[str, Any]], predicted: float | None, seconds: float
) -> dict[str, Any]:
    clean = [r for r in runs if not r.get("overloaded")]
    a, b = np.array([r["a"] for r in clean]), np.array([r["b"] for r in clean])
    mean = judge(case, a, b) if clean else {"settled_s": None, "gaps": []}
    return {
        "runs": len(runs),
        "clean_runs": len(clean),
        "mean_of_runs": mean,
        "over_predicted": round(mean["settled_s"] / predicted, 3)
        if mean["settled_s"] and predicted
        else None,
        "verdict": verdict(mean["settled_s"], predicted),
        "per_run": [per_run(case, r) for r in runs],
        "seconds": round(seconds, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
