"""The emulator on real Mininet + OVS (userspace datapath) with the controller as its own process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess, free_port
from emulation.headroom import CLEAN_LOSS
from emulation.mesh import check_all_pairs
from emulation.mnfabric import MininetFabric, Scale, host_shells, listening, mininet_available
from emulation.ovs import OvsDaemon
from emulation.runner import offered_load, run_name_prefix, run_scenario
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from tests.emulation_support import (
    LOAD_SHARE,
    prefix_leftovers,
    require_emulation,
    scale_rates,
    until_clean,
)
from topologies.loader import load_topology
from topologies.model import Fabric

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"


@pytest.fixture(scope="module")
def daemon() -> Iterator[OvsDaemon]:
    require_emulation(mininet_available())
    d = OvsDaemon()
    try:
        d.ensure_running()
        yield d
    finally:
        d.stop_if_started()


def uncontrolled(fabric: Fabric, prefix: str) -> MininetFabric:
    """A Mininet fabric whose switches have no controller to reach (secure mode: no flows at all)."""
    addresses = SubnetManager(fabric).addresses.as_strings()
    return MininetFabric(fabric, addresses, controller=f"tcp:127.0.0.1:{free_port()}", name_prefix=prefix)


def overloaded(summary: dict[str, Any]) -> str | None:
    whys = [r["headroom"]["why"] for r in summary["repetitions"] if r["headroom"]["emulator_overloaded"]]
    return "; ".join(whys) or None


def _children_named(last_arg: str) -> list[int]:
    """Processes started by this one whose last argument is `last_arg`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and last_arg.encode() in argv:
            found.append(int(entry.name))
    return found


