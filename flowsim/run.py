"""Run a workload under several policies, each against the same non-blocking reference (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flowsim.ccresult import run_cc
from flowsim.ccsim import CcSetup, CcSimulator, check_supported
from flowsim.engine import Progress, SimConfig, SimResult, Simulator
from flowsim.metrics import reference, summarise
from flowsim.network import Network
from flowsim.policies import sim_policies
from flowsim.workload import Workload


@dataclass
class PolicyRun:
    result: SimResult
    summary: dict[str, Any]


@dataclass
class Outcome:
    network: Network
    workload: Workload
    ideal: SimResult
    runs: dict[str, PolicyRun]
    config: SimConfig
    #: The scenario's name, when the workload came from one (the comparison checks it).
    scenario: str | None = None
    #: DCQCN's setup when the RoCE flows ran under it (None: max-min, `cc: none`).
    cc: CcSetup | None = None

    def summary(self) -> dict[str, Any]:
        """The shared schema: {"policies": {NAME: {slowdown, completion_s, ...}}} plus context; under DCQCN
        a top-level `cc` (the parameters) and a `cc` block per policy (`CcStats.block`)."""
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "fabric": self.network.fabric.summary(),
            "workload": self.workload.label,
            "engine": self.config.engine,
            "seed": self.config.seed,
            "policy_params": {
                "interval_ms": self.config.params.interval_ms,
                "threshold": self.config.params.threshold,
                "hysteresis": self.config.params.hysteresis,
            },
            "scale": self.network.scale,
            "link_speeds": self.network.link_speeds,
            "policies": {name: run.summary for name, run in self.runs.items()},
        }
        if self.cc is not None:
            out["cc"] = cc_context(self.cc)
        return out


def cc_context(setup: CcSetup) -> dict[str, Any]:
    """The controller a run used: its name, parameters at the run's speeds, the model's time step."""
    p = setup.params
    return {
        "cc": "dcqcn" if setup.enabled else "none (open-loop senders)",
        "model": "fluid DCQCN (flowsim.ccsim); the reference run stays max-min on a non-blocking fabric",
        "dt_s": setup.step_s(),
        "line_rates_gbps": sorted({round(float(x) / 1e9, 9) for x in setup.line_bps}),
        "params": {k: v for k, v in vars(p).items() if k != "line_rate_bps"},
    }


def simulate(
    network: Network,
    workload: Workload,
    policies: Sequence[str],
    config: SimConfig,
    progress: Callable[[float, str], None] | None = None,
    scenario: str | None = None,
    cc: CcSetup | None = None,
) -> Outcome:
    """The ideal reference once, then every policy; progress is reported as a fraction of all runs.  With
    `cc`, each policy's RoCE flows run under DCQCN (`flowsim.ccsim`) against the same max-min reference."""
    registry = sim_policies()
    for name in policies:
        registry.create(name, config.params)  # unknown names and bad parameters fail before any work
    if cc is not None:
        check_supported(workload, list(policies), config.params)
    total = len(policies) + 1

    def part(i: int, label: str) -> Progress | None:
        if progress is None:
            return None
        return lambda fraction, what: progress((i + fraction) / total, f"{label}: {what}")

    ideal = Simulator(network, workload, replace(config, ideal=True), part(0, "ideal")).run()
    runs: dict[str, PolicyRun] = {}
    for i, name in enumerate(policies, 1):
        policy_config = replace(config, policy=name)
        if cc is None:
            result = Simulator(network, workload, policy_config, part(i, name)).run()
            runs[name] = PolicyRun(result, summarise(result, ideal, network, workload))
        else:
            result, stats = run_cc(CcSimulator(network, workload, policy_config, cc, part(i, name)))
            runs[name] = PolicyRun(
                result, {**summarise(result, ideal, network, workload), "cc": stats.block()}
            )
        if progress is not None:
            progress((i + 1) / total, f"{name} done")
    return Outcome(network, workload, ideal, runs, config, scenario, cc)


def reference_run(network: Network, workload: Workload, config: SimConfig) -> dict[str, Any]:
    """The non-blocking reference of a workload (per job completion, aggregate rate): what the emulator's
    figures divide by (`emulation.compare`), computed here as for every simulated policy."""
    ideal = Simulator(network, workload, replace(config, ideal=True)).run()
    out = reference(ideal, workload.job_infos())
    out["jobs"] = {str(k): v for k, v in out["jobs"].items()}
    return out


__all__ = ["Outcome", "PolicyRun", "cc_context", "reference_run", "simulate"]
