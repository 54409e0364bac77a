"""Lanes in files: `route --dump-dir` with dfsssp writes OpenSM's SL-to-VL dump and the path SLs, and
`fabriclab check-lanes` proves every lane deadlock-free from the files alone — and fails when a lane
assignment is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.sm.engines import default_registry
from controller.sm.lanedump import check_lanes, format_path_sl, parse_path_sl
from controller.sm.opensm import format_lfts, format_subnet_lst
from controller.sm.subnet import Subnet
from fabriclab.cli import main
from topologies.direct import torus
from topologies.generators import fat_tree
from topologies.loader import dump_yaml


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("lanes")
    (work / "t.yaml").write_text(dump_yaml(torus(6, 6, 2)))
    assert main(["route", str(work / "t.yaml"), "--engine", "dfsssp", "--dump-dir", str(work / "d")]) == 0
    return work / "d"


def test_dfsssp_dumps_its_lanes_and_the_checker_finds_every_lane_acyclic(
    dumped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["check-lanes", str(dumped)]) == 0
    out = capsys.readouterr().out
    lanes = re.findall(r"^lane (\d+) +(\d+) dependencies, acyclic$", out, re.M)
    assert len(lanes) >= 2  # a 6x6 torus needs more than one lane
    # every (ingress switch, host LID) but the switch's own 2 hosts: 36 x 70
    assert "routes        2520 walked through the dumps; every lane acyclic" in out


def test_the_sl2vl_dump_is_opensms_format(dumped: Path) -> None:
    text = (dumped / "opensm-sl2vl.dump").read_text()
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert len(blocks) == 36 + 72  # every switch and every CA port
    first = next(b for b in blocks if b.startswith("Switch")).splitlines()
    assert re.match(r'^Switch 0x[0-9a-f]{16}, base LID \d+, ".*"$', first[0])
    assert first[1] == "#in out : 0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15"
    assert first[3] == "0   1   : 0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15"  # SL i -> VL i
    ca = next(b for b in blocks if b.startswith("Channel Adapter")).splitlines()
    assert ca[3] == "0   0   : 0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15"


def test_a_wrong_lane_assignment_is_caught_from_the_files(dumped: Path) -> None:
    """All routes on lane 0 (what the tables would be without dfsssp's layers): cyclic, with a cycle."""
    texts = [
        (dumped / n).read_text() for n in ("opensm-subnet.lst", "opensm-lfts.dump", "opensm-path-sl.dump")
    ]
    flat = re.sub(r"^(0x[0-9a-f]+) \d+$", r"\1 0", texts[2], flags=re.M)
    result = check_lanes(texts[0], texts[1], flat)
    assert not result.acyclic and list(result.cycles) == [0] and len(result.cycles[0]) >= 3
    assert check_lanes(*texts).acyclic


def test_a_fat_tree_has_one_lane_and_a_broken_table_is_a_problem_not_a_pass() -> None:
    tables = default_registry().create("dfsssp").route(Subnet.build(fat_tree(4)))
    subnet_lst, lfts, paths = format_subnet_lst(tables.subnet), format_lfts(tables), format_path_sl(tables)
    result = check_lanes(subnet_lst, lfts, paths)
    assert result.acyclic and list(result.dependencies) == [0] and result.routes == 8 * (16 - 2)
    assert set(sl for by_lid in parse_path_sl(paths).values() for sl in by_lid.values()) == {0}
    # one switch forgets a destination: reported, never "acyclic"
    broken = re.sub(r"^(0x0001) \d+( #.*)?$\n", "", lfts, count=1, flags=re.M)
    result = check_lanes(subnet_lst, broken, paths)
    assert not result.acyclic and "has no entry for LID 0x0001" in result.problems[0]


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-lanes", str(tmp_path)]) == 2
    assert "no opensm-subnet.lst" in capsys.readouterr().err
    for name in ("opensm-subnet.lst", "opensm-lfts.dump"):
        (tmp_path / name).write_text("")
    (tmp_path / "opensm-path-sl.dump").write_text("Switch 0x1\n0x0001 16\n")
    assert main(["check-lanes", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "line 2: SL 16 (at most 15)" in err and err.count("\n") == 1
