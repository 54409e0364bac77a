"""`fabriclab sim` and `fabriclab sweep` end to end: scenarios and ad hoc runs write the summary schema and
plots, bad input is one line and exit 2 with nothing written, sweeps give identical rows on local processes,
an in-process Dask LocalCluster and a real `dask scheduler` with two `dask worker` processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flowsim.metrics import FIELDS as SIM_FIELDS
from flowsim.metrics import compare, comparison_markdown
from flowsim.network import Network
from flowsim.scenario import workload_of
from flowsim.sweep import Sweep, load_sweep, run_dask, run_local
from labspec.scenario import emulator_refuses, load_scenario
from tests.conftest import ROOT
from topologies.errors import InputError

FIELDS = set(SIM_FIELDS)
TOPO = (ROOT / "topologies" / "fat-tree-k4.yaml").as_posix()


def fabriclab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "fabriclab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.slow
def test_sim_scenario_writes_summary_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    done = fabriclab(
        "sim", "scenarios/alltoall-k4.yaml", "--policies", "static,ecmp,spray,adaptive", "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"static", "ecmp", "spray", "adaptive"}
    for row in summary["policies"].values():
        assert set(row) >= FIELDS
    static = summary["policies"]["static"]
    line = 2e6 / 8 / 1e9  # 400G=2M: NICs at 2 Mb/s, in GB/s
    paced = 185 * 1082 / 1e9  # 185 packets/s of 1082 bytes on the wire
    assert static["busbw_GBps"] < paced * 1024 / 1082 <= line  # payload, paced, below line rate
    assert static["slowdown"] >= 1.0 and summary["scale"] == "400G=2M"
    for name in ("report.md", "fct-cdf.png", "busbw.png", "utilisation.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "fct-cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".sim.*"))  # no temporary folder left


@pytest.mark.slow
def test_sim_ad_hoc_on_the_shipped_leaf_spine(tmp_path: Path) -> None:
    out = tmp_path / "perm"
    done = fabriclab(
        "sim",
        "--topology",
        "topologies/leaf-spine-32x32.yaml",
        "--traffic",
        "permutation",
        "--seed",
        "1",
        "--policies",
        "ecmp,spray",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "summary.json").read_text())["policies"]
    assert rows["spray"]["throughput_ratio"] >= 0.99 > rows["ecmp"]["throughput_ratio"]
    assert "ecmp" in done.stdout and "results:" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--topology", TOPO, "--traffic", "permutation", "--policies", "ecmp,sprey"],
            "unknown routing policy 'sprey'",
        ),
        (["--topology", TOPO, "--traffic", "permutashun"], "unknown workload 'permutashun'"),
        (["--topology", TOPO, "--traffic", "shift:99"], "needs an integer in 1..15"),
        (["--topology", TOPO, "--traffic", "incast:4", "--hosts", "h1..h99"], "unknown host 'h17'"),
        (["--topology", TOPO, "--traffic", "alltoall", "--threshold", "1.5"], "threshold: must be in (0, 1]"),
        (["--topology", TOPO, "--traffic", "alltoall", "--engine", "nope"], "unknown routing engine 'nope'"),
        (["--topology", TOPO], "--traffic: needed with --topology"),
        (["scenarios/alltoall-k4.yaml", "--traffic", "alltoall"], "--traffic/--hosts are for ad hoc runs"),
    ],
)
def test_sim_bad_input_is_one_line_exit_2_nothing_written(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    done = fabriclab("sim", *args, "-o", str(out))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def scenario_file(tmp_path: Path, traffic: str, controller: str = "{engine: ftree}") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"fabriclab: 1\nname: t\ntopology: {TOPO}\ncontroller: {controller}\nduration_s: 5\n"
        f"traffic:\n  - {traffic}\n"
    )
    return path


def test_scenario_policy_is_validated_through_the_registry(tmp_path: Path) -> None:
    bad = scenario_file(tmp_path, "{kind: udp, src: h1, dst: h2, rate_pps: 10}", "{policy: ecnp}")
    with pytest.raises(InputError, match=r"s.yaml:4: controller.policy: unknown routing policy 'ecnp'"):
        load_scenario(bad)
    bad = scenario_file(
        tmp_path, "{kind: udp, src: h1, dst: h2, rate_pps: 10}", "{policy: adaptive, interval_ms: 1}"
    )
    with pytest.raises(InputError, match=r"controller.interval_ms: must be within 10..60000"):
        load_scenario(bad)
    ok = load_scenario(
        scenario_file(tmp_path, "{kind: udp, src: h1, dst: h2, rate_pps: 10}", "{policy: spray}")
    )
    assert emulator_refuses(ok) is None  # every routing policy runs on the emulator too (docs/policies.md)


def test_scenario_kv_transfer_and_trace_become_ordered_flows(tmp_path: Path) -> None:
    kv = (
        "{kind: kv-transfer, model: llama3-70b, prompt_tokens: 256, prefill: h1, decode: h9, requests: 2, "
        "arrival_rate_per_s: 50, layer_time_us: 100}"
    )
    scenario = load_scenario(scenario_file(tmp_path, kv))
    net = Network.build(scenario.fabric)
    (batch,) = workload_of(scenario, net).batches
    assert batch.n == 2 * 80 * 16  # every page of every layer of both requests an RDMA WRITE
    assert batch.payload_frac is not None
    payload = batch.size_bytes * batch.payload_frac
    assert payload.sum() == pytest.approx(2 * 256 * 320 * 1024)  # 320 KiB per token of llama3-70b
    assert batch.size_bytes[0] == 64 * (1024 + 58)  # a 16-token page of a layer (64 KiB): 64 packets
    assert batch.after is not None and (batch.after[1:] >= 0).all()  # one QP: in order
    trace = ROOT / "scenarios" / "traces" / "allreduce-ring-16.jsonl"
    scenario = load_scenario(scenario_file(tmp_path, f"{{kind: trace, file: {trace.as_posix()}}}"))
    (batch,) = workload_of(scenario, net).batches
    assert batch.n == 30 * 16 and batch.start_s.max() == pytest.approx(29 * 1e-3)
    scaled = load_scenario(scenario_file(
        tmp_path, f"{{kind: trace, file: {trace.as_posix()}, time_scale: 2, size_scale: 0.5}}"))  # fmt: skip
    (half,) = workload_of(scaled, net).batches
    assert half.start_s.max() == pytest.approx(2 * 29 * 1e-3)  # both instruments stretch time alike
    assert batch.payload_frac is not None and half.payload_frac is not None
    whole = (batch.size_bytes * batch.payload_frac).sum()
    assert (half.size_bytes * half.payload_frac).sum() == pytest.approx(whole / 2)
    bad = scenario_file(
        tmp_path, "{kind: kv-transfer, model: llama3-70b, prompt_tokens: 8, prefill: h1, decode: h99}"
    )
    with pytest.raises(InputError, match=r"traffic\[0\].decode: unknown host 'h99'"):
        load_scenario(bad)


def test_emulator_refuses_what_it_cannot_run_before_building_anything(tmp_path: Path) -> None:
    """KV-cache transfers and traces run on both instruments; at line rate they need shaped links (an
    unshaped link's line rate is the machine's)."""
    kv = "{kind: kv-transfer, model: llama3-70b, prompt_tokens: 256, prefill: h1, decode: h9}"
    path = scenario_file(tmp_path, kv, "{policy: ecmp}")
    assert emulator_refuses(load_scenario(path)) is not None
    out = tmp_path / "emu"
    done = fabriclab("scenario", "run", str(path), "-o", str(out))
    assert done.returncode == 2
    assert "scale: RoCE senders at line rate need shaped links" in done.stderr
    assert not out.exists()
    done = fabriclab("compare", str(path), "--policies", "ecmp,local-ar", "-o", str(out))
    assert done.returncode == 2 and "local-ar is simulated only" in done.stderr, done.stderr
    assert not out.exists()
    paced = path.with_name("paced.yaml")
    paced.write_text(path.read_text().replace("decode: h9}", "decode: h9, rate_pps: 100}"))
    assert emulator_refuses(load_scenario(paced)) is None


@pytest.mark.slow
def test_moe_scenario_simulates_under_spray(tmp_path: Path) -> None:
    """The shipped 4,096-GPU MoE scenario end to end (the documented command runs all four policies; the
    benchmark times those): 16.8 M flows, checked in seconds, simulated at the NICs' line rate."""
    started = time.perf_counter()
    scenario = load_scenario(ROOT / "scenarios" / "moe-alltoall-4096gpu.yaml")
    assert len(scenario.fabric.hosts) == 4096 and time.perf_counter() - started < 30
    out = tmp_path / "moe"
    done = fabriclab("sim", "scenarios/moe-alltoall-4096gpu.yaml", "--policies", "spray", "-o", str(out))
    assert done.returncode == 0, done.stderr
    row = json.loads((out / "summary.json").read_text())["policies"]["spray"]
    assert row["throughput_ratio"] == pytest.approx(1.0, rel=1e-3)  # store-and-forward: 3 hops, not 1
    # 400G NICs carry 50 GB/s on the wire, of which MTU 1024 / 1082 bytes are payload
    assert row["busbw_GBps"] == pytest.approx(50.0 * 4095 / 4096 * 1024 / 1082, rel=1e-3)
    assert row["slowdown"] == pytest.approx(1.0, rel=1e-3)
    assert row["details"]["engine"]["members"] == 4096 * 4095


