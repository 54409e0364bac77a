"""Switch failures by tier or by name (`--fail-switches core:1,agg:2` / `agg1,core3`) on fabriclab's own,
OpenSM's and relabelled fabrics: tiers come from the cabling, so they mean the same on all three."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabriclab.cli import main
from tests.conftest import DATA
from topologies.faults import SwitchFailures, degrade, switch_tiers
from topologies.generators import fat_tree, leaf_spine, opensm_fat_tree
from topologies.ibnet import load_ibnet
from topologies.relabel import relabel


def test_tiers_come_from_the_cabling_and_match_the_generators_own() -> None:
    for fabric in (fat_tree(4), fat_tree(8), opensm_fat_tree(8), leaf_spine(4, 2, 2)):
        tiers = switch_tiers(fabric)
        assert tiers == {s.name: s.tier for s in fabric.switches}, fabric.name


def test_opensms_own_k16_has_128_leaves_128_aggregation_and_64_core_switches() -> None:
    fabric = load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz")
    counts = sorted(switch_tiers(fabric).values())
    assert [counts.count(t) for t in (0, 1, 2)] == [128, 128, 64] and len(counts) == 320


def test_relabelling_keeps_every_switchs_tier() -> None:
    fabric = fat_tree(8)
    for seed in range(3):
        relabelled = relabel(fabric, seed)
        tiers = switch_tiers(relabelled.fabric)
        assert {relabelled.names[n]: t for n, t in switch_tiers(fabric).items()} == tiers


@pytest.mark.parametrize(("spec", "tier", "count"), [("core:1", 2, 1), ("agg:3", 1, 3), ("spine:2", 1, 2)])
def test_per_tier_failures_remove_that_many_of_that_tier_and_say_so(spec: str, tier: int, count: int) -> None:
    fabric = opensm_fat_tree(8)
    tiers = switch_tiers(fabric)
    result = degrade(fabric, fail_switches=SwitchFailures.parse(spec), seed=5)
    assert len(result.failed_switches) == count
    assert all(tiers[name] == tier for name in result.failed_switches)
    assert all(name not in result.fabric.nodes for name in result.failed_switches)
    assert result.failed_switch_tiers == {("agg", "core")[tier - 1]: count}
    again = degrade(fabric, fail_switches=SwitchFailures.parse(spec), seed=5)
    assert again.failed_switches == result.failed_switches  # seeded
    others = {
        degrade(fabric, fail_switches=SwitchFailures.parse(spec), seed=s).failed_switches for s in range(8)
    }
    assert len(others) > 1  # and the seed matters


def test_a_count_fails_what_it_always_failed() -> None:
    """`--fail-switches N` keeps its meaning (random switches without hosts, the same ones for a seed as
    before tiers existed): the documented figures stay reproducible."""
    result = degrade(fat_tree(8), fail_links=3, fail_switches=2, seed=1)
    assert result.failed_switches == ("agg9", "core5")  # what the code before tiers chose (checked)
    assert result.failed_switch_tiers == {"agg": 1, "core": 1}


def test_named_switches_fail_exactly_those() -> None:
    result = degrade(fat_tree(4), fail_switches=SwitchFailures.parse("agg1,core3"))
    assert result.failed_switches == ("agg1", "core3")
    assert result.failed_switch_tiers == {"agg": 1, "core": 1} and not result.lost_hosts


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "is empty"),
        ("core:99", "cannot fail 99 core switches: the fabric has 4"),
        ("bogus:1", "unknown tier 'bogus'"),
        ("core:1,agg1", "not both"),
        ("nope", "no switch 'nope'"),
        ("agg1,agg1", "named twice"),
        ("h1", "no switch 'h1'"),
    ],
)
def test_bad_switch_failures_are_one_line_exit_2_naming_the_option(
    spec: str, message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for argv in (
        ["route", "topologies/fat-tree-k4.yaml", "--fail-switches", spec],
        [
            "topo",
            "degrade",
            "topologies/fat-tree-k4.yaml",
            "--fail-switches",
            spec,
            "-o",
            str(tmp_path / "d.yaml"),
        ],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--fail-switches" in err and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "d").exists()


def test_topo_degrade_writes_the_fabric_route_fail_routes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The written file (YAML, or ibnetdiscover for OpenSM) routes to the same tables as the same options
    on `fabriclab route`: one degraded fabric for both tools."""
    failures = ["--fail-switches", "core:1,agg:1", "--fail-links", "3", "--seed", "4"]
    assert main(["route", "topologies/fat-tree-k8.yaml", "--engine", "ftree", *failures]) == 0
    direct = capsys.readouterr().out
    for extra, name in (([], "d.yaml"), (["--ibnet"], "d.net")):
        out = tmp_path / name
        assert (
            main(["topo", "degrade", "topologies/fat-tree-k8.yaml", *failures, *extra, "-o", str(out)]) == 0
        )
        assert "switches [agg23, core3] (1 agg, 1 core)" in capsys.readouterr().err
        assert main(["route", str(out), "--engine", "ftree"]) == 0
        via_file = capsys.readouterr().out
        tables = [line.split("tables ")[1] for line in (direct, via_file) for line in line.splitlines()
                  if "tables " in line]  # fmt: skip
        assert len(tables) == 2 and tables[0] == tables[1], (direct, via_file)
    assert main(["topo", "degrade", "topologies/fat-tree-k8.yaml", "-o", str(tmp_path / "none.yaml")]) == 2
    assert "nothing to fail" in capsys.readouterr().err
