"""Sharded emulation (issue 19, part 3): a fabric split over several ovs-vswitchd instances, each in its
own network namespace standing in for a machine, cables between shards as VXLAN tunnels, one controller.

The plan is checked on generated fat-tree, rail and leaf-spine fabrics; the emulated checks build a k=4
fat-tree on two shards joined by VXLAN: all pairs across the tunnels, a cable between shards cut and
rerouted around, and a scenario whose results match the unsharded fabric's within the tunnel's overhead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess
from emulation.mesh import check_all_pairs
from emulation.mnfabric import EmulationError, mininet_available, remove
from emulation.runner import run_scenario
from emulation.sharded import ShardedFabric
from emulation.shards import STATS_UPDATE_INTERVAL_MS, ShardPlan, plan, uses_patch
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from tests.emulation_support import (  # noqa: F401 - the ovs_daemon fixture
    overloaded_runs,
    ovs_daemon_fixture,
    prefix_leftovers,
    prefix_names,
    require_emulation,
    scale_rates,
    unique_prefix,
    until_clean,
)
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.loader import load_topology
from topologies.model import Fabric

K4 = ROOT / "topologies" / "fat-tree-k4.yaml"


def _switch_ports(fabric: Fabric, shard_plan: ShardPlan) -> list[int]:
    load = [0] * shard_plan.count
    for ref in fabric.port_map:
        if fabric.nodes[ref.node].is_switch:
            load[shard_plan.shard_of[ref.node]] += 1
    return load


@pytest.mark.parametrize(("k", "count"), [(4, 2), (8, 2), (8, 4), (16, 8), (16, 3)])
def test_fat_tree_plan_keeps_pods_whole_and_balances_switch_ports(k: int, count: int) -> None:
    fabric = fat_tree(k)
    shard_plan = plan(fabric, count)
    assert set(shard_plan.shard_of) == set(fabric.nodes)
    crossing = shard_plan.crossing(fabric)
    tiers = {n.name: n.tier for n in fabric.switches}
    # only aggregation-core cables cross: a pod (its leaves, aggregations and hosts) is never split
    assert all({tiers.get(ln.a.node), tiers.get(ln.b.node)} == {1, 2} for ln in crossing)
    load = _switch_ports(fabric, shard_plan)
    pod_ports = k * k  # k/2 leaves and k/2 aggregation switches of k ports each
    assert max(load) - min(load) <= pod_ports, load
    assert plan(fabric, count) == shard_plan  # deterministic
    if (k, count) == (8, 4):
        # 2 pods and 4 of the 16 cores per shard: each core reaches 8 pods, 2 of them in its own shard
        assert len(crossing) == 16 * 6


def test_rail_and_leaf_spine_plans_keep_every_host_with_its_switch() -> None:
    for fabric, count in ((rail(servers=32, gpus=8, groups=4), 4), (leaf_spine(8, 4, 16), 3)):
        shard_plan = plan(fabric, count)
        for link in fabric.links:
            if fabric.nodes[link.a.node].is_host or fabric.nodes[link.b.node].is_host:
                assert shard_plan.shard_of[link.a.node] == shard_plan.shard_of[link.b.node]
        load = _switch_ports(fabric, shard_plan)
        assert min(load) > 0 and max(load) <= 2 * min(load), load


def test_plan_rejects_impossible_counts_naming_them() -> None:
    fabric = fat_tree(4)
    with pytest.raises(ValueError, match="at least 1"):
        plan(fabric, 0)
    with pytest.raises(ValueError, match="more than the fabric's 20 switches"):
        plan(fabric, 21)


def test_patch_cables_are_used_unshaped_and_refused_shaped_or_unknown() -> None:
    assert uses_patch("auto", shaped=False) and uses_patch("patch", shaped=False)
    assert not uses_patch("auto", shaped=True) and not uses_patch("veth", shaped=False)
    with pytest.raises(ValueError, match="cannot be shaped"):
        uses_patch("patch", shaped=True)
    with pytest.raises(ValueError, match="'copper': expected one of auto, patch, veth"):
        uses_patch("copper", shaped=False)
    fabric = load_topology(K4)
    with pytest.raises(EmulationError, match="cables: 'copper'"):
        ShardedFabric(
            fabric, SubnetManager(fabric).addresses.as_strings(), 2, cables="copper", name_prefix="zq"
        )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shards", "21"], "--shards: 21 is more than the fabric's 20 switches"),
        (["--shards", "0"], "--shards"),
        (["--crossing", "vxlan"], "--crossing: only with --shards 2 or more"),
        (["--shards", "2", "--controller", "tcp:127.0.0.1:6653"], "only with the controller this starts"),
        (["--shard-cables", "patch", "--controller", "tcp:127.0.0.1:6653"], "controller this starts"),
        (["--shards", "2", "--crossing", "gre"], "--crossing"),
        (["--shard-cables", "veth"], "--shard-cables: veth only with --shards 2 or more"),
        (["--ports", "afxdp", "--scale", "400G=200M"], "--ports afxdp: AF_XDP ports bypass the qdiscs"),
        (["--shards", "2", "--shard-cables", "patch", "--scale", "400G=200M"], "cannot be shaped"),
        (["--shards", "2", "--shard-cables", "copper"], "--shard-cables"),
        (["--dask", "sched 8786"], "--dask: expected tcp://HOST:PORT of a Dask scheduler"),
        (["--dask", "tcp://192.0.2.1:8786", "--controller", "tcp:127.0.0.1:6653"], "--controller: not with"),
        (["--dask", "tcp://192.0.2.1:8786", "--ports", "afxdp"], "--ports afxdp: not with --dask"),
        (["--dask", "tcp://192.0.2.1:8786", "--shards", "21"], "--shards: 21 is more than"),
        (["--dask", "tcp://192.0.2.1:8786", "--openflow-advertise", "h"], "--openflow-advertise: expected"),
        (["--openflow-advertise", "10.0.0.1"], "--openflow-advertise: only with --dask"),
    ],
)
def test_emulate_up_refuses_bad_shard_options_before_building(argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(K4), "--no-cli", *argv],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


SCHED = "tcp://192.0.2.1:8786"  # documentation addresses (RFC 5737): never dialled, every case fails first


@pytest.mark.parametrize(
    ("scenario", "argv", "message"),
    [
        ("link-failure", ["--dask", "sched 8786", "--shards", "2"], "--dask: expected tcp://HOST:PORT"),
        ("link-failure", ["--dask", SCHED, "--shards", "2", "--crossing", "vxlan"], "--crossing: not with"),
        ("link-failure", ["--openflow-advertise", "192.0.2.2"], "--openflow-advertise: only with"),
        ("link-failure", ["--dask", SCHED, "--openflow-advertise", "10.0.0"], "--openflow-advertise: expect"),
        ("permutation-roce-k4", ["--dask", SCHED], "--dask: cc: dcqcn runs on one machine only"),
    ],
)
def test_scenario_run_refuses_bad_dask_options_before_building(
    scenario: str, argv: list[str], message: str, tmp_path: Path
) -> None:
    """Refused whole (exit 2, the option named) before a scheduler is dialled or a folder written."""
    out = tmp_path / "out"
    file = ROOT / "scenarios" / f"{scenario}.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "scenario", "run", str(file), "-o", str(out), *argv],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not out.exists()


# --- emulated: two shards over VXLAN ------------------------------------------------------------------


class Sharded:
    def __init__(self, net: ShardedFabric, ctl: ControllerProcess) -> None:
        self.net, self.ctl = net, ctl

    def crossing_link(self) -> tuple[str, int, str, int]:
        """An aggregation-core cable between the two shards: (agg, port, core, port)."""
        fabric = self.net.fabric
        for link in self.net.plan.crossing(fabric):
            a, b = sorted((link.a, link.b), key=lambda e: e.node.startswith("core"))
            return a.node, a.port, b.node, b.port
        raise AssertionError("no cable crosses the shards")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sharded]:
    require_emulation(mininet_available())
    work = tmp_path_factory.mktemp("sharded")
    fabric = load_topology(K4)
    prefix = unique_prefix("v")
    net = ShardedFabric(fabric, SubnetManager(fabric).addresses.as_strings(), 2, "vxlan", name_prefix=prefix)
    ctl = ControllerProcess(K4, work / "state", work / "controller.log", of_host=net.prepare_control())
    try:
        ctl.start()
        net.controller = ctl.openflow
        net.start()
        ctl.ready(len(fabric.switches), timeout_s=120)
        yield Sharded(net, ctl)
    finally:
        net.stop()
        if ctl.proc is not None:
            ctl.stop()
        left = prefix_leftovers(prefix)
        if left:
            remove(prefix_names(prefix))
        assert left == [], f"left behind: {left[:5]}"


def _netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_two_shards_each_run_their_own_ovs_and_reach_all_pairs_across_vxlan(sharded: Sharded) -> None:
    net = sharded.net
    pairs = check_all_pairs(net.endpoints())
    assert sum(pairs.values()) == len(pairs) == 16 * 15
    pids = net.vswitchd_pids()
    assert len(pids) == 2 and len({_netns_of(p) for p in pids}) == 2
    assert _netns_of(os.getpid()) not in {_netns_of(p) for p in pids}
    for i, daemon in enumerate(net.daemons):
        bridges = subprocess.run(["ovs-vsctl", f"--db=unix:{daemon.db}", "list-br"], capture_output=True,
                                 text=True, check=True).stdout.split()  # fmt: skip
        expected = {net.names[s] for s, shard in net.plan.shard_of.items() if shard == i and s in net.names
                    and net.fabric.nodes[s].is_switch}  # fmt: skip
        assert set(bridges) == expected
        interval = subprocess.run(["ovs-vsctl", f"--db=unix:{daemon.db}", "get", "Open_vSwitch", ".",
                                   "other_config:stats-update-interval"], capture_output=True, text=True,
                                  check=True).stdout.strip().strip('"')  # fmt: skip
        assert int(interval) == STATS_UPDATE_INTERVAL_MS  # its own settings, not the system OVS's
    system = subprocess.run(
        ["ovs-vsctl", "--timeout=10", "list-br"], capture_output=True, text=True, check=False
    )
    assert not any(b.startswith(net.shard_names[0][:-2]) for b in system.stdout.split())
    agg, port, core, core_port = sharded.crossing_link()
    for node, p in ((agg, port), (core, core_port)):
        argv = ["ip", "-n", net.shard_ns(node), "-d", "-j", "link", "show", "dev", net.intf_name(node, p)]
        shown = subprocess.run(argv, capture_output=True, text=True, check=True)
        info = json.loads(shown.stdout)[0]["linkinfo"]
        assert info["info_kind"] == "vxlan"
    assert net.shard_ns(agg) != net.shard_ns(core)


def _port_events(ctl: ControllerProcess, since: int) -> list[dict[str, Any]]:
    return [e for e in ctl.get(f"events?since={since}&limit=1000") if e["kind"] in ("port_down", "port_up")]


def _all_pairs_ok(net: ShardedFabric) -> None:
    pairs = check_all_pairs(net.endpoints())
    assert sum(pairs.values()) == len(pairs), [p for p, ok in pairs.items() if not ok][:5]


def _wait_port_events(ctl: ControllerProcess, since: int, kind: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while not any(e["kind"] == kind for e in _port_events(ctl, since)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _port_events(ctl, since)


def _cut_and_restore(sharded: Sharded, end: tuple[str, int], far: tuple[str, int],
                     while_cut: Callable[[], None], after: Callable[[], None]) -> None:  # fmt: skip
    """Cut the cable at `end`: the controller's first port event is a port-down of one of its two ends,
    every pair is still reachable (rerouted), `while_cut` holds; restored: a port-up, every pair, `after`."""
    net, ctl = sharded.net, sharded.ctl
    since = int(ctl.get("events")[-1]["id"])
    net.set_link(*end, up=False)
    try:
        while_cut()
        downs = _wait_port_events(ctl, since, "port_down")
        assert downs and downs[0]["kind"] == "port_down", downs
        ports = {p for e in downs for p in e["ports"]}
        assert {f"{end[0]}:{end[1]} down", f"{far[0]}:{far[1]} down"} & ports, ports
        _all_pairs_ok(net)
    finally:
        since = int(ctl.get("events")[-1]["id"])
        net.set_link(*end, up=True)
    after()
    assert any(e["kind"] == "port_up" for e in _wait_port_events(ctl, since, "port_up"))
    _all_pairs_ok(net)


def test_a_cable_between_shards_cut_is_rerouted_and_restored(sharded: Sharded) -> None:
    net = sharded.net
    agg, port, core, core_port = sharded.crossing_link()

    def both_ends_down() -> None:  # a tunnel has no carrier: both ends cut, as a fibre cut is seen
        for node, p in ((agg, port), (core, core_port)):
            argv = ["ip", "-n", net.shard_ns(node), "-j", "link", "show", "dev", net.intf_name(node, p)]
            shown = subprocess.run(argv, capture_output=True, text=True, check=True)
            assert "UP" not in json.loads(shown.stdout)[0]["flags"], f"{node}:{p} still up"

    _cut_and_restore(sharded, (agg, port), (core, core_port), both_ends_down, lambda: None)


def test_a_cable_inside_a_shard_is_a_patch_port_pair_cut_and_restored(sharded: Sharded) -> None:
    """Unshaped, a cable between two switches of one shard is a pair of OVS patch ports (no veth); cutting
    it removes both ports — the controller sees them go and reroutes — and restoring it adds them back
    with the same OpenFlow port numbers."""
    net = sharded.net
    (edge, port), (agg, agg_port) = next(
        (a, b) for a, b in sorted(net.patched.items()) if a[0].startswith("leaf")
    )  # fmt: skip
    assert net.shard_ns(edge) == net.shard_ns(agg)
    assert len(net.patched) // 2 == len(net.fabric.links) - len(net.fabric.hosts) - len(
        net.plan.crossing(net.fabric))  # every switch-switch cable inside a shard  # fmt: skip
    db = net.daemons[net.plan.shard_of[edge]].db

    def interface(node: str, p: int) -> list[str]:
        argv = ["ovs-vsctl", f"--db=unix:{db}", "--if-exists", "get", "Interface", net.intf_name(node, p),
                "type", "options:peer", "ofport"]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()

    def both_patch_ports() -> None:
        assert interface(edge, port) == ["patch", net.intf_name(agg, agg_port), str(port)]
        assert interface(agg, agg_port) == ["patch", net.intf_name(edge, port), str(agg_port)]

    both_patch_ports()
    veth = subprocess.run(["ip", "-n", net.shard_ns(edge), "link", "show", "dev", net.intf_name(edge, port)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert veth.returncode != 0  # no device: the cable is inside ovs-vswitchd

    def both_gone() -> None:
        assert interface(edge, port) == [] and interface(agg, agg_port) == []

    _cut_and_restore(sharded, (edge, port), (agg, agg_port), both_gone, both_patch_ports)


def _scenario_text(fault_port: str) -> str:
    return f"""fabriclab: 1