class _BinaryHello:
    """A TCP listener that greets like an OpenFlow controller — a HELLO whose transaction id is not UTF-8
    (`04 00 00 08 ff fe fd fc`) — and then keeps quiet."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.greeted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                conn.sendall(bytes.fromhex("04000008fffefdfc"))
                self.greeted += 1
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_controller_greeting_in_binary_does_not_break_bring_up(
    daemon: OvsDaemon, fabric_prefix: str
) -> None:
    """Mininet's RemoteController decoded the controller's HELLO (via telnet) as UTF-8 and crashed at random
    (UnicodeDecodeError), leaving its shell behind.  The fabric now checks the controller with a bare TCP
    connect and starts no process for it."""
    hello = _BinaryHello()
    fabric = load_topology(TOPOLOGY)
    addresses = SubnetManager(fabric).addresses.as_strings()
    net = MininetFabric(  # Mininet's own nodes: the path its CLI uses
        fabric, addresses, controller=f"tcp:127.0.0.1:{hello.port}", name_prefix=fabric_prefix, shells=True
    )
    try:
        assert listening("127.0.0.1", hello.port) and not listening("127.0.0.1", free_port())
        net.start()
        assert hello.greeted >= 1  # the readiness check read the greeting (and did not decode it)
        assert len(host_shells(net.names.values())) == len(fabric.nodes)  # a shell per switch and host ...
        assert _children_named("mininet:c0") == []  # ... and none for the controller
    finally:
        net.stop()
        hello.close()
    assert prefix_leftovers(fabric_prefix) == []


def test_k4_comes_up_and_every_pair_is_reached_through_the_controller(
    daemon: OvsDaemon, tmp_path: Path, fabric_prefix: str
) -> None:
    fabric = load_topology(TOPOLOGY)
    sm = SubnetManager(fabric)
    addresses = sm.addresses.as_strings()
    ctl = ControllerProcess(TOPOLOGY, tmp_path / "state", tmp_path / "controller.log")
    ctl.start()
    net = MininetFabric(fabric, addresses, controller=ctl.openflow, scale=Scale.parse("400G=200M"),
                        name_prefix=fabric_prefix)  # fmt: skip
    try:
        net.start()
        ctl.ready(len(fabric.switches))
        pairs = check_all_pairs(net.endpoints())
        assert len(pairs) == 240 and all(pairs.values()), [p for p, ok in pairs.items() if not ok][:5]
        flows = subprocess.run(
            ["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", net.names["leaf1"]],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        entries = [line for line in flows.splitlines() if "priority=" in line]
        assert len(entries) == 18 and all("cookie=0xfab1" in e for e in entries)  # ours only: no NORMAL
        assert "NORMAL" not in flows
        out = net.node("h1").cmd("ping -n -c 2 -W 2 10.0.0.16")  # IP + ARP answered by the controller
        assert " 0% packet loss" in out, out
        shaped = subprocess.run(
            ["tc", "class", "show", "dev", net.intf_name("leaf1", 3)], capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
        assert "rate 200Mbit" in shaped, shaped
    finally:
        net.stop()
        ctl.stop()
    assert prefix_leftovers(fabric_prefix) == []


def _short(tmp_path: Path, name: str, duration: float, extra: str = "") -> Path:
    text = (ROOT / "scenarios" / name).read_text()
    text = text.replace("../topologies/", f"{ROOT.as_posix()}/topologies/")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("duration_s:"))
    path = tmp_path / name
    path.write_text(text + f"\nduration_s: {duration}\n{extra}")
    return path


def _sized(path: Path, capacity: dict[str, Any], factor: float) -> Path:
    """The scenario with its rates scaled to at most LOAD_SHARE of the calibrated total capacity (times
    `factor`, which `until_clean` lowers when a run reports the emulator overloaded anyway)."""
    scenario = load_scenario(path)
    offered = offered_load(scenario, scenario.flows(0))["total"]
    share = min(1.0, LOAD_SHARE * capacity["total_pps"] / offered) * factor
    sized = path.with_name(f"sized-{factor:g}-{path.name}")
    sized.write_text(scale_rates(path.read_text(), share))
    return sized


def test_link_failure_scenario_reports_loss_window_and_reroute(
    daemon: OvsDaemon, tmp_path: Path, k4_capacity: dict[str, Any], fabric_prefix: str
) -> None:
    base = _short(tmp_path, "link-failure.yaml", 5)
    # A fabric of the same topology already runs in this namespace and OVS (as in `docker compose exec
    # fabric fabriclab scenario run ...`): the scenario builds its own beside it, under names of its own.
    bystander = uncontrolled(load_topology(TOPOLOGY), fabric_prefix)
    bystander.start()
    try:

        def run(factor: float) -> dict[str, Any]:
            out = tmp_path / f"results-{factor:g}"
            summary = run_scenario(
                load_scenario(_sized(base, k4_capacity, factor)), out, capacity=k4_capacity
            )
            assert prefix_leftovers(run_name_prefix()) == []
            summary["out"] = out
            return summary

        summary, why = until_clean(run, overloaded)
    finally:
        bystander.stop()
    assert prefix_leftovers(fabric_prefix) == []
    (rep,) = summary["repetitions"]
    assert rep["all_pairs"] == {"pairs": 240, "reachable": 240, "unreachable": []}
    assert [f["action"] for f in rep["faults"]] == ["link_down", "link_up"]
    downs = [e for e in rep["events"] if e["kind"] == "port_down"]
    assert downs and downs[0]["installed_ms"] > 0 and downs[0]["flow_mods"] > 0
    through_cut = [
        f for f in rep["flows"] if " 2>leaf1>3 " in f" {f['path']} " or ">agg1>1 3>leaf1" in f["path"]
    ]
    assert through_cut, [f["path"] for f in rep["flows"]]
    cut_at = rep["faults"][0]["wall"]
    headroom = rep["headroom"]
    if why is None:  # the emulator kept up: every packet lost outside the faults' windows must be within
        # the clean level the calibration measured.
        for flow in rep["flows"]:
            windows = [w["lost_packets"] for w in rep["loss_windows"] if w["flow"] == flow["name"]]
            assert flow["lost"] - sum(windows) <= max(2, CLEAN_LOSS * flow["sent"]), (flow["name"], windows)
    else:  # this machine was too busy even at half the calibrated load: the run must say so
        assert headroom["emulator_overloaded"] and headroom["why"] == why
        assert headroom["emulator_drops"] > CLEAN_LOSS * headroom["offered_packets"] or "delayed" in why
    for flow in through_cut:
        window = next(
            w for w in rep["loss_windows"] if w["flow"] == flow["name"] and "link_down" in w["fault"]
        )
        assert window["loss_window_ms"] < 1000, window  # a window (fast failover may make it empty) ...
        bucket = flow["throughput"]["bucket_s"]
        after = [c for b, c in flow["throughput"]["packets"] if b * bucket > cut_at + 0.5]
        assert sum(after) > 0, flow["name"]  # ... then delivery again, on the new path
    out = summary["out"]
    files = {p.name for p in out.iterdir()}
    assert {
        "summary.json",
        "report.md",
        "throughput-rep1.png",
        "utilisation-rep1.png",
        "loss-rep1.png",
    } <= files
    report = (out / "report.md").read_text()
    assert "port_down" in report and "loss window ms" in report and "Headroom: emulator overloaded" in report
    saved = json.loads((out / "summary.json").read_text())
    assert saved["scenario"] == "link-failure" and saved["emulator_overloaded"] is (why is not None)
    assert saved["capacity"]["per_host_pps"] == k4_capacity["per_host_pps"]
    assert headroom["offered_pps"]["total"] <= LOAD_SHARE * k4_capacity["total_pps"] + 1
    assert headroom["offered_vs_capacity"] <= 1 and headroom["probe_latency_p99_ms"] > 0
    assert rep["utilisation"]["links"] and max(max(v) for v in rep["utilisation"]["links"].values()) > 0


def test_an_overloaded_emulator_says_so_and_by_how_much(
    daemon: OvsDaemon, tmp_path: Path, k4_capacity: dict[str, Any]
) -> None:
    """Four times the clean capacity: the run must not pass its losses off as the fabric's."""
    path = _short(tmp_path, "permutation-k4.yaml", 2)
    text = "\n".join(
        line for line in path.read_text().splitlines() if "at_s" not in line and "faults" not in line
    )
    # four times the clean capacity, and never less than 5,000 pkt/s per host (14 times the idle capacity
    # here, 80,000 in all through up to five userspace switches): a calibration taken on a busy machine
    # reads low (8 pkt/s per host beside `stress-ng --cpu 2`) and four times that the emulator carries
    per_host = max(4 * k4_capacity["per_host_pps"], 5000.0)
    found = re.search(r"rate_pps: ([\d.]+)", text)
    assert found is not None
    asked = float(found[1])  # per host: one flow each
    # fast links and small packets: the load is packets for the emulator, not bytes for the links
    text = re.sub(r"scale: \S+", "scale: 400G=200M", text).replace("size_bytes: 1000", "size_bytes: 200")
    text = re.sub(r"(?m)^(buffer_packets|burst_bytes):.*$", "", text)  # default queues: no modelled drops
    path.write_text(scale_rates(text, per_host / asked) + "\n")
    scenario = load_scenario(path)
    summary = run_scenario(scenario, tmp_path / "results", capacity=k4_capacity)
    assert summary["warnings"] and "above the clean capacity" in summary["warnings"][0]
    headroom = summary["repetitions"][0]["headroom"]
    assert summary["emulator_overloaded"] is True and headroom["emulator_overloaded"] is True, headroom
    assert headroom["why"] and headroom["offered_vs_capacity"] >= 3.9
    assert headroom["emulator_drops"] > 0 or headroom["probe_latency_p99_ms"] > 20, headroom
    assert headroom["modelled_congestion_drops"] == 0  # 400G=200M links are nowhere near full
    report = (tmp_path / "results" / "report.md").read_text()
    assert "The emulator was overloaded" in report


