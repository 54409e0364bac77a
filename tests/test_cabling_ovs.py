"""Cabling validation on real switches: the controller is told one fabric, the cables say another."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from controller.sm.manager import SubnetManager
from emulation.ovs import OvsDaemon, OvsFabric
from tests.emulation_support import ControllerProcess, ovs_daemon_fixture, wait_for  # noqa: F401
from topologies.generators import fat_tree
from topologies.loader import dump_yaml
from topologies.model import Link, PortRef


def test_swapped_uplinks_are_reported_as_miswired(tmp_path: Path, ovs_daemon: OvsDaemon) -> None:
    declared = fat_tree(4)
    topology = tmp_path / "declared.yaml"
    topology.write_text(dump_yaml(declared))
    swap = {PortRef("leaf1", 3): PortRef("leaf1", 4), PortRef("leaf1", 4): PortRef("leaf1", 3)}
    cabled = dataclasses.replace(
        declared,
        links=tuple(Link(swap.get(lk.a, lk.a), swap.get(lk.b, lk.b), lk.bw_gbps) for lk in declared.links),
    )
    sm = SubnetManager(declared)
    addresses = sm.addresses.as_strings()
    ctl = ControllerProcess(topology, tmp_path / "state", tmp_path / "controller.log", "--lldp-interval", "1")
    ctl.start()
    try:
        with OvsFabric(cabled, addresses, controller=ctl.openflow):
            ctl.ready(len(declared.switches))

            def settled() -> dict[str, object] | None:
                report: dict[str, object] = ctl.get("validation")
                summary = report["summary"]
                assert isinstance(summary, dict)
                return report if summary.get("miswired") == 2 and summary.get("ok") == 30 else None

            report = wait_for(settled, 20, "validation to see the swap")
            bad = {e["link"]: e["seen"] for e in report["links"] if e["status"] == "miswired"}
            assert set(bad) == {"leaf1:3--agg1:1", "leaf1:4--agg2:1"}, bad
            assert report["unexpected"] == ["agg1:1--leaf1:4", "agg2:1--leaf1:3"]
            assert not report["complete"]
    finally:
        ctl.stop()
    assert "cabling:" in (tmp_path / "controller.log").read_text()
