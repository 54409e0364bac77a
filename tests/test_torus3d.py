"""The 3-D torus generator: the cabling of a torus (every switch one hop from its 6 neighbours, rings
closing), from the CLI too, and routed deadlock-free by dfsssp with its lanes checked by the verifier."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from controller.sm.engines import default_registry
from controller.sm.subnet import Subnet
from controller.sm.verify import verify
from fabriclab.cli import main
from topologies.direct import torus
from topologies.loader import load_topology


def test_every_switch_has_its_six_torus_neighbours() -> None:
    fabric = torus(3, 4, 2, z=5)
    switches = {s.name for s in fabric.switches}
    assert len(switches) == 60 and len(fabric.hosts) == 120
    neighbours: dict[str, Counter[str]] = {name: Counter() for name in switches}
    for link in fabric.links:
        if link.a.node in switches and link.b.node in switches:
            neighbours[link.a.node][link.b.node] += 1
            neighbours[link.b.node][link.a.node] += 1
    for name, seen in neighbours.items():
        i, j, k = (int(v) for v in name[1:].split("_"))
        expected = Counter(
            [f"s{(i + d) % 3}_{j}_{k}" for d in (1, -1)]
            + [f"s{i}_{(j + d) % 4}_{k}" for d in (1, -1)]
            + [f"s{i}_{j}_{(k + d) % 5}" for d in (1, -1)]
        )
        assert seen == expected, name
    assert fabric.name == "torus-3x4x5" and fabric.meta["generator"]["z"] == 5


def test_a_2d_torus_is_as_it_was() -> None:
    flat = torus(4, 4, 1)
    assert flat.name == "torus-4x4" and "s3_3" in flat.nodes and "z" not in flat.meta["generator"]


def test_dfsssp_routes_a_3d_torus_deadlock_free_checked_lane_by_lane() -> None:
    tables = default_registry().create("dfsssp").route(Subnet.build(torus(3, 3, 1, z=3)))
    result = verify(tables)
    assert result.ok and result.unreachable_pairs == 0
    assert result.deadlock is not None and result.deadlock.acyclic and result.deadlock.layers_used >= 2
    one_lane = verify(default_registry().create("minhop").route(Subnet.build(torus(3, 3, 1, z=3))))
    assert one_lane.deadlock is not None and not one_lane.deadlock.acyclic  # a torus needs lanes


def test_the_cli_generates_it_and_refuses_a_short_ring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.yaml"
    argv = ["topo", "generate", "torus", "--x", "4", "--y", "3", "--z", "3", "--hosts-per-switch", "2"]
    assert main([*argv, "-o", str(out)]) == 0
    assert load_topology(out).summary().startswith("torus-4x3x3: 36 switches, 72 hosts")
    assert main([*argv[:-4], "--z", "2", "-o", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--z: a 3-D torus needs at least 3 switches per ring, got z=2" in err
    assert not (tmp_path / "bad.yaml").exists()
