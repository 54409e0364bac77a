"""Two RoCE flows converging under DCQCN, on both instruments, against what DCQCN's parameters predict.

`scenarios/converge-k4.yaml`: h1 -> h16 at line rate from 0 s, h3 -> h16 from 14.3 s (182 timer periods
at the emulator's 10G=7M), both through h16's port.  Per run: the two QPs' rates (DCQCN's current rate,
averaged over 20 timer periods) from the second flow's start — how long until they are within 10 % of each
other and stay there for 100 periods (`converged_s`, the simulator's own test), when they first are
(`first_within_s`), and the gap of every window; `flowsim.ccmodel.predicted_convergence_s` beside it.
The emulator's runs also give the same figures from what h16 received per 0.1 s (`delivered`).

    python benchmarks/converge.py --out benchmarks/results/converge.json          # sim seeds 1-5 + 1 emulated
    python benchmarks/converge.py --sim-seeds 1 --emulated 0                      # the simulator only

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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.out import emit, out_file  # noqa: E402
from emulation.ovs import OvsDaemon  # noqa: E402
from emulation.runner import run_scenario  # noqa: E402
from emulation.scenario import Scenario, load_scenario  # noqa: E402
from emulation.trafficspec import RoceIncast  # noqa: E402
from flowsim.ccmodel import convergence_s, predicted_convergence_s  # noqa: E402
from flowsim.ccsim import CcSimulator  # noqa: E402
from flowsim.engine import SimConfig  # noqa: E402
from flowsim.network import Network  # noqa: E402
from flowsim.scenario import cc_setup, workload_of  # noqa: E402

SCENARIO = ROOT / "scenarios" / "converge-k4.yaml"
WINDOW_PERIODS, HOLD_PERIODS, WITHIN = 20, 100, 0.1


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def figures(t_s: Any, a: Any, b: Any, start_s: float, period_s: float) -> dict[str, Any]:
    """Convergence of rates `a` and `b` (sampled at `t_s`) after `start_s`, as the simulator's test
    judges it, with the gap of every 20-period window."""
    window = WINDOW_PERIODS * period_s
    t, a, b = np.asarray(t_s, float), np.asarray(a, float), np.asarray(b, float)
    gaps = []
    for k in range(int((t.max() - start_s) // window)):
        inside = (t >= start_s + k * window) & (t < start_s + (k + 1) * window)
        mean_a, mean_b = a[inside].mean(), b[inside].mean()
        if max(mean_a, mean_b) <= 0:  # one of them finished
            break
        gaps.append(round(float(abs(mean_a - mean_b) / max(mean_a, mean_b)), 3))
        if min(mean_a, mean_b) <= 0:
            break
    first = next((i for i, g in enumerate(gaps) if g <= WITHIN), None)
    return {
        "converged_s": convergence_s(t, a, b, start_s, window, HOLD_PERIODS * period_s, WITHIN),
        "first_within_s": round(first * window, 2) if first is not None else None,
        "window_gaps": gaps,
    }


def head_start(scenario: Scenario) -> float:
    """When the second flow starts (the scenario's second traffic item, an incast of one sender)."""
    second = scenario.spec.traffic[1]
    assert isinstance(second, RoceIncast)
    return float(second.start_s)


def sim_run(scenario: Scenario, seed: int) -> dict[str, Any]:
    network = Network.build(scenario.fabric, scenario.scale)
    setup = cc_setup(scenario, network)
    period = setup.params.increase_period_s
    started = time.perf_counter()
    sim = CcSimulator(network, workload_of(scenario, network), SimConfig(policy="ecmp", seed=seed), setup,
                      sample_every_s=period / 4)  # fmt: skip
    _, stats = sim.run(until_s=scenario.spec.duration_s)
    first = stats.row_job == 0
    rates = stats.sample_rate_bps
    out = figures(
        stats.sample_t_s, rates[:, first][:, 0], rates[:, ~first][:, 0], head_start(scenario), period
    )
    return {
        "seed": seed,
        **out,
        "cnps": round(stats.cnps),
        "seconds": round(time.perf_counter() - started, 2),
    }


def steps(history: list[list[float]], t_s: Any) -> Any:
    """A QP's rate (a step function given at its changes) at the times `t_s`; 0 before its first."""
    times = np.array([h[0] for h in history], float)
    values = np.array([h[1] for h in history], float)
    at = np.searchsorted(times, t_s, side="right") - 1
    return np.where(at >= 0, values[np.maximum(at, 0)], 0.0)


def emulated_run(scenario: Scenario, folder: Path, period_s: float) -> dict[str, Any]:
    daemon = OvsDaemon()
    daemon.ensure_running()
    try:
        started = time.perf_counter()
        summary = run_scenario(scenario, folder, write=False)
    finally:
        daemon.stop_if_started()
    (rep,) = summary["repetitions"]
    qps = sorted(rep["cc"]["qps"].values(), key=lambda q: int(q["job"]))
    end = max(h[0] for q in qps for h in q["rates"])
    t = np.arange(0.0, end, period_s / 4)
    sending = figures(t, steps(qps[0]["rates"], t), steps(qps[1]["rates"], t), head_start(scenario), period_s)
    series = {r["job"]: r["delivered"] for r in rep["replays"]}
    bin_s = series[0]["bin_s"]
    n = max(len(series[0]["packets"]), len(series[1]["packets"]))
    delivered = [np.pad(np.asarray(series[j]["packets"], float), (0, n - len(series[j]["packets"]))) / bin_s
                 for j in (0, 1)]  # fmt: skip
    t_bins = (np.arange(n) + 0.5) * bin_s
    return {
        "overloaded": summary["emulator_overloaded"],
        "sending_rate": sending,
        "delivered": figures(t_bins, delivered[0], delivered[1], head_start(scenario), period_s),
        "cnps": rep["cc"].get("cnps_sent"),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sim-seeds", default="1,2,3,4,5")
    parser.add_argument("--emulated", type=int, default=1, help="emulated runs (0: none)")
    parser.add_argument("--out", type=out_file, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    scenario = load_scenario(SCENARIO)
    network = Network.build(scenario.fabric, scenario.scale)
    params = cc_setup(scenario, network).params
    capacity_bps = params.line_rate_bps  # the NICs run at the link's rate: h16's link is the bottleneck
    report: dict[str, Any] = {
        "benchmark": "converge",
        "scenario": str(SCENARIO.relative_to(ROOT)),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "timer_period_s": params.increase_period_s,
        "head_start_s": head_start(scenario),
        "predicted_s": predicted_convergence_s(params, capacity_bps, head_start_s=head_start(scenario)),
        "criterion": f"{WINDOW_PERIODS}-period averages within {WITHIN:.0%}, held {HOLD_PERIODS} periods",
        "load_start": load(),
    }
    report["simulator"] = [sim_run(scenario, int(s)) for s in args.sim_seeds.split(",") if s]
    report["load_after_simulator"] = load()
    with tempfile.TemporaryDirectory(prefix="bench-converge.") as tmp:
        report["emulator"] = [emulated_run(scenario, Path(tmp) / str(i), params.increase_period_s)
                              for i in range(args.emulated)]  # fmt: skip
    report["load_end"] = load()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
