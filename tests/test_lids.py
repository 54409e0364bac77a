"""LID assignment: deterministic, OpenSM's order on a fresh fabric, stable across re-sweeps."""

from __future__ import annotations

import pytest

from controller.sm.lids import MAX_UNICAST_LID, LidSpaceExhausted, assign_lids
from topologies.faults import degrade
from topologies.generators import fat_tree, rail
from topologies.model import Fabric, Link, Node, NodeKind, PortRef


def test_fresh_fabric_numbers_hosts_then_switches_in_guid_order() -> None:
    fabric = fat_tree(4)
    lids = assign_lids(fabric)
    assert [lids.lid(f"h{i}") for i in range(1, 17)] == list(range(1, 17))
    assert lids.lid("leaf1") == 17 and lids.lid("core4") == 36
    assert lids.max_lid == 36 and len(lids) == 36
    assert assign_lids(fabric) == lids


def test_resweep_keeps_every_lid_and_a_returning_switch_gets_its_own_back() -> None:
    fabric = fat_tree(4)
    first = assign_lids(fabric)
    broken = degrade(fabric, fail_links=2, fail_switches=1, seed=3).fabric
    second = assign_lids(broken, previous=first)
    for guid, lid in second.by_guid.items():
        assert first.by_guid[guid] == lid
    gone = set(first.by_guid) - set(second.by_guid)
    assert gone and all(second.remembered[g] == first.by_guid[g] for g in gone)
    # a new node never takes a remembered LID
    node = Node("newsw", NodeKind.SWITCH, 0x1234, 2)
    grown = Fabric(
        broken.name,
        {**broken.nodes, "newsw": node},
        (*broken.links, Link(PortRef("newsw", 1), PortRef("h1", 2), 100.0)),
    )
    third = assign_lids(grown, previous=second)
    assert third.by_guid[0x1234] not in set(second.remembered.values()) | set(second.by_guid.values())
    back = assign_lids(fabric, previous=third)
    assert all(back.by_guid[g] == first.by_guid[g] for g in first.by_guid)


def test_every_connected_host_port_gets_a_lid() -> None:
    fabric = rail(2, 4)
    lids = assign_lids(fabric)
    assert len(lids) == len(fabric.hosts) + len(fabric.switches)
    assert sorted(lids.endpoints) == list(range(1, len(lids) + 1))


def test_lid_space_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    import controller.sm.lids as module

    monkeypatch.setattr(module, "MAX_UNICAST_LID", 10)
    with pytest.raises(LidSpaceExhausted, match="more than 10"):
        module.assign_lids(fat_tree(4))
    assert MAX_UNICAST_LID == 0xBFFF
