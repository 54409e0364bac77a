"""RoCE incast on the emulated k=4 fat-tree, without and with DCQCN (scenarios/incast-k4.yaml): 8 senders
into one receiver at twice its link's rate.  Open loop, the receiver's switch port drops about half; with
DCQCN (phantom-queue ECN marking at every shaped switch egress, real CNPs, per-QP rate control) the senders
slow down instead: almost nothing is lost, the link stays busy while they oversubscribe it (judged from the
receiver's arrivals per 0.1 s; `tests/test_incast_figures.py`), the senders share it fairly, the marked
queue stays bounded, and a victim sharing only its first hop with the incast keeps its rate.

The run's own headroom check says whether the emulator kept up; if it did not, only what holds at any load
is checked (DCQCN acted, lost far less than open loop) and the test says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from emulation.compare import cc_figures
from emulation.ecnmark import ecn_marking_available
from emulation.mnfabric import mininet_available
from emulation.runner import run_scenario
from fabriclab.cli import main
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from tests.emulation_support import ovs_daemon_fixture, require_emulation

__all__ = ["ovs_daemon_fixture"]

SCENARIO = ROOT / "scenarios" / "incast-k4.yaml"


@pytest.fixture(scope="module", name="runs")
def runs_fixture(ovs_daemon: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    require_emulation(mininet_available() or ecn_marking_available())
    scenario = load_scenario(SCENARIO)
    out = tmp_path_factory.mktemp("incast")
    return {cc: run_scenario(scenario.with_cc(cc), out / cc, write=False) for cc in ("none", "dcqcn")}


def incast(summary: dict[str, Any], job: int = 0) -> dict[str, Any]:
    (rep,) = summary["repetitions"]
    return next(r["incast"] for r in rep["replays"] if r["job"] == job)


def overloaded(summary: dict[str, Any]) -> bool:
    return bool(summary["emulator_overloaded"])


def test_open_loop_incast_loses_half_at_the_bottleneck(runs: dict[str, dict[str, Any]]) -> None:
    none = incast(runs["none"])
    assert none["sent_packets"] == 8 * 2048
    if not overloaded(runs["none"]):
        assert none["loss_pct"] >= 40.0
        assert none["bottleneck_goodput"] >= 0.9  # the link runs full, dropping the rest
    assert cc_figures(runs["none"]["repetitions"]) == {"cc": "none"}


def test_dcqcn_keeps_the_incast_lossless_busy_and_fair(runs: dict[str, dict[str, Any]]) -> None:
    dcqcn, none = incast(runs["dcqcn"]), incast(runs["none"])
    cc = cc_figures(runs["dcqcn"]["repetitions"])
    assert cc["cnps_sent"] > 0 and cc["cnps_received"] > 0 and cc["rate_cuts"] > 0
    assert cc["switch_marked"] > 0 and cc["ports_with_marks"] >= 1
    if overloaded(runs["dcqcn"]) or overloaded(runs["none"]):
        pytest.skip("the emulator was overloaded: only what holds at any load was checked")
    assert dcqcn["loss_pct"] < none["loss_pct"] / 4
    assert dcqcn["loss_pct"] < 1.0
    assert dcqcn["bottleneck_goodput"] >= 0.9  # while the senders oversubscribe h16's link
    assert dcqcn["span_goodput"] >= 0.8  # also in the tail, when too few senders are left to fill it
    assert dcqcn["jain"] >= 0.9
    (rep,) = runs["dcqcn"]["repetitions"]
    port = rep["cc"]["marking"]["ports"]["leaf8:2"]
    assert 0 < cc["peak_queue_bytes"] <= 48 * 1082  # the port's buffer (buffer_packets: 48)
    assert port["overflow"] <= 0.01 * port["packets"]  # the marked queue rarely reached the buffer


def test_marks_happen_at_the_receivers_port(runs: dict[str, dict[str, Any]]) -> None:
    """h16 hangs off leaf8:2: that egress is the bottleneck, so nearly every mark is made there."""
    (rep,) = runs["dcqcn"]["repetitions"]
    marking = rep["cc"]["marking"]
    ports = marking["ports"]
    assert max(ports, key=lambda name: ports[name]["marked"]) == "leaf8:2"
    assert ports["leaf8:2"]["marked"] >= 0.9 * marking["marked"]
    assert marking["marking_ports"] == 80  # every switch egress: both ends of 32 cables, one of 16


def test_the_victim_keeps_its_rate(runs: dict[str, dict[str, Any]]) -> None:
    victim = incast(runs["dcqcn"], job=1)
    assert victim["sent_packets"] == 256
    if overloaded(runs["dcqcn"]):
        pytest.skip("the emulator was overloaded: the victim's delivery is not judged")
    assert victim["received_packets"] == 256
    assert victim["rate_fraction"][0] >= 0.8


def test_cnps_and_rates_are_reported_per_qp(runs: dict[str, dict[str, Any]]) -> None:
    (rep,) = runs["dcqcn"]["repetitions"]
    qps = rep["cc"]["qps"]
    incast_qps = [q for q in qps.values() if q["dst"] == "h16"]
    assert len(incast_qps) == 8
    assert all(q["cuts"] >= 1 and q["final_rate_bps"] <= q["max_rate_bps"] for q in incast_qps)
    assert all(min(r for _, r in q["rates"]) < q["max_rate_bps"] for q in incast_qps)


def test_the_simulator_agrees_within_15_percent(runs: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """`fabriclab sim` on the same file under DCQCN: the bottleneck's busy fraction and the senders'
    fairness within 15 % of the emulator's (its whole-span figure: the simulator's run has no tail)."""
    out = tmp_path / "sim"
    assert main(["sim", str(SCENARIO), "--policies", "ecmp", "--cc", "dcqcn", "-o", str(out)]) == 0
    cc = json.loads((out / "summary.json").read_text())["policies"]["ecmp"]["cc"]
    assert cc["bottleneck"]["link"].startswith("leaf8:2->h16")
    if overloaded(runs["dcqcn"]):
        pytest.skip("the emulator was overloaded: its figures are not the fabric's")
    emulated = incast(runs["dcqcn"])
    assert cc["bottleneck"]["utilisation"] == pytest.approx(emulated["span_goodput"], rel=0.15)
    assert cc["jain_senders"] == pytest.approx(emulated["jain"], rel=0.15)
