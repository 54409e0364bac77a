"""Two RoCE flows converging under DCQCN on the emulated k=4 fat-tree (`scenarios/converge-k4.yaml`): h1
alone at line rate, h3 joining 182 timer periods later, both into h16.

What the DCQCN paper's fluid model predicts is a mean over runs; one run's rates wander tens of percent
around equal (docs/congestion.md), so the time of convergence is judged on the mean of six emulated runs
by `benchmarks/converge.py`, not here.  One run is checked against what one run of the simulator does
(16 seeds: the late signed gap -0.15..0.23, the link full): DCQCN cut both QPs, they share h16's link
without one starving (their rates averaged over periods 500-1000 after the join within 35 % of each
other, the first flow ahead or behind), and they keep the link full.  The gap right after the join is
large in the model (0.41 over the first 100 periods), so the flows really started apart.

If the run's own headroom check says the emulator was overloaded, only what holds at any load is checked."""

from __future__ import annotations

from typing import Any

import pytest

from emulation.mnfabric import mininet_available
from emulation.runner import run_scenario
from flowsim.converge import ConvergeCase, emulated_rates, per_run
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from tests.emulation_support import ovs_daemon_fixture, require_emulation

__all__ = ["ovs_daemon_fixture"]

SCENARIO = ROOT / "scenarios" / "converge-k4.yaml"


@pytest.fixture(scope="module", name="run")
def run_fixture(
    ovs_daemon: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ConvergeCase, dict[str, Any]]:
    require_emulation(mininet_available())
    case = ConvergeCase.of(load_scenario(SCENARIO))
    summary = run_scenario(case.scenario, tmp_path_factory.mktemp("converge") / "run", write=False)
    return case, emulated_rates(case, summary)


def test_dcqcn_cut_both_flows_and_the_model_has_them_start_apart(run: tuple[ConvergeCase, Any]) -> None:
    case, rates = run
    assert rates["cnps"] and rates["cnps"] > 0
    assert rates["a"].min() < case.params.line_rate_bps and rates["b"].min() < case.params.line_rate_bps
    assert case.fluid()["gaps"][0] > 0.3


def test_the_two_flows_share_the_link_as_one_simulated_run_does(run: tuple[ConvergeCase, Any]) -> None:
    case, rates = run
    alone = per_run(case, rates)
    print(f"emulated run: {alone}")
    if rates["overloaded"]:
        pytest.skip("the emulator was overloaded: only what holds at any load was checked")
    assert abs(alone["late_signed_gap"]) <= 0.35
    assert rates["link_busy"] >= 0.85
