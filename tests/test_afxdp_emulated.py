"""Switch ports as AF_XDP sockets (`--ports afxdp`, `emulation.fastports`) keep the fabric's behaviour.

The emulator's capacity work (issue 31) moved host traffic off ovs-vswitchd's packet sockets onto AF_XDP
rings: on the k=4 fat-tree 12,500 clean pkt/s per host instead of 3,000.  What must not change with it:
every pair reachable through the controller's tables, a cut cable dropping its host and a restored one
bringing it back (the AF_XDP socket outlives the carrier loss), and probe traffic delivered — on the
system's Open vSwitch and on one shard with patch cables, the two builds `--ports` serves.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from emulation import calibrate
from emulation.mesh import check_all_pairs
from emulation.mnfabric import MininetFabric, mininet_available
from emulation.sharded import ShardedFabric
from tests.conftest import ROOT
from tests.emulation_support import (  # noqa: F401 - the ovs_daemon fixture
    ovs_daemon_fixture,
    require_emulation,
    unique_prefix,
)
from topologies.loader import load_topology

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"


def _port_types(net: MininetFabric) -> dict[str, str]:
    """Interface name -> type, as the fabric's ovs-vswitchd has them."""
    dbs = [f"--db=unix:{d.db}" for d in net.daemons] if isinstance(net, ShardedFabric) else [None]
    types: dict[str, str] = {}
    for db in dbs:
        argv = [
            "ovs-vsctl",
            *([db] if db else []),
            "--format=json",
            "--columns=name,type",
            "list",
            "Interface",
        ]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
        types.update({name: kind for name, kind in json.loads(out)["data"]})
    return types


def _reachable_from(net: MininetFabric, host: str) -> int:
    return sum(ok for (src, _), ok in check_all_pairs(net.endpoints()).items() if src == host)


@pytest.mark.parametrize("cables", ["auto", "patch"], ids=["system-ovs", "one-shard-patch"])
def test_afxdp_ports_carry_the_fabric_through_a_cut_and_a_restore(
    ovs_daemon: Any, tmp_path: Path, cables: str
) -> None:
    require_emulation(mininet_available())
    fabric = load_topology(TOPOLOGY)
    with calibrate.controlled_fabric(TOPOLOGY, fabric, tmp_path, None, unique_prefix("x"), cables=cables,
                                     ports="afxdp") as (_, net):  # fmt: skip
        if net.port_choice.kind != "afxdp":
            require_emulation(f"this Open vSwitch offers no AF_XDP ports ({net.port_choice.describe()})")
        types = _port_types(net)
        ours = {i: types[i] for i in net.switch_interfaces() if i in types}
        nodes = fabric.nodes
        hosts_side = {net.switch_intf(r.node, r.port) for link in fabric.links for r in (link.a, link.b)
                      if nodes[r.node].is_switch and nodes[link.other(r).node].is_host}  # fmt: skip
        assert {ours[i] for i in hosts_side} == {"afxdp-nonpmd"}, ours
        if cables == "patch":
            assert set(ours.values()) == {"afxdp-nonpmd", "patch"}, ours
        pairs = check_all_pairs(net.endpoints())
        assert all(pairs.values()), [p for p, ok in pairs.items() if not ok][:5]

        h1 = fabric.hosts[0].name
        leaf, port = next((r.node, r.port) for link in fabric.links for r in (link.a, link.b)
                          if link.other(r).node == h1)  # fmt: skip
        net.set_link(leaf, port, up=False)
        time.sleep(0.5)
        assert _reachable_from(net, h1) == 0
        net.set_link(leaf, port, up=True)
        deadline = time.monotonic() + 20
        while (got := _reachable_from(net, h1)) < len(fabric.hosts) - 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert got == len(fabric.hosts) - 1, f"{h1} reaches {got} hosts after its cable was restored"

        # probe traffic, far below the fabric's capacity (12,500 pkt/s per host measured): all delivered
        step = calibrate.measure_step(net, calibrate.half_shift(fabric), 300.0, 2.0)
        assert step["sent"] >= 0.95 * 300 * 2 * len(fabric.hosts), step
        assert step["received"] >= 0.99 * step["sent"], step
