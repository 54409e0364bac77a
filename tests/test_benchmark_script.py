"""The routing benchmark keeps working (its figures are produced by running it, not by tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_routing_benchmark_runs_and_reports_json() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.routing",
            "--cases",
            "ft8,torus6x6",
            "--engines",
            "ftree,minhop,dfsssp",
            "--repeats",
            "3",
            "--no-opensm",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {row["engine"]: row for row in report["results"] if row["case"] == "ft8"}
    assert set(rows) == {"ftree", "minhop", "dfsssp"}
    for row in rows.values():
        assert row["verified"] and row["deadlock_free_1vl"] and row["hosts"] == 128
        assert row["route_s"] > 0 and row["shifts_evaluated"] == 127 and row["repeats"] == 3
        assert row["route_s"] <= row["route_s_p95"] <= row["route_s_max"]
    assert rows["ftree"]["shift_worst_max_flows"] == 1
    assert rows["minhop"]["all_to_all_max_over_mean"] > rows["ftree"]["all_to_all_max_over_mean"]
    torus = {row["engine"]: row for row in report["results"] if row["case"] == "torus6x6"}
    assert "not a fat-tree" in torus["ftree"]["not_applicable"]
    assert torus["dfsssp"]["verified"] and torus["dfsssp"]["vls"] > 1
    assert len(report["machine"]["loadavg_before"]) == 3
    assert "max/mean" in done.stderr  # the at-a-glance table


@pytest.mark.emulation  # needs Open vSwitch; imported in the function, `require_emulation` escapes conftest
def test_controller_benchmark_runs_and_reports_json() -> None:
    from tests.emulation_support import require_emulation

    require_emulation()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.controlplane",
            "--quick",
            "--parts",
            "flow_rate,reroute",
            "--failures",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    rate = report["flow_rate"]
    assert rate["installed_on_switch"] == rate["flows"] and rate["flow_mods_per_s"] > 0
    assert rate["baseline_barrier_per_flow"]["flow_mods_per_s"] > 0
    k4 = report["reroute"]["k4"]
    assert k4["failures"] == 2 and k4["installed_ms"]["max"] > 0