def test_same_seed_same_flow_placement(daemon: OvsDaemon, tmp_path: Path) -> None:
    placements = []
    for run in range(2):
        path = _short(tmp_path, "permutation-k4.yaml", 1.5)
        text = "\n".join(
            line for line in path.read_text().splitlines() if "at_s" not in line and "faults" not in line
        )
        path.write_text(scale_rates(text, 0.1) + "\n")  # placement, not delivery: a light load
        summary = run_scenario(load_scenario(path), tmp_path / f"run{run}")
        placements.append([(f["src"], f["dst"], f["path"]) for f in summary["repetitions"][0]["flows"]])
    assert placements[0] == placements[1] and len(placements[0]) == 16


def _emulate_up(tmp_path: Path, prefix: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli",
         "--name-prefix", prefix, *args],
        cwd=tmp_path, text=True, **kwargs,
    )  # fmt: skip


def test_emulate_up_runs_headless_and_stops_cleanly(
    daemon: OvsDaemon, tmp_path: Path, fabric_prefix: str
) -> None:
    api, of = free_port(), free_port()
    proc = _emulate_up(tmp_path, fabric_prefix, "--api", f"127.0.0.1:{api}", "--openflow", f"127.0.0.1:{of}",
                       "--emu-api", f"127.0.0.1:{free_port()}",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("running;"):
                break
        assert any(line.startswith("all pairs: 240/240 reachable") for line in lines), lines
        assert any(b.startswith(f"bridge {fabric_prefix}s") for b in prefix_leftovers(fabric_prefix))
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, proc.stdout.read() if proc.stdout else ""
    assert prefix_leftovers(fabric_prefix) == []


def test_emulate_up_refuses_a_bad_name_prefix(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli",
         "--name-prefix", "Bad-1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--name-prefix" in done.stderr and "Traceback" not in done.stderr


def test_faults_from_the_cli_helper_cut_and_restore_real_interfaces(
    daemon: OvsDaemon, tmp_path: Path, fabric_prefix: str
) -> None:
    from emulation.session import apply_fault

    net = uncontrolled(load_topology(TOPOLOGY), fabric_prefix)  # faults act on interfaces: no controller
    try:
        net.start()

        def state(intf: str) -> str:
            return subprocess.run(
                ["ip", "-o", "link", "show", intf], capture_output=True, text=True, check=True
            ).stdout

        leaf1_3, agg1_1 = net.intf_name("leaf1", 3), net.intf_name("agg1", 1)
        assert f"link_down leaf1:3 ({leaf1_3})" in apply_fault(net, "link_down", "leaf1:3")
        assert "state DOWN" in state(leaf1_3) and "NO-CARRIER" in state(agg1_1)
        apply_fault(net, "link_up", "leaf1:3")
        apply_fault(net, "switch_down", "agg1")
        assert all("state DOWN" in state(net.intf_name("agg1", p)) for p in (1, 2, 3, 4))
        apply_fault(net, "switch_up", "agg1")
        for bad in (("link_down", "leaf1"), ("switch_down", "h1"), ("melt", "agg1")):
            with pytest.raises(ValueError):
                apply_fault(net, *bad)
    finally:
        net.stop()


def test_a_controller_that_never_programs_the_switches_is_a_clear_error(
    daemon: OvsDaemon, tmp_path: Path, fabric_prefix: str
) -> None:
    """Nothing listens at the given controller or its API: the user gets one line naming it, exit 2, and
    the fabric built meanwhile is gone."""
    controller = f"tcp:127.0.0.1:{free_port()}"
    proc = _emulate_up(tmp_path, fabric_prefix, "--controller", controller, "--controller-api",
                       f"127.0.0.1:{free_port()}", "--emu-api", f"127.0.0.1:{free_port()}",
                       "--ready-timeout", "2", stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"fabriclab: error: controller not ready (is it running at {controller}?)"), line
    assert "timed out after 2.0 s waiting for 20 switches connected and in sync" in line
    assert prefix_leftovers(fabric_prefix) == []


@pytest.mark.parametrize("after_s", [0.5, 1.2, 2.5])
def test_sigterm_at_any_moment_of_bring_up_leaves_nothing(
    daemon: OvsDaemon, tmp_path: Path, after_s: float, fabric_prefix: str
) -> None:
    import time

    api = free_port()
    proc = _emulate_up(tmp_path, fabric_prefix, "--api", f"127.0.0.1:{api}", "--openflow",
                       f"127.0.0.1:{free_port()}", "--emu-api", f"127.0.0.1:{free_port()}",
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) in (0, 130, -signal.SIGTERM)  # -SIGTERM: killed before it had built anything
    assert prefix_leftovers(fabric_prefix) == []
    ours = subprocess.run(["pgrep", "-f", f"fabriclab controller.*--api 127.0.0.1:{api}"],
                          capture_output=True, check=False)  # fmt: skip
    assert ours.stdout == b""  # the controller this emulate up started (and only it)


def test_roce_alltoall_scenario_delivers_every_write_in_order(
    daemon: OvsDaemon, tmp_path: Path, k4_capacity: dict[str, Any]
) -> None:
    base = _short(tmp_path, "alltoall-k4.yaml", 3)
    text = base.read_text().replace("ranks: h1..h16, size: 480KiB", "ranks: h1..h8, size: 256KiB")
    # ftree's tables carry every step (a shift) without a collision, and queues are the interfaces' own:
    # whatever is lost here is the emulator's, not the modelled fabric's
    base.write_text(text.replace("policy: ecmp", "policy: static").replace("buffer_packets: 8\n", ""))

    def run(factor: float) -> dict[str, Any]:
        out = tmp_path / f"results-{factor:g}"
        sized = _sized(base, k4_capacity, factor)
        # every write must fit the run: at the rate a busy machine's calibration allows (as low as 8 pkt/s
        # per host beside `stress-ng --cpu 2`) the 224 packets each rank sends need longer than 3 s
        rate = offered_load(load_scenario(sized), [])["per_host"]
        duration_s = max(3.0, round(1.5 * 7 * 32 / rate + 1, 1))
        text = sized.read_text()
        assert "duration_s: 3\n" in text
        sized.write_text(text.replace("duration_s: 3\n", f"duration_s: {duration_s}\n"))
        summary = run_scenario(load_scenario(sized), out, capacity=k4_capacity)
        summary["out"] = out
        return summary

    summary, why = until_clean(run, overloaded)
    (coll,) = summary["repetitions"][0]["collectives"]
    assert coll["qps"] == 56 and coll["packets_expected"] == 56 * 32
    assert (coll["out_of_order"], coll["bad_icrc"]) == (0, 0)
    expected = coll["packets_expected"]
    if why is None:  # within the emulator's clean capacity (the run says it kept up): as clean as calibrated
        assert coll["packets_received"] >= expected - max(1, CLEAN_LOSS * expected)
    else:  # too busy a machine even at half the load: the run must say so
        assert summary["emulator_overloaded"] and summary["repetitions"][0]["headroom"]["why"] == why
    assert coll["busbw_GBps"] > 0 and coll["busbw_GBps"] == pytest.approx(
        coll["algbw_GBps"] * 7 / 8, rel=0.01
    )
    assert "RoCE collective" in (summary["out"] / "report.md").read_text()


def test_trace_replay_and_kv_transfer_run_on_the_emulated_fabric(daemon: OvsDaemon, tmp_path: Path) -> None:
    """The kinds the simulator runs, the emulator runs: a training step replayed from its Kineto traces and
    KV-cache pages from a prefill to a decode host, as RDMA WRITEs from one agent per host; every message
    is accounted for (sent, received, when), and the report says so."""
    trace = ROOT / "scenarios" / "traces" / "kineto-step-16.jsonl"
    path = tmp_path / "replay.yaml"
    path.write_text(
        f"fabriclab: 1\nname: replay\ntopology: {ROOT / 'topologies' / 'fat-tree-k4.yaml'}\nscale: 400G=2M\n"
        "controller: {engine: ftree, policy: static}\nduration_s: 3\nseed: 1\nsettle_s: 2\ntraffic:\n"
        f"  - {{kind: trace, file: {trace}, size_scale: 0.0009765625, time_scale: 195.3125, rate_pps: 100}}\n"
        "  - {kind: kv-transfer, model: mqa-example, prompt_tokens: 16, prefill: h2, decode: h10,"
        " rate_pps: 100, start_s: 0.5}\n"
    )

    def run(factor: float) -> dict[str, Any]:
        text = path.read_text().replace("rate_pps: 100", f"rate_pps: {100 * factor:g}")
        sized = tmp_path / f"replay-{factor:g}.yaml"
        sized.write_text(text)
        out = tmp_path / f"results-{factor:g}"
        summary = run_scenario(load_scenario(sized), out)
        summary["out"] = out
        return summary

    summary, why = until_clean(run, overloaded)
    rep = summary["repetitions"][0]
    trace_job, kv_job = rep["replays"]
    assert trace_job["messages"] == 448 and kv_job["messages"] == 32 * 1  # 32 layers, one 16-token page
    messages = rep["roce_messages"]
    assert len(messages) == 480 and all(m["sent"] == m["packets"] for m in messages)
    if why is None:  # the emulator kept up: every WRITE arrived whole, in order
        assert all(m["complete"] for m in messages), [m for m in messages if not m["complete"]][:3]
        assert kv_job["complete"] == 32 and trace_job["complete"] == 448
    kv = [m for m in messages if m["job"] == 1]
    assert {(m["src"], m["dst"]) for m in kv} == {("h2", "h10")} and min(m["post_s"] for m in kv) >= 0.5
    assert "RoCE replay" in (summary["out"] / "report.md").read_text()


def test_faults_over_the_emulators_rest_api(daemon: OvsDaemon, tmp_path: Path, fabric_prefix: str) -> None:
    import time
    import urllib.error
    import urllib.request

    from controller.rest.client import wait_for

    api, emu, of = free_port(), free_port(), free_port()
    proc = _emulate_up(tmp_path, fabric_prefix, "--api", f"127.0.0.1:{api}", "--openflow", f"127.0.0.1:{of}",
                       "--emu-api", f"127.0.0.1:{emu}",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip

    def post(body: str) -> tuple[int, dict[str, object]]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{emu}/api/v1/faults",
            data=body.encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)

    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("running;"):
                break
        status, body = post('{"action": "link_down", "target": "leaf1:3"}')
        assert status == 200 and f"{fabric_prefix}s" in str(body["applied"]), body

        def controller_saw_it() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{api}/api/v1/links", timeout=10) as response:
                return any(not link["up"] for link in json.load(response))

        wait_for(controller_saw_it, 10, "the controller to see the cut")
        bad_bodies = [
            ('{"action": "melt", "target": "x"}', "action"),
            ('{"action": "link_down"}', "target"),
            ('{"action": "link_down", "target": "nope:1"}', "target"),
            ("[]", None),
        ]
        for bad, field in bad_bodies:
            status, body = post(bad)
            assert status in (400, 422) and body["field"] == field, body
        time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{emu}/api/v1/faults", timeout=10) as response:
            assert [f["action"] for f in json.load(response)] == ["link_down"]  # rejected ones left no trace
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert prefix_leftovers(fabric_prefix) == []
