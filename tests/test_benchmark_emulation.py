"""The emulation benchmark's own arithmetic and command line (its figures come from running it)."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks import bringup as bench


def test_summarise_is_p50_p95_max_with_n() -> None:
    assert bench.summarise(list(map(float, range(1, 21)))) == {"n": 20, "p50": 10.5, "p95": 19.05, "max": 20}
    assert bench.summarise([3.0]) == {"n": 1, "p50": 3.0, "p95": 3.0, "max": 3.0}


def _run(error: str | None, tables_s: float) -> dict[str, object]:
    return {
        "error": error,
        "teardown_s": 1.0,
        "phases_s": {"tables_installed_s": tables_s},
        "build_steps_s": {"daemons_s": 0.5},
        "peak_rss_mb": {"ovs-vswitchd_sum": 100},
        "idle_cpu_pct": {},
        "load": {"avg_before": [1.0, 1.0, 1.0], "cpu_busy_frac": 0.5, "load1_max": None},
    }


def test_summary_is_over_the_runs_that_came_up() -> None:
    runs = [_run(None, 2.0), _run(None, 4.0), _run("TimeoutError: 3/20 switches connected", 99.0)]
    figures = bench.summary(runs)
    assert figures["phases_s.tables_installed_s"] == {"n": 2, "p50": 3.0, "p95": 3.9, "max": 4.0}
    assert figures["build_steps_s.daemons_s"]["n"] == 2
    assert figures["load.cpu_busy_frac"]["p50"] == 0.5
    assert "load.avg_before" not in figures and "load.load1_max" not in figures
    assert bench.summary([_run("boom", 1.0)]) == {}


def test_cases_are_keyed_by_their_sharding() -> None:
    assert bench.case_key("k4", 1, "veth") == "k4"
    assert bench.case_key("k16", 8, "veth") == "k16-s8"
    assert bench.case_key("k4", 2, "vxlan") == "k4-s2-vxlan"
    assert bench.case_key("k4", 1, "veth", shells=True) == "k4_baseline"
    assert bench.case_key("k16", 8, "veth", cables="patch") == "k16-s8-patch"
    assert bench.case_key("k16", 8, "veth", cables="auto") == "k16-s8"


def test_patch_cables_cannot_be_asked_for_with_shaped_links(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse(["--cases", "k16", "--cables", "patch,veth"])
    assert "add --scale none" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse(["--cases", "k16", "--cables", "copper", "--scale", "none"])
    assert "--cables: 'copper'" in capsys.readouterr().err
    args = bench.parse(["--cases", "k16", "--cables", "patch,veth", "--scale", "none"])
    assert args.cables == ["patch", "veth"] and args.scale is None


def test_shards_default_per_case_and_can_be_given() -> None:
    assert bench.parse(["--cases", "k4,k16,rail1024"]).plan == [("k4", 1), ("k16", 8), ("rail1024", 4)]
    assert bench.parse(["--cases", "k4,k8", "--shards", "1,2"]).plan == [
        ("k4", 1), ("k4", 2), ("k8", 1), ("k8", 2),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--cases", "k5"], "--cases"),
        (["--cases", "k4", "--shards", "21"], "--shards"),
        (["--cases", "k4", "--shards", "two"], "--shards"),
        (["--repeat", "0"], "--repeat"),
        (["--crossing", "gre"], "--crossing"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_sampler_reads_real_processes_and_machine_load() -> None:
    sampler = bench.Sampler(lambda: {"this_process": [os.getpid()], "ovs-vswitchd": []}, period_s=0.05)
    sampler.start()
    deadline = time.monotonic() + 10  # a few samples, however slow the machine
    while len(sampler.load1) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    load = sampler.stop()
    assert sampler.stop() == load  # once
    peaks = sampler.peaks()
    assert peaks["this_process_sum"] > 10 and peaks["total"] == peaks["this_process_sum"]
    assert peaks["ovs-vswitchd_sum"] == 0 and peaks["ovs-vswitchd_count"] == 0
    assert 0.0 <= load["cpu_busy_frac"] <= 1.0 and load["load1_max"] >= 0 and load["sampled_s"] > 0
