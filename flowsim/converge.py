"""Two flows converging under DCQCN: what the paper's fluid model predicts and how runs are judged.

One case, `scenarios/converge-k4.yaml`'s shape: a first RoCE flow alone at line rate, a second joining
`head_start_s` later, both through one link.  The prediction is `flowsim.fluidmodel` at the scenario's
scaled DCQCN parameters; the instruments (the simulator's `flowsim.ccsim`, the emulator's senders) are
judged the same way on the same grid: each flow's rate once per timer period for `JUDGED_PERIODS` periods
from the second flow's start, averaged over the runs and over a moving `WINDOW_PERIODS` window, settled
when that gap stays within `WITHIN` (`flowsim.fluidmodel.convergence_figures`).  Used by
`benchmarks/converge.py` and the tests; reads run summaries, runs nothing but the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flowsim.ccresult import run_cc
from flowsim.ccsim import CcSimulator
from flowsim.engine import SimConfig
from flowsim.fluidmodel import convergence_figures, predicted_convergence_s, solve
from flowsim.network import F64, Network
from flowsim.scenario import cc_setup, workload_of
from labspec.scenario import Scenario
from labspec.trafficspec import RoceIncast
from traffic.dcqcn import DcqcnParams

JUDGED_PERIODS, WINDOW_PERIODS, WITHIN = 1000, 100, 0.1
#: One run's signed gap is averaged over these periods (after the second flow's start) for `per_run`.
LATE_PERIODS = (500, 1000)


@dataclass(frozen=True)
class ConvergeCase:
    scenario: Scenario
    network: Network
    params: DcqcnParams
    head_start_s: float

    @classmethod
    def of(cls, scenario: Scenario) -> ConvergeCase:
        items = scenario.spec.traffic
        if len(items) != 2 or not all(isinstance(i, RoceIncast) for i in items):
            raise ValueError("a convergence case is two roce-incast items (one sender each)")
        second = items[1]
        assert isinstance(second, RoceIncast)
        network = Network.build(scenario.fabric, scenario.scale)
        return cls(scenario, network, cc_setup(scenario, network).params, float(second.start_s))

    @property
    def period_s(self) -> float:
        return self.params.increase_period_s

    @property
    def grid_s(self) -> F64:
        """Seconds since the second flow's start: the middle of each judged timer period."""
        grid: F64 = (np.arange(JUDGED_PERIODS, dtype=np.float64) + 0.5) * self.period_s
        return grid

    def fluid(self) -> dict[str, Any]:
        """The fluid model judged as the instruments are."""
        until = self.head_start_s + (JUDGED_PERIODS + 1) * self.period_s
        trace = solve(self.params, self.params.line_rate_bps, [0.0, self.head_start_s], until)
        at = self.head_start_s + self.grid_s
        a = np.interp(at, trace.t_s, trace.rate_bps[:, 0])
        b = np.interp(at, trace.t_s, trace.rate_bps[:, 1])
        return judge(self, a, b)

    def fluid_raw_settled_s(self) -> float | None:
        """The model's own rates (no averaging) within 10 % for good."""
        return predicted_convergence_s(self.params, self.params.line_rate_bps, self.head_start_s, WITHIN)


def judge(case: ConvergeCase, a_runs: F64, b_runs: F64) -> dict[str, Any]:
    return convergence_figures(case.grid_s, a_runs, b_runs, WINDOW_PERIODS, WITHIN)


def simulated_rates(case: ConvergeCase, seed: int) -> dict[str, Any]:
    """One simulator run: the two flows' DCQCN rates on the grid."""
    setup = cc_setup(case.scenario, case.network)
    workload = workload_of(case.scenario, case.network)
    config = SimConfig(policy="ecmp", seed=seed)
    sim = CcSimulator(case.network, workload, config, setup, sample_every_s=case.period_s / 4)
    _, stats = run_cc(sim, until_s=case.head_start_s + (JUDGED_PERIODS + 1) * case.period_s)
    first = stats.row_job == 0
    at = case.head_start_s + case.grid_s
    rates = stats.sample_rate_bps
    return {
        "seed": seed,
        "a": np.interp(at, stats.sample_t_s, rates[:, first][:, 0]),
        "b": np.interp(at, stats.sample_t_s, rates[:, ~first][:, 0]),
        "cnps": round(stats.cnps),
    }


def _steps(history: list[list[float]], t_s: F64) -> F64:
    """A QP's rate (a step function given at its changes) at the times `t_s`; 0 before its first."""
    times = np.array([h[0] for h in history], float)
    values = np.array([h[1] for h in history], float)
    at = np.searchsorted(times, t_s, side="right") - 1
    out: F64 = np.where(at >= 0, values[np.maximum(at, 0)], 0.0)
    return out


def emulated_rates(case: ConvergeCase, summary: dict[str, Any]) -> dict[str, Any]:
    """One emulated run (`emulation.runner.run_scenario`'s summary): the two QPs' DCQCN rates on the grid,
    and what h16 received over the judged periods as a fraction of its link."""
    (rep,) = summary["repetitions"]
    qps = sorted(rep["cc"]["qps"].values(), key=lambda q: int(q["job"]))
    if len(qps) != 2:
        raise ValueError(f"a convergence run has two QPs, this one {len(qps)}")
    at = case.head_start_s + case.grid_s
    delivered = {r["job"]: r["delivered"] for r in rep["replays"]}
    bin_s = float(delivered[0]["bin_s"])
    first, last = int(at[0] // bin_s), int(at[-1] // bin_s)
    packets = sum(sum(delivered[j]["packets"][first:last]) for j in (0, 1))
    frame = next(iter(cc_setup(case.scenario, case.network).frame_bytes.values()), 1082)
    busy = packets * frame * 8 / ((last - first) * bin_s) / case.params.line_rate_bps
    return {
        "overloaded": bool(summary["emulator_overloaded"]),
        "a": _steps(qps[0]["rates"], at),
        "b": _steps(qps[1]["rates"], at),
        "cnps": rep["cc"].get("cnps_sent"),
        "link_busy": round(busy, 3),
    }


def per_run(case: ConvergeCase, run: dict[str, Any]) -> dict[str, Any]:
    """One run on its own: its gap (which wanders), and its signed gap (first flow minus second, over the
    faster's mean) averaged over `LATE_PERIODS`."""
    a, b = np.asarray(run["a"]), np.asarray(run["b"])
    lo, hi = LATE_PERIODS
    late = float((a[lo:hi].mean() - b[lo:hi].mean()) / max(a[lo:hi].mean(), b[lo:hi].mean(), 1e-300))
    own = judge(case, a, b)
    extra = {k: v for k, v in run.items() if k not in ("a", "b")}
    return extra | {"settled_s": own["settled_s"], "gaps": own["gaps"], "late_signed_gap": round(late, 3)}


__all__ = [
    "JUDGED_PERIODS",
    "LATE_PERIODS",
    "WINDOW_PERIODS",
    "WITHIN",
    "ConvergeCase",
    "emulated_rates",
    "judge",
    "per_run",
    "simulated_rates",
]
