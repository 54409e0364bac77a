"""Drills on the emulated fabric (k=4 fat-tree on real OVS, the controller as its own process), each bounded
in time: the controller SIGKILLed under traffic and restarted on its state dir; 100 link flaps in 10 s; a
bridge restarted or wiped behind the controller's back.

After each, the switches must hold exactly what the controller wants — read from OVS with ovs-ofctl and
compared with the desired programs recomputed here by the pure routing core (not with what the controller
says it holds) — with no stale flow, group or meter.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.sm.addressing import mac_str
from controller.sm.intents import COOKIE_MAGIC, ForwardingOptions
from controller.sm.manager import SubnetContext, SubnetManager
from emulation.headroom import CLEAN_LOSS, HostNs, assess, snapshot
from emulation.ifflags import set_up
from emulation.ovs import OvsDaemon, OvsFabric, leftovers
from tests.conftest import ROOT
from tests.emulation_support import (
    LOAD_SHARE,
    ControllerProcess,
    ovs_daemon_fixture,  # noqa: F401
    wait_for,
)
from topologies.loader import load_topology

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
SWITCHES = 20
PROBE = [sys.executable, "-m", "emulation.probe"]
#: What traffic may lose while the controller is dead and restarting: nothing changes in the fabric, so at
#: most a failover window's worth (the switches keep forwarding on their own).
FAILOVER_WINDOW_S = 0.05


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.fabric = load_topology(TOPOLOGY)
        self.addresses = SubnetManager(self.fabric).addresses.as_strings()
        self.state_dir = tmp / "state"
        self.controller = ControllerProcess(TOPOLOGY, self.state_dir, tmp / "controller.log")
        self.net = OvsFabric(self.fabric, self.addresses, controller=self.controller.openflow)
        self.context = SubnetContext.build(self.fabric)

    def desired(self) -> dict[str, tuple[dict[tuple[int, frozenset[str]], str], dict[int, str]]]:
        """Every switch's desired flows ((priority, match) -> actions) and groups (id -> description) for
        the intact fabric, in ovs-ofctl's notation, from the routing core itself."""
        computation = self.context.compute("ftree", ForwardingOptions(), {}, 1)
        result = {}
        for name, program in computation.programs.items():
            flows = {
                (f.priority, frozenset(_match_text(f.match))): ",".join(_action_text(a) for a in f.actions)
                for f in program.flows.values()
            }
            groups = {
                g.group_id: f"type={g.kind.value}," + ",".join(f"{p}" for p in g.ports)
                for g in program.groups.values()
            }
            result[name] = (flows, groups)
        return result

    def installed(
        self, switch: str
    ) -> tuple[dict[tuple[int, frozenset[str]], str], dict[int, str], list[int]]:
        """What OVS holds: flows, groups (same notation as `desired`) and every flow's cookie."""
        flows: dict[tuple[int, frozenset[str]], str] = {}
        cookies = []
        for line in self.net.dump_flows(switch):
            head, _, actions = line.partition(" actions=")
            head = head.replace("send_flow_rem ", "").replace(", ", ",")  # our entries ask for flow-removed
            fields = [f.strip() for f in head.split(",") if f.strip()]
            cookies += [int(f.split("=")[1], 16) for f in fields if f.startswith("cookie=")]
            priority = next(int(f.split("=")[1]) for f in fields if f.startswith("priority="))
            matched = frozenset(f for f in fields if not f.startswith(("cookie=", "priority=")))
            flows[(priority, matched)] = actions.replace("CONTROLLER:65535", "controller")
        out = _ofctl("dump-groups", self.net.bridge_of(switch))
        groups = {}
        for line in out.splitlines():
            m = re.search(r"group_id=(\d+),type=(\w+),(.*)", line)
            if m:
                ports = re.findall(r"actions=output:(\d+)", m[3])
                groups[int(m[1])] = f"type={m[2]}," + ",".join(ports)
        return flows, groups, cookies

    def assert_holds_exactly_the_desired_programs(self) -> None:
        desired = self.desired()
        for switch in self.fabric.switches:
            flows, groups, cookies = self.installed(switch.name)
            want_flows, want_groups = desired[switch.name]
            assert flows == want_flows, (switch.name, set(flows) ^ set(want_flows))
            assert groups == want_groups, (switch.name, groups, want_groups)
            assert all(c >> 48 == COOKIE_MAGIC >> 48 for c in cookies), switch.name  # ours, no stale foreign
            meters = _ofctl("dump-meters", self.net.bridge_of(switch.name))
            assert "meter=" not in meters, (switch.name, meters)

    def in_sync(self) -> bool:
        health = self.controller.get("health")
        return bool(health["in_sync"] and health["switches_connected"] == SWITCHES)

    def rss_mb(self) -> float:
        assert self.controller.proc is not None
        for line in Path(f"/proc/{self.controller.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def hosts(self) -> list[HostNs]:
        return [HostNs(h.name, f"/run/netns/{self.net.namespace_of(h.name)}") for h in self.fabric.hosts]


def _ofctl(command: str, bridge: str) -> str:
    done = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", command, bridge], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout


def _match_text(fields: tuple[tuple[str, int], ...]) -> list[str]:
    names = dict(fields)
    out = []
    if names.get("eth_type") == 0x0806:
        out.append("arp")
    elif "eth_type" in names:
        out.append(f"dl_type=0x{names['eth_type']:04x}")
    if "in_port" in names:
        out.append(f"in_port={names['in_port']}")
    if "eth_dst" in names:
        out.append(f"dl_dst={mac_str(names['eth_dst'])}")
    if "eth_src" in names:
        out.append(f"dl_src={mac_str(names['eth_src'])}")
    return out


def _action_text(action: tuple[str, int]) -> str:
    kind, arg = action
    return {"output": f"output:{arg}", "group": f"group:{arg}", "controller": "controller"}[kind]


@pytest.fixture(name="rig")
def rig_fixture(tmp_path: Path, ovs_daemon: OvsDaemon) -> Iterator[Rig]:
    """A fresh fabric and controller for each drill (a drill must not inherit another's damage)."""
    r = Rig(tmp_path)
    r.controller.start()
    try:
        r.net.up()
        r.controller.ready(SWITCHES)
        yield r
    finally:
        try:
            if r.controller.proc is not None:
                r.controller.stop()
        finally:
            r.net.down()
    assert leftovers(r.net.tag) == []


def test_the_pure_core_and_ovs_agree_after_bring_up(rig: Rig) -> None:
    """The comparison the drills rely on works: a fresh fabric holds exactly the desired programs."""
    rig.assert_holds_exactly_the_desired_programs()
    flows, groups, _ = rig.installed("leaf1")
    assert len(flows) == 18 and groups  # 16 destinations + LLDP + ARP; fast-failover groups upward


def test_controller_sigkilled_under_traffic_and_restarted_on_its_state_dir(
    rig: Rig, k4_capacity: dict[str, Any]
) -> None:
    rate = min(2000.0, LOAD_SHARE * k4_capacity["total_pps"])
    dst_ip = rig.net.address_of("h16")
    receiver = rig.net.popen("h16", [*PROBE, "recv", "6100", "24"], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
    ports = [
        rig.net.veth_of(r.node, r.port) for r in rig.fabric.port_map if rig.fabric.nodes[r.node].is_switch
    ]
    before = snapshot(ports, rig.hosts())
    send = [*PROBE, "send", dst_ip, "6100", f"{rate:.0f}", "20"]  # long enough for a slow restart
    sender = rig.net.popen("h1", send, stdout=subprocess.PIPE, text=True)
    start = time.monotonic()
    time.sleep(1.0)
    assert rig.controller.proc is not None
    old_pid = rig.controller.proc.pid
    rig.controller.proc.send_signal(signal.SIGKILL)  # no handler runs, no goodbye to the switches
    rig.controller.proc.wait(10)
    rig.controller.proc = None
    rig.controller.start()  # same state dir, same ports
    assert rig.controller.proc is not None and rig.controller.proc.pid != old_pid
    rig.controller.ready(SWITCHES, timeout_s=30)
    restarted_in = time.monotonic() - start
    sent = json.loads(sender.communicate(timeout=60)[0])
    got = json.loads(receiver.communicate(timeout=60)[0])
    after = snapshot(ports, rig.hosts())
    headroom = assess(
        before, after, int(sent["sent"]), latency_p99_ms=(got.get("latency_ms") or {}).get("p99")
    )
    assert restarted_in < 20, restarted_in  # the restart happened while traffic ran
    lost = int(sent["sent"]) - int(got["received"])
    if not headroom["emulator_overloaded"]:  # else the emulator's own drops would blur the figure
        assert lost <= rate * FAILOVER_WINDOW_S + CLEAN_LOSS * int(sent["sent"]), (lost, got["gaps"][:5])
    events = rig.controller.get("events")
    connects = [e for e in events if e["kind"] == "switch_connect"]
    assert len(connects) == SWITCHES and all(e["flow_mods"] == 0 for e in connects), connects[:2]
    rig.assert_holds_exactly_the_desired_programs()


def test_a_hundred_link_flaps_in_ten_seconds(rig: Rig) -> None:
    links = [
        lk for lk in rig.fabric.links
        if rig.fabric.nodes[lk.a.node].is_switch and rig.fabric.nodes[lk.b.node].is_switch
    ]  # fmt: skip
    rng = random.Random(14)

    def flap(count: int, period_s: float) -> float:
        began = time.monotonic()
        for i in range(count):
            link = rng.choice(links)
            end = rng.choice((link.a, link.b))
            set_up(rig.net.veth_of(end.node, end.port), up=False)
            time.sleep(max(0.0, began + (i + 0.5) * period_s - time.monotonic()))
            set_up(rig.net.veth_of(end.node, end.port), up=True)
            time.sleep(max(0.0, began + (i + 1) * period_s - time.monotonic()))
        return time.monotonic() - began

    flap(10, 0.1)  # warm-up: the allocator's pools, the first reroutes' caches
    wait_for(rig.in_sync, 60, "in sync after the warm-up")
    baseline = rig.rss_mb()
    took = flap(100, 0.1)
    assert took < 12, took  # 100 flaps in 10 s (a little slack for the `ip` processes)
    wait_for(lambda: all(lk["up"] for lk in rig.controller.get("links")) and rig.in_sync(), 60, "settled")
    events = rig.controller.get("events?limit=1000")
    assert sum(e["kind"] in ("port_down", "port_up") for e in events) >= 20  # it did reroute, in batches
    assert not [e for e in events if e.get("failed_switches")], "a rollout failed"
    rig.assert_holds_exactly_the_desired_programs()
    pairs = [(a.name, b.name) for a in rig.fabric.hosts for b in rig.fabric.hosts if a != b]
    result = rig.net.ping_all(pairs, timeout_s=10)  # a busy emulator delays echoes by up to a second
    assert all(result.values()), [p for p, ok in result.items() if not ok][:5]
    grown = rig.rss_mb() - baseline
    assert grown < max(10.0, 0.1 * baseline), f"controller RSS grew {grown:.1f} MB over {baseline:.1f} MB"


@pytest.mark.parametrize("how", ["del-flows+del-groups", "del-br+add-br"])
def test_a_wiped_or_restarted_bridge_is_reconciled_within_a_second(rig: Rig, how: str) -> None:
    leaf = rig.net.bridge_of("leaf1")
    desired_flows, desired_groups = rig.desired()["leaf1"]
    since = rig.controller.get("events")[-1]["id"]
    start = time.monotonic()
    if how == "del-br+add-br":
        rig.net.restart_bridge("leaf1")  # same dpid and ports, no flows: reconnects
    else:
        _ofctl("del-flows", leaf)  # no reconnect, no port change: only flow-removed messages tell
        _ofctl("del-groups", leaf)
    wiped = time.monotonic()

    def restored() -> bool:
        flows, groups, _ = rig.installed("leaf1")
        return flows == desired_flows and groups == desired_groups

    wait_for(restored, 10, "leaf1 restored")
    took = time.monotonic() - wiped
    assert took < 1.0, f"reconciled {took:.2f} s after the wipe ({wiped - start:.2f} s to wipe)"
    kinds = ("reconcile", "switch_connect")

    def repairs() -> list[dict[str, Any]]:  # recorded once the repair's break phase is confirmed too
        events = rig.controller.get(f"events?since={since}")
        return [e for e in events if e.get("switch") == "leaf1" and e["kind"] in kinds]

    first = wait_for(repairs, 10, "the repair recorded")[0]
    assert first["flow_mods"] >= len(desired_flows), first  # it was wiped, and refilled
    events = rig.controller.get(f"events?since={since}")
    if how == "del-flows+del-groups":  # no reconnect: the switch's flow-removed messages told the controller
        lost = [e for e in events if e["kind"] == "entries_lost"]
        assert lost and lost[0]["switch"] == "leaf1" and lost[0]["entries_lost"] > 0, events
    wait_for(rig.in_sync, 10, "in sync")
    rig.assert_holds_exactly_the_desired_programs()