name: sharded-vs-not
topology: {K4}
scale: 400G=200M
controller: {{engine: ftree, fast_failover: true}}
duration_s: 6
seed: 11
poll_interval_s: 0.5
traffic:
  - {{kind: udp, src: h1, dst: h16, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h2, dst: h9, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h5, dst: h13, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h14, dst: h3, rate_pps: 400, size_bytes: 512}}
faults:
  - {{at_s: 2, action: link_down, port: "{fault_port}"}}
  - {{at_s: 4, action: link_up, port: "{fault_port}"}}
"""


def test_a_scenario_gives_the_same_results_sharded_over_vxlan_as_unsharded(
    ovs_daemon: Any, tmp_path: Path
) -> None:
    """Same scenario, same seed: on one OVS, then on two shards joined by VXLAN with the fault on a cable
    between them.  Same routes, same reroutes, the same packets delivered (within a few packets of
    emulator noise), latency higher by at most the tunnel's cost.  A pair the emulator overloaded (a busy
    machine) is run again at half the rate; if that is overloaded too, what holds at any load is checked
    (routes, reroutes, reachability, and that both runs said so), not delivery."""
    require_emulation(mininet_available())
    fabric = load_topology(K4)
    link = plan(fabric, 2).crossing(fabric)[0]
    end = link.a if link.a.node.startswith("agg") else link.b
    runs = 0

    def run_pair(factor: float) -> tuple[dict[str, Any], dict[str, Any]]:
        nonlocal runs
        runs += 1
        path = tmp_path / f"scenario{runs}.yaml"
        path.write_text(scale_rates(_scenario_text(f"{end.node}:{end.port}"), factor))
        plain = run_scenario(load_scenario(path), tmp_path / f"plain{runs}")
        return plain, run_scenario(
            load_scenario(path), tmp_path / f"sharded{runs}", shards=2, crossing="vxlan"
        )

    (plain, shard), why = until_clean(run_pair, overloaded_runs)
    assert shard["shards"] == {"count": 2, "crossing": "vxlan"} and plain["shards"] is None
    a, b = plain["repetitions"][0], shard["repetitions"][0]
    assert a["all_pairs"]["reachable"] == a["all_pairs"]["pairs"] == b["all_pairs"]["reachable"]
    kinds = [[e["kind"] for e in r["events"] if e["kind"].startswith("port_")] for r in (a, b)]
    assert kinds[0] == kinds[1] and "port_down" in kinds[0], kinds
    for fa, fb in zip(a["flows"], b["flows"], strict=True):
        assert fa["name"] == fb["name"] and fa["path"] == fb["path"], (fa.get("path"), fb.get("path"))
    if why is not None:  # the machine was too busy twice: the runs said so, delivery is not judged
        assert plain["emulator_overloaded"] or shard["emulator_overloaded"]
        return
    for fa, fb in zip(a["flows"], b["flows"], strict=True):
        assert abs(fa["sent"] - fb["sent"]) <= max(10, 0.01 * fa["sent"])
        assert abs(fa["lost"] - fb["lost"]) <= max(10, 0.01 * fa["sent"]), (
            fa["name"],
            fa["lost"],
            fb["lost"],
        )
        # VXLAN encapsulation, the underlay bridge and a second ovs-vswitchd on the path: well under 5 ms
        assert fb["latency_ms"]["p50"] - fa["latency_ms"]["p50"] < 5.0, (fa["latency_ms"], fb["latency_ms"])