def _row(
    slowdown: float | None, completion: float | None, goodput: float | None, **more: Any
) -> dict[str, Any]:
    return {"slowdown": slowdown, "completion_s": completion, "goodput_gbps": goodput, **more}


def test_comparison_with_an_emulation_summary() -> None:
    sim = {
        "scenario": "s",
        "scale": "400G=500K",
        "policies": {
            "static": _row(1.26, 10.1, 0.0042, loss_pct=19.7),
            "ecmp": _row(1.55, 12.4, 0.0035),
            "spray": _row(1.0, 8.0, 0.0054),
        },
    }
    close: dict[str, Any] = {
        "scenario": "s",
        "scale": "400G=0.5M",  # the same speeds, written otherwise
        "policies": {
            "static": _row(1.20, 9.9, 0.0044, loss_pct=19.6, emulator_overloaded=False),
            "ecmp": _row(1.50, 12.0, 0.0036, emulator_overloaded=False),
            "spray": _row(1.0, 8.0, 0.0054, emulator_overloaded=False),
            "adaptive": _row(1.0, 8.0, 0.0054, emulator_overloaded=False),
        },
    }
    got = compare(sim, close)
    assert got["comparable"] and got["why_not"] is None and got["agree"], got
    assert list(got["policies"]) == ["static", "ecmp", "spray"] and got["only_emu"] == ["adaptive"]
    assert got["policies"]["static"]["slowdown"]["rel_diff"] == pytest.approx(0.06 / 1.20)
    assert got["max_rel_diff"] == pytest.approx(0.06 / 1.20)
    assert got["sim_order"] == got["emu_order"] == ["spray", "static", "ecmp"]
    far = {
        **close,
        "policies": {**close["policies"], "static": _row(2.0, 16.0, 0.003, emulator_overloaded=False)},
    }
    got = compare(sim, far)
    assert got["comparable"] and not got["same_order"] and not got["agree"]
    assert "**Disagree**" in comparison_markdown(got) and "DIFFERENT" in comparison_markdown(got)
    # a figure missing on either side: not comparable, with the reason, never "agree"
    missing = {**close, "policies": {**close["policies"], "ecmp": _row(None, None, 0.0036)}}
    got = compare(sim, missing)
    assert not got["comparable"] and not got["agree"] and not got["same_order"]
    assert "ecmp: slowdown missing in the emulation" in got["why_not"]
    assert "**Not comparable**" in comparison_markdown(got)
    assert not compare(sim, {**close, "scale": "400G=200M"})["comparable"]  # other link speeds
    busy = {**close["policies"]["static"], "emulator_overloaded": True}
    assert (
        "overloaded under static"
        in compare(sim, {**close, "policies": {**close["policies"], "static": busy}})["why_not"]
    )
    assert compare(sim, {**close, "policies": {}})["why_not"] == "no policy ran in both"


