"""RoCEv2 agents in an emulated fabric: every packet sent is received, in PSN order, with a valid ICRC,
on a static route through the controller's tables (k=4 fat-tree on Mininet + userspace OVS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess
from emulation.mnfabric import MininetFabric, mininet_available
from emulation.ovs import OvsDaemon
from tests.conftest import ROOT
from tests.emulation_support import require_emulation
from topologies.loader import load_topology

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"


def test_every_packet_arrives_in_psn_order_with_valid_icrc(tmp_path: Path) -> None:
    require_emulation(mininet_available())
    daemon = OvsDaemon()
    daemon.ensure_running()
    fabric = load_topology(TOPOLOGY)
    sm = SubnetManager(fabric)
    addresses = sm.addresses.as_strings()
    ctl = ControllerProcess(TOPOLOGY, tmp_path / "state", tmp_path / "controller.log")
    ctl.start()
    net = MininetFabric(fabric, addresses, controller=ctl.openflow)
    count = 10_000
    try:
        net.start()
        ctl.ready(len(fabric.switches))
        src, dst = addresses[("h1", 1)], addresses[("h16", 1)]
        receiver = net.popen(
            "h16",
            [sys.executable, "-m", "traffic.agent", "recv", net.intf_name("h16", 1), "--duration", "30",
             "--expect", str(count + 200)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        args = [
            sys.executable,
            "-m",
            "traffic.agent",
            "send",
            net.intf_name("h1", 1),
            "--src-mac",
            src[0],
            "--dst-mac",
            dst[0],
            "--src-ip",
            src[1],
            "--dst-ip",
            dst[1],
            "--size",
            "1024",
            "--rate",
            "5000",
        ]
        # Warm-up on another QP: the first packets of a new flow take OVS's slow path (upcalls) in every
        # bridge, and the userspace datapath may drop some of them; the measured stream starts after.
        net.popen("h1", [*args, "--qp", "6", "--count", "200"], stdout=subprocess.PIPE).communicate(
            timeout=60
        )
        sender = net.popen(
            "h1", [*args, "--qp", "7", "--count", str(count)], stdout=subprocess.PIPE, text=True
        )
        sent = json.loads(sender.communicate(timeout=60)[0])
        got = json.loads(receiver.communicate(timeout=60)[0])
    finally:
        net.stop()
        ctl.stop()
        daemon.stop_if_started()
    assert sent["sent"] == count
    qp = got["qps"]["7"]
    assert (qp["received"], qp["lost"], qp["out_of_order"], qp["bad_icrc"]) == (count, 0, 0, 0), qp
