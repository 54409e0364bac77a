"""The emulator on real Mininet + OVS (userspace datapath) with the controller as its own process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess, free_port
from emulation.mesh import check_all_pairs
from emulation.mnfabric import MininetFabric, Scale, mininet_available
from emulation.ovs import OvsDaemon
from emulation.runner import run_name_prefix, run_scenario
from emulation.scenario import load_scenario
from tests.conftest import ROOT
from tests.emulation_support import require_emulation
from topologies.loader import load_topology
from topologies.model import Fabric

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"


@pytest.fixture(scope="module")
def daemon() -> Iterator[OvsDaemon]:
    require_emulation(mininet_available())
    d = OvsDaemon()
    d.ensure_running()
    yield d
    d.stop_if_started()


def leftovers(names: list[str], prefix: str | None = None) -> list[str]:
    """What is left of a fabric: bridges and interfaces by node name (or by name prefix), host shells."""
    bridges = subprocess.run(
        ["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True
    ).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    shells = ["pgrep", "-f", f"mininet:{prefix or ''}"]
    hosts = subprocess.run(shells, capture_output=True, text=True, check=False).stdout
    found = [f"bridge {b}" for b in bridges if b in names or (prefix and b.startswith(prefix))]
    found += [f"link {n}" for n in names if f" {n}-eth" in links]
    if prefix:
        ours = [line.split(":")[1].strip() for line in links.splitlines() if f": {prefix}" in line]
        found += [f"link {name}" for name in ours]
    found += [f"host process {pid}" for pid in hosts.split()]
    return found


def uncontrolled(fabric: Fabric) -> MininetFabric:
    """A Mininet fabric whose switches have no controller to reach (secure mode: no flows at all)."""
    addresses = SubnetManager(fabric).addresses.as_strings()
    return MininetFabric(fabric, addresses, controller=f"tcp:127.0.0.1:{free_port()}")


def test_k4_comes_up_and_every_pair_is_reached_through_the_controller(
    daemon: OvsDaemon, tmp_path: Path
) -> None:
    fabric = load_topology(TOPOLOGY)
    sm = SubnetManager(fabric)
    addresses = sm.addresses.as_strings()
    ctl = ControllerProcess(TOPOLOGY, tmp_path / "state", tmp_path / "controller.log")
    ctl.start()
    net = MininetFabric(fabric, addresses, controller=ctl.openflow, scale=Scale.parse("400G=200M"))
    try:
        net.start()
        ctl.ready(len(fabric.switches))
        pairs = check_all_pairs(net.endpoints())
        assert len(pairs) == 240 and all(pairs.values()), [p for p, ok in pairs.items() if not ok][:5]
        flows = subprocess.run(
            ["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", "leaf1"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        entries = [line for line in flows.splitlines() if "priority=" in line]
        assert len(entries) == 18 and all("cookie=0xfab1" in e for e in entries)  # ours only: no NORMAL
        assert "NORMAL" not in flows
        out = net.node("h1").cmd("ping -n -c 2 -W 2 10.0.0.16")  # IP + ARP answered by the controller
        assert " 0% packet loss" in out, out
        shaped = subprocess.run(
            ["tc", "class", "show", "dev", "leaf1-eth3"], capture_output=True, text=True, check=True
        ).stdout
        assert "rate 200Mbit" in shaped, shaped
    finally:
        net.stop()
        ctl.stop()
    assert leftovers([net.names[n] for n in fabric.nodes]) == []


def _short(tmp_path: Path, name: str, duration: float, extra: str = "") -> Path:
    text = (ROOT / "scenarios" / name).read_text()
    text = text.replace("../topologies/", f"{ROOT.as_posix()}/topologies/")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("duration_s:"))
    path = tmp_path / name
    path.write_text(text + f"\nduration_s: {duration}\n{extra}")
    return path


def test_link_failure_scenario_reports_loss_window_and_reroute(daemon: OvsDaemon, tmp_path: Path) -> None:
    scenario = load_scenario(_short(tmp_path, "link-failure.yaml", 5))
    # A fabric of the same topology already runs in this namespace and OVS (as in `docker compose exec
    # fabric fabriclab scenario run ...`): the scenario builds its own beside it, under names of its own.
    bystander = uncontrolled(scenario.fabric)
    bystander.start()
    try:
        summary = run_scenario(scenario, tmp_path / "results")
        assert leftovers([], prefix=run_name_prefix()) == []
    finally:
        bystander.stop()
    assert leftovers(list(bystander.names.values())) == []
    (rep,) = summary["repetitions"]
    assert rep["all_pairs"] == {"pairs": 240, "reachable": 240, "unreachable": []}
    assert [f["action"] for f in rep["faults"]] == ["link_down", "link_up"]
    downs = [e for e in rep["events"] if e["kind"] == "port_down"]
    assert downs and downs[0]["installed_ms"] > 0 and downs[0]["flow_mods"] > 0
    through_cut = [
        f for f in rep["flows"] if " 2>leaf1>3 " in f" {f['path']} " or ">agg1>1 3>leaf1" in f["path"]
    ]
    assert through_cut, [f["path"] for f in rep["flows"]]
    windows = {w["flow"]: w for w in rep["loss_windows"] if w["fault"].startswith("link_down")}
    for flow in through_cut:
        assert 0 < windows[flow["name"]]["loss_window_ms"] < 1000, windows  # a window, then recovery
        assert flow["received"] > 0.8 * flow["sent"]
    files = {p.name for p in (tmp_path / "results").iterdir()}
    assert {
        "summary.json",
        "report.md",
        "throughput-rep1.png",
        "utilisation-rep1.png",
        "loss-rep1.png",
    } <= files
    report = (tmp_path / "results" / "report.md").read_text()
    assert "port_down" in report and "loss window ms" in report
    assert json.loads((tmp_path / "results" / "summary.json").read_text())["scenario"] == "link-failure"
    assert rep["utilisation"]["links"] and max(max(v) for v in rep["utilisation"]["links"].values()) > 0


def test_same_seed_same_flow_placement(daemon: OvsDaemon, tmp_path: Path) -> None:
    placements = []
    for run in range(2):
        path = _short(tmp_path, "permutation-k4.yaml", 1.5)
        text = "\n".join(
            line for line in path.read_text().splitlines() if "at_s" not in line and "faults" not in line
        )
        path.write_text(text + "\n")
        summary = run_scenario(load_scenario(path), tmp_path / f"run{run}")
        placements.append([(f["src"], f["dst"], f["path"]) for f in summary["repetitions"][0]["flows"]])
    assert placements[0] == placements[1] and len(placements[0]) == 16


def test_emulate_up_runs_headless_and_stops_cleanly(daemon: OvsDaemon, tmp_path: Path) -> None:
    from emulation.controlproc import free_port

    api, of = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli",
         "--api", f"127.0.0.1:{api}", "--openflow", f"127.0.0.1:{of}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("running;"):
            break
    assert any(line.startswith("all pairs: 240/240 reachable") for line in lines), lines
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stdout.read()
    fabric = load_topology(TOPOLOGY)
    assert leftovers([n for n in fabric.nodes]) == []


def test_faults_from_the_cli_helper_cut_and_restore_real_interfaces(
    daemon: OvsDaemon, tmp_path: Path
) -> None:
    from emulation.session import apply_fault

    net = uncontrolled(load_topology(TOPOLOGY))  # faults act on interfaces: no controller needed
    try:
        net.start()

        def state(intf: str) -> str:
            return subprocess.run(
                ["ip", "-o", "link", "show", intf], capture_output=True, text=True, check=True
            ).stdout

        assert "link_down leaf1:3 (leaf1-eth3)" in apply_fault(net, "link_down", "leaf1:3")
        assert "state DOWN" in state("leaf1-eth3") and "NO-CARRIER" in state("agg1-eth1")
        apply_fault(net, "link_up", "leaf1:3")
        apply_fault(net, "switch_down", "agg1")
        assert all("state DOWN" in state(f"agg1-eth{p}") for p in (1, 2, 3, 4))
        apply_fault(net, "switch_up", "agg1")
        for bad in (("link_down", "leaf1"), ("switch_down", "h1"), ("melt", "agg1")):
            with pytest.raises(ValueError):
                apply_fault(net, *bad)
    finally:
        net.stop()


def test_a_controller_that_never_programs_the_switches_is_a_clear_error(
    daemon: OvsDaemon, tmp_path: Path
) -> None:
    """Nothing listens at the given controller or its API: the user gets one line naming it, exit 2, and
    the fabric built meanwhile is gone."""
    controller = f"tcp:127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli",
         "--controller", controller, "--controller-api", f"127.0.0.1:{free_port()}",
         "--emu-api", f"127.0.0.1:{free_port()}", "--ready-timeout", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"fabriclab: error: controller not ready (is it running at {controller}?)"), line
    assert "timed out after 2.0 s waiting for 20 switches connected and in sync" in line
    assert leftovers(list(load_topology(TOPOLOGY).nodes)) == []


@pytest.mark.parametrize("after_s", [0.5, 1.2, 2.5])
def test_sigterm_at_any_moment_of_bring_up_leaves_nothing(
    daemon: OvsDaemon, tmp_path: Path, after_s: float
) -> None:
    import time

    from emulation.controlproc import free_port

    proc = subprocess.Popen(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli",
         "--api", f"127.0.0.1:{free_port()}", "--openflow", f"127.0.0.1:{free_port()}"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) in (0, 130, -signal.SIGTERM)  # -SIGTERM: killed before it had built anything
    fabric = load_topology(TOPOLOGY)
    assert leftovers(list(fabric.nodes)) == []
    assert (
        subprocess.run(["pgrep", "-f", "fabriclab controller"], capture_output=True, check=False).stdout
        == b""
    )


def test_roce_alltoall_scenario_delivers_every_write_in_order(daemon: OvsDaemon, tmp_path: Path) -> None:
    path = _short(tmp_path, "alltoall-k4.yaml", 3)
    path.write_text(path.read_text().replace("ranks: h1..h16, size: 512KiB", "ranks: h1..h8, size: 256KiB"))
    summary = run_scenario(load_scenario(path), tmp_path / "results")
    (coll,) = summary["repetitions"][0]["collectives"]
    assert coll["qps"] == 56 and coll["packets_expected"] == 56 * 32
    # Order and integrity must be exact; delivery near-complete (a busy 2-core machine drops the odd packet).
    assert (coll["out_of_order"], coll["bad_icrc"]) == (0, 0)
    assert coll["packets_received"] >= 0.99 * 56 * 32
    assert coll["busbw_gbps"] > 0 and coll["busbw_gbps"] == pytest.approx(
        coll["algbw_gbps"] * 7 / 8, rel=0.01
    )
    assert "RoCE collective" in (tmp_path / "results" / "report.md").read_text()


def test_faults_over_the_emulators_rest_api(daemon: OvsDaemon, tmp_path: Path) -> None:
    import time
    import urllib.error
    import urllib.request

    from controller.rest.client import wait_for
    from emulation.controlproc import free_port

    api, emu, of = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli",
         "--api", f"127.0.0.1:{api}", "--openflow", f"127.0.0.1:{of}", "--emu-api", f"127.0.0.1:{emu}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

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
        assert status == 200 and "leaf1-eth3" in str(body["applied"])

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