SWEEP = """fabriclab: 1
name: tiny
policies: [static, ecmp, spray, adaptive]
workloads: [permutation, "shift:3"]
fabrics:
  - {kind: fat-tree, k: 4}
  - {kind: leaf-spine, leaves: 4, spines: 4, hosts_per_leaf: 4}
seeds: [1, 2]
size: 1MiB
max_points: 64
"""


def test_sweep_over_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.replace("max_points: 64", "max_points: 10"))
    out = tmp_path / "out"
    done = fabriclab("sweep", str(path), "-o", str(out))
    assert done.returncode == 2 and "the grid has 32 points" in done.stderr and "cap of 10" in done.stderr
    assert not out.exists()
    path.write_text(SWEEP)
    done = fabriclab("sweep", str(path), "-o", str(out), "--max-points", "31")
    assert done.returncode == 2 and "cap of 31" in done.stderr and not out.exists()


def test_sweep_with_a_dask_address_that_does_not_answer(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    started = time.perf_counter()
    done = fabriclab(
        "sweep", str(path), "-o", str(out), "--dask", f"tcp://127.0.0.1:{free_port()}", "--dask-timeout", "2"
    )
    assert done.returncode == 2 and "no Dask scheduler answers at" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
    assert time.perf_counter() - started < 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_sweep_local_processes_write_table_and_plots(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    done = fabriclab("sweep", str(path), "-o", str(out), "--workers", "2")
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert len(rows) == 32 and {r["policy"] for r in rows} == {"static", "ecmp", "spray", "adaptive"}
    assert (out / "results.csv").read_text().count("\n") == 33
    for name in ("report.md", "throughput-vs-size.png", "busbw-vs-size.png"):
        assert (out / name).stat().st_size > 0


def test_shipped_sweep_file_expands_and_runs() -> None:
    """`sweeps/policies-vs-size.yaml`: 64 points in 16 units; two units run here (the whole file takes
    about 40 s on 2 cores and runs the same code)."""
    sweep = load_sweep(ROOT / "sweeps" / "policies-vs-size.yaml")
    assert sweep.points == 64 and len(sweep.tasks) == 16
    part = Sweep(sweep.spec, sweep.file, sweep.tasks[:2])
    rows = run_local(part, workers=1)
    assert len(rows) == 8 and all(0 < r["throughput_ratio"] <= 1.01 for r in rows)


@pytest.mark.slow
def test_sweep_rows_identical_on_processes_localcluster_and_a_real_dask_cluster(tmp_path: Path) -> None:
    from distributed import LocalCluster

    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    sweep = load_sweep(path)
    local = run_local(sweep, workers=2)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:  # type: ignore[no-untyped-call]
        in_process = run_dask(sweep, cluster.scheduler_address)
    assert in_process == local
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    procs = [
        subprocess.Popen(
            [*dask, "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    try:
        address = f"tcp://127.0.0.1:{port}"
        worker = [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--nthreads",
            "1",
            "--no-dashboard",
        ]
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    worker,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=tmp_path,
                )
            )
        from distributed import Client

        with Client(address, timeout="30s") as client:  # type: ignore[no-untyped-call]
            client.wait_for_workers(2, timeout=60)
            workers = client.scheduler_info()["workers"]
            assert len(workers) == 2
        out = tmp_path / "dask-out"
        done = fabriclab("sweep", str(path), "-o", str(out), "--dask", address)
        assert done.returncode == 0, done.stderr
        report = json.loads((out / "results.json").read_text())
        assert report["executor"] == f"dask {address}"
        assert report["rows"] == local
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.mark.slow
def test_flowsim_benchmark_script_reports_json() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.simspeed", "--quick", "--parts", "solve,scaling", "--runs", "3"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    solve = report["solve"]
    assert solve["flows"] == 64 * 63 and solve["solve"]["n"] >= 3 and solve["flows_per_s"] > 0
    assert solve["rounds"] <= solve["baseline_one_level_per_round"]["rounds"]
    assert [row["k"] for row in report["scaling"]["fabrics"]] == [4, 8]
    assert len(report["load_start"]) == 3
