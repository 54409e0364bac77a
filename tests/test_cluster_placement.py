"""Where `emulate up --dask` puts the shards (`emulation.cluster`): only workers offering the
`fabriclab-emu` resource, shard i on worker i mod W in address order, the same cluster the same placement;
a cluster without such a worker is an error that says how to start one."""

from __future__ import annotations

from typing import Any

import pytest

from controller.sm.manager import SubnetManager
from emulation.cluster import EMU_RESOURCE, ClusterFabric, emulation_workers, place
from emulation.mnfabric import EmulationError, Scale
from emulation.sharded import ShardedFabric
from emulation.shards import plan
from tests.conftest import ROOT
from topologies.generators import fat_tree
from topologies.loader import load_topology

INFO = {
    "workers": {
        "tcp://10.0.0.3:4001": {"host": "10.0.0.3", "resources": {EMU_RESOURCE: 1}},
        "tcp://10.0.0.2:4001": {"host": "10.0.0.2", "resources": {EMU_RESOURCE: 1}},
        "tcp://10.0.0.9:4001": {"host": "10.0.0.9", "resources": {}},  # a sweep worker: not ours
        "tcp://10.0.0.4:4001": {"host": "10.0.0.4", "resources": {EMU_RESOURCE: 0.5}},
    }
}


def test_only_emulation_hosts_count_in_address_order_with_their_underlay_address() -> None:
    assert emulation_workers(INFO) == [
        ("tcp://10.0.0.2:4001", "10.0.0.2"),
        ("tcp://10.0.0.3:4001", "10.0.0.3"),
    ]
    assert emulation_workers({"workers": {}}) == []


def test_shards_spread_over_machines_before_two_share_one_and_pods_stay_whole() -> None:
    fabric = load_topology(ROOT / "topologies" / "fat-tree-k8.yaml")
    shard_plan = plan(fabric, 4)
    workers = [w for w, _ in emulation_workers(INFO)]
    placement = place(shard_plan, workers)
    assert placement == {0: workers[0], 1: workers[1], 2: workers[0], 3: workers[1]}
    assert place(shard_plan, list(reversed(workers))) != placement  # order given is order used ...
    assert place(shard_plan, workers) == placement  # ... and the same cluster, the same placement
    machine_of = {n: placement[s] for n, s in shard_plan.shard_of.items()}
    for link in fabric.links:  # a host is on its leaf's machine: host cables never cross machines
        a, b = link.a.node, link.b.node
        if fabric.nodes[a].is_host or fabric.nodes[b].is_host:
            assert machine_of[a] == machine_of[b], link


def test_no_emulation_host_is_an_error_saying_how_to_start_one() -> None:
    fabric = load_topology(ROOT / "topologies" / "fat-tree-k4.yaml")
    with pytest.raises(EmulationError, match=f"--resources {EMU_RESOURCE}=1"):
        place(plan(fabric, 2), [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"crossing": "veth", "underlay": {0: "10.0.0.2", 1: "10.0.0.3"}}, "crosses between them with vxlan"),
        ({"underlay": {0: "10.0.0.2"}}, r"no underlay address for shards \[1\]"),
        ({"underlay": {0: "10.0.0.2", 1: "10.0.0.3"}, "local": [2]}, r"local shards \[2\]: only 0..1 exist"),
        ({"underlay": {0: "10.0.0.2", 1: "10.0.0.3"}, "qos": object()}, "QoS needs shaped links"),
    ],
)
def test_a_machines_part_is_refused_whole_when_it_cannot_be_built(
    kwargs: dict[str, Any], message: str
) -> None:
    fabric = load_topology(ROOT / "topologies" / "fat-tree-k4.yaml")
    args = {"crossing": "vxlan", "local": [0], **kwargs}
    crossing, local, underlay = args.pop("crossing"), args.pop("local"), args.pop("underlay")
    with pytest.raises(EmulationError, match=message):
        ShardedFabric(fabric, SubnetManager(fabric).addresses.as_strings(), 2, crossing, local=local,
                      underlay=underlay, name_prefix="zq", **args)  # fmt: skip


def test_names_too_long_for_a_machine_are_refused_before_any_worker_builds() -> None:
    """k=16 switches have ports 1..16: `abcdefs100-eth16` is longer than an interface name may be."""
    fabric = fat_tree(16)
    with pytest.raises(EmulationError, match="longer than a Linux interface name"):
        ClusterFabric(fabric, SubnetManager(fabric).addresses.as_strings(), 8, "tcp://192.0.2.1:8786",
                      name_prefix="abcdef")  # fmt: skip


def test_each_machine_shapes_exactly_the_cable_ends_it_holds() -> None:
    """Shaped links across machines: every end of every cable (a host's, a switch port's, each end of a
    cable between machines) is shaped by exactly one machine, the one holding it."""
    fabric = load_topology(ROOT / "topologies" / "fat-tree-k8.yaml")
    addresses = SubnetManager(fabric).addresses.as_strings()
    underlay = {i: f"10.0.0.{2 + i % 2}" for i in range(4)}
    parts = [ShardedFabric(fabric, addresses, 4, "vxlan", local=local, underlay=underlay, name_prefix="zq",
                           scale=Scale.parse("400G=200M")) for local in ([0, 2], [1, 3])]  # fmt: skip
    shaped = [(e.node, e.port) for part in parts for link in fabric.links for e in part._ends_here(link)]
    every = [(e.node, e.port) for link in fabric.links for e in (link.a, link.b)]
    assert sorted(shaped) == sorted(every) and len(set(shaped)) == len(shaped)
    for part in parts:  # and only its own
        assert all(part.plan.shard_of[n] in part.local for link in fabric.links
                   for n in (e.node for e in part._ends_here(link)))  # fmt: skip


def test_a_fault_the_cluster_cannot_carry_out_is_a_named_503_not_a_500() -> None:
    """A machine gone: the fault is valid, the fabric cannot apply it; the emulator API says which end and
    why with 503 (422 stays for a bad target)."""
    from fastapi.testclient import TestClient

    from emulation.api import create_app
    from emulation.session import apply_fault

    fabric = load_topology(ROOT / "topologies" / "fat-tree-k4.yaml")
    net = ClusterFabric(fabric, SubnetManager(fabric).addresses.as_strings(), 2, "tcp://192.0.2.1:8786",
                        name_prefix="zq")  # fmt: skip
    net.placement = {0: "tcp://10.0.0.2:4001", 1: "tcp://10.0.0.3:4001"}  # placed, but no actor answers
    app = create_app(lambda action, target: apply_fault(net, action, target), {})
    client = TestClient(app, base_url="http://127.0.0.1:8081")
    cut = client.post("/api/v1/faults", json={"action": "link_down", "target": "leaf1:3"})
    assert cut.status_code == 503, cut.text
    assert "leaf1:3" in cut.text and "is gone" in cut.text
    bad = client.post("/api/v1/faults", json={"action": "link_down", "target": "leaf1:99"})
    assert bad.status_code == 422, bad.text
