"""The controller against real Open vSwitch (userspace datapath), hosts in network namespaces.

One k=4 fat-tree (20 bridges, 16 host namespaces) and one controller process for the module; tests run in
file order and each leaves the fabric healthy for the next.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.sm.manager import SubnetManager
from emulation.ovs import OvsDaemon, OvsFabric, leftovers
from tests.conftest import ROOT
from tests.emulation_support import ControllerProcess, ovs_daemon_fixture, wait_for  # noqa: F401
from topologies.loader import load_topology

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
SWITCHES = 20


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.fabric = load_topology(TOPOLOGY)
        sm = SubnetManager(self.fabric)
        self.addresses = sm.addresses.as_strings()
        self.controller = ControllerProcess(TOPOLOGY, tmp / "state", tmp / "controller.log")
        self.net = OvsFabric(self.fabric, self.addresses, controller=self.controller.openflow)
        self.hosts = [h.name for h in self.fabric.hosts]

    def all_pairs(self) -> list[tuple[str, str]]:
        return [(a, b) for a in self.hosts for b in self.hosts if a != b]

    def assert_all_pairs_ping(self) -> None:
        result = self.net.ping_all(self.all_pairs(), timeout_s=2.0)
        failed = [pair for pair, ok in result.items() if not ok]
        assert not failed, f"{len(failed)} of {len(result)} pairs failed, e.g. {failed[:5]}"

    def assert_switches_hold_exactly_the_desired_tables(self) -> None:
        """What OVS really holds (not what the controller believes): no stale, missing or duplicate
        entries."""
        for view in self.controller.get("switches"):
            flows = self.net.dump_flows(view["name"])
            assert len(flows) == view["desired_flows"], (view, len(flows))
            assert len({f.split(" actions=")[0].split(", ", 1)[1] for f in flows}) == len(
                flows
            )  # unique matches
            groups = [g for g in _groups(self, view["name"]) if "group_id=" in g]
            assert len(groups) == view["desired_groups"], view
            generation = self.controller.get("health")["generation"]
            assert all(int(f.split(",")[0].split("=")[1], 16) & 0xFFFFFFFFFFFF <= generation for f in flows)

    def flows(self) -> dict[str, list[str]]:
        return {s.name: sorted(self.net.dump_flows(s.name)) for s in self.fabric.switches}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, ovs_daemon: OvsDaemon) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("ovs"))
    r.controller.start()
    try:
        r.net.up()
        r.controller.ready(SWITCHES)
        yield r
    finally:
        if r.controller.proc is not None:
            r.controller.stop()
        r.net.down()
        assert leftovers(r.net.tag) == []


def test_all_pairs_reach_each_other_through_the_controllers_tables(rig: Rig) -> None:
    rig.assert_all_pairs_ping()
    flows = rig.flows()
    for switch, entries in flows.items():
        routes = [f for f in entries if "priority=100," in f]
        assert len(routes) == 16, switch
        assert all("cookie=0xfab1" in f for f in entries), switch  # nothing but ours: no NORMAL, no learning
    report = wait_for(
        lambda: rig.controller.get("validation")["complete"] and rig.controller.get("validation"),
        15,
        "discovery",
    )
    assert report["summary"] == {"ok": 32} and report["unexpected"] == []
    assert {h["status"] for h in report["hosts"]} == {"ok"}  # every host seen (ARP) on its declared port


def test_fabric_and_route_views_match_the_switches(rig: Rig) -> None:
    route = rig.controller.get("routes?src=h1&dst=h16")
    hops = route["hops"]
    assert hops[0]["node"] == "h1" and hops[-1]["node"] == "h16" and len(hops) == 7
    leaf = hops[1]
    group_or_port = [f for f in rig.net.dump_flows(leaf["node"]) if rig.addresses[("h16", 1)][0] in f]
    assert len(group_or_port) == 1
    lft = rig.controller.get(f"switches/{leaf['node']}/lft")
    dest = next(e for e in lft["entries"] if e["dest"] == "h16:1")
    assert dest["port"] == leaf["out_port"]
    links = rig.controller.get("links")
    assert all(lk["up"] for lk in links)

    def received() -> int:  # counters are polled periodically and published; the pings above show up
        links = rig.controller.get("links")
        return sum(lk["b_counters"]["rx_packets"] for lk in links if lk.get("b_counters"))

    wait_for(received, 10, "port counters with traffic")


def test_a_cut_link_is_rerouted_and_reported(rig: Rig) -> None:
    since = rig.controller.get("events")[-1]["id"]
    rig.net.set_link("agg1", 1, up=False)  # leaf1:3 -- agg1:1; leaf1's end loses carrier
    event = wait_for(
        lambda: [e for e in rig.controller.get(f"events?since={since}") if e["kind"] == "port_down"],
        10,
        "port_down",
    )[0]
    assert event["flow_mods"] > 0 and event["installed_ms"] >= event["computed_ms"] > 0
    assert event["installed_ms"] < 2000
    rig.controller.ready(SWITCHES)
    rig.assert_all_pairs_ping()
    route = rig.controller.get("routes?src=h1&dst=h16")
    assert not any(
        h["node"] == "agg1" for h in route["hops"][1:3] if h["node"] == "leaf1" and h["out_port"] == 3
    )
    assert next(lk for lk in rig.controller.get("links") if not lk["up"])["a"] in ("leaf1:3", "agg1:1")
    rig.assert_switches_hold_exactly_the_desired_tables()
    rig.net.set_link("agg1", 1, up=True)
    wait_for(lambda: all(lk["up"] for lk in rig.controller.get("links")), 10, "link back up")
    rig.controller.ready(SWITCHES)
    rig.assert_all_pairs_ping()
    rig.assert_switches_hold_exactly_the_desired_tables()


def test_rejected_rest_calls_change_nothing(rig: Rig) -> None:
    before = rig.flows()
    routing = rig.controller.get("routing")
    for body in ('{"engine": "bogus"}', '{"engine": "sssp", "extra": 1}', "{"):
        status, reply = rig.controller.request("PUT", "routing", body)
        assert 400 <= status < 500 and reply["error"], reply
    assert rig.controller.get("routing") == routing
    assert rig.flows() == before


def test_engine_change_over_rest_reprograms_the_switches(rig: Rig) -> None:
    status, event = rig.controller.request("PUT", "routing", '{"engine": "sssp"}')
    assert status == 200 and event["kind"] == "routing_change" and event["failed_switches"] == {}
    rig.controller.ready(SWITCHES)
    rig.assert_all_pairs_ping()
    status, event = rig.controller.request("PUT", "routing", '{"engine": "ftree", "multipath": true}')
    assert status == 200
    assert any("type=select" in line for line in _groups(rig, "leaf1"))
    rig.assert_all_pairs_ping()
    rig.controller.request("PUT", "routing", '{"multipath": false}')
    rig.controller.ready(SWITCHES)


def _groups(rig: Rig, switch: str) -> list[str]:
    import subprocess

    out = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", rig.net.bridge_of(switch)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def test_restarted_controller_reconciles_without_touching_flows(rig: Rig) -> None:
    before = rig.flows()
    assert rig.controller.stop() == 0  # SIGTERM: clean exit
    rig.controller.start()
    rig.controller.ready(SWITCHES)
    connects = wait_for(
        lambda: (
            len(e := [x for x in rig.controller.get("events") if x["kind"] == "switch_connect"]) == SWITCHES
            and e
        ),
        30,
        "all switches reconnected",
    )
    assert all(e["flow_mods"] == 0 for e in connects), [e for e in connects if e["flow_mods"]][:2]
    assert rig.flows() == before  # same entries, same cookies, no duplicates
    rig.assert_all_pairs_ping()
    rig.assert_switches_hold_exactly_the_desired_tables()


def test_twenty_reconnect_cycles_keep_threads_flat_and_discovery_complete(rig: Rig) -> None:
    threads = []
    for _ in range(20):
        rig.net.set_controller(None)
        wait_for(lambda: rig.controller.get("health")["switches_connected"] == 0, 20, "all disconnected")
        rig.net.set_controller(rig.controller.openflow)
        health = rig.controller.ready(SWITCHES)
        wait_for(lambda: rig.controller.get("validation")["complete"], 20, "discovery complete")
        threads.append(health["threads"])
    # threads of the last cycle's connections end shortly after it: no per-cycle growth once they have
    deadline = time.monotonic() + 20
    while (final := rig.controller.get("health")["threads"]) > threads[0] + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert final <= threads[0] + 4, (threads, final)
    rig.assert_all_pairs_ping()
    rig.assert_switches_hold_exactly_the_desired_tables()
