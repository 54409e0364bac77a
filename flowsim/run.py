"""Run a workload under several policies, each against the same non-blocking reference (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

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

    def summary(self) -> dict[str, Any]:
        """The shared schema: {"policies": {NAME: {slowdown, completion_s, ...}}} plus context."""
        return {
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


def simulate(
    network: Network,
    workload: Workload,
    policies: Sequence[str],
    config: SimConfig,
    progress: Callable[[float, str], None] | None = None,
    scenario: str | None = None,
) -> Outcome:
    """The ideal reference once, then every policy; progress is reported as a fraction of all runs."""
    registry = sim_policies()
    for name in policies:
        registry.create(name, config.params)  # unknown names and bad parameters fail before any work
    total = len(policies) + 1

    def part(i: int, label: str) -> Progress | None:
        if progress is None:
            return None
        return lambda fraction, what: progress((i + fraction) / total, f"{label}: {what}")

    ideal = Simulator(network, workload, replace(config, ideal=True), part(0, "ideal")).run()
    runs: dict[str, PolicyRun] = {}
    for i, name in enumerate(policies, 1):
        result = Simulator(network, workload, replace(config, policy=name), part(i, name)).run()
        runs[name] = PolicyRun(result, summarise(result, ideal, network, workload))
        if progress is not None:
            progress((i + 1) / total, f"{name} done")
    return Outcome(network, workload, ideal, runs, config, scenario)


def reference_run(network: Network, workload: Workload, config: SimConfig) -> dict[str, Any]:
    """The non-blocking reference of a workload (per job completion, aggregate rate): what the emulator's
    figures divide by (`emulation.compare`), computed here as for every simulated policy."""
    ideal = Simulator(network, workload, replace(config, ideal=True)).run()
    out = reference(ideal, workload.job_infos())
    out["jobs"] = {str(k): v for k, v in out["jobs"].items()}
    return out


__all__ = ["Outcome", "PolicyRun", "reference_run", "simulate"]
