"""fabriclab against the real OpenSM: same LIDs, same file formats, same routing quality.

The reference (tests/data/opensm-ft3-k4) was produced by OpenSM 3.3.23 with its ftree engine on ibsim.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from controller.sm.engines import default_registry
from controller.sm.opensm import DumpError, format_lfts, format_subnet_lst, parse_lfts, tables_from_lfts
from controller.sm.quality import quality
from controller.sm.subnet import Subnet
from controller.sm.verify import verify
from topologies.ibnet import load_ibnet
from topologies.model import Fabric

ENTRY = re.compile(r"^0x[0-9a-f]{4} \d{3} # (Channel Adapter|Switch) portguid 0x[0-9a-f]{16}: '[^']*'$")


@pytest.fixture(scope="module")
def fabric(reference_dir: Path) -> Fabric:
    return load_ibnet(reference_dir / "fabric.net")


@pytest.fixture(scope="module")
def opensm_dump(reference_dir: Path) -> str:
    return (reference_dir / "opensm-lfts.dump").read_text()


def test_lids_match_opensm(fabric: Fabric, opensm_dump: str) -> None:
    subnet = Subnet.build(fabric)
    theirs: dict[int, int] = {}
    for line in opensm_dump.splitlines():
        if match := re.match(r"^0x([0-9a-f]{4}) \d{3} # .* portguid 0x([0-9a-f]{16}):", line):
            theirs[int(match.group(1), 16)] = int(match.group(2), 16)
    ours = {lid: endpoint.guid for lid, endpoint in subnet.lids.endpoints.items()}
    assert ours == theirs


def test_subnet_lst_is_byte_identical(fabric: Fabric, reference_dir: Path) -> None:
    # ibsim's simulated nodes report NodeInfo revision 0xA1; the fabric.net format cannot carry it
    nodes = {name: replace(node, revision=0xA1) for name, node in fabric.nodes.items()}
    subnet = Subnet.build(replace(fabric, nodes=nodes))
    assert format_subnet_lst(subnet) == (reference_dir / "opensm-subnet.lst").read_text()


def test_lft_dump_has_opensm_line_formats(fabric: Fabric, opensm_dump: str) -> None:
    ours = format_lfts(default_registry().create("ftree").route(Subnet.build(fabric)))
    headers = [line for line in ours.splitlines() if line.startswith("Unicast")]
    assert headers == [line for line in opensm_dump.splitlines() if line.startswith("Unicast")]
    for line in ours.splitlines():
        assert line.startswith("Unicast") or line == "36 lids dumped" or ENTRY.match(line), line
    # wherever OpenSM has an entry, ours has the same line apart from the port number
    theirs = {(t[0], lid) for t in parse_lfts(opensm_dump) for lid in t[2]}
    mine = {(t[0], lid) for t in parse_lfts(ours) for lid in t[2]}
    assert theirs <= mine
    assert len(mine) == 20 * 36  # we also route every switch LID


def test_opensm_tables_through_our_verifier_match_its_published_figures(
    fabric: Fabric, opensm_dump: str
) -> None:
    """README of the reference: all host pairs reachable, shift <= 1 flow per link, max/mean 1.08."""
    tables = tables_from_lfts(Subnet.build(fabric), opensm_dump)
    result = verify(tables)
    assert result.unreachable_pairs == 0
    assert result.dead_entries == 76  # OpenSM's ftree leaves some switch LIDs unrouted
    figures = quality(tables)
    assert figures.shift is not None and figures.shift.worst_max_flows == 1
    assert round(figures.switch_links.max_over_mean, 2) == 1.08


def test_our_ftree_matches_opensm_quality_and_routes_everything(fabric: Fabric, opensm_dump: str) -> None:
    subnet = Subnet.build(fabric)
    ours = default_registry().create("ftree").route(subnet)
    result = verify(ours)
    assert result.ok and result.dead_entries == 0
    mine, theirs = quality(ours), quality(tables_from_lfts(subnet, opensm_dump))
    assert mine.shift is not None and mine.shift.worst_max_flows == 1
    assert mine.switch_links.max_over_mean == pytest.approx(theirs.switch_links.max_over_mean)
    for a, b in zip(mine.all_to_all, theirs.all_to_all, strict=True):
        assert (a.tier, a.max, a.mean) == (b.tier, b.max, b.mean)


def test_dump_round_trips_through_the_parser(fabric: Fabric) -> None:
    subnet = Subnet.build(fabric)
    tables = default_registry().create("sssp").route(subnet)
    again = tables_from_lfts(subnet, format_lfts(tables))
    assert (again.lft == tables.lft).all()


def test_foreign_dumps_are_rejected(fabric: Fabric, opensm_dump: str) -> None:
    subnet = Subnet.build(fabric)
    with pytest.raises(DumpError, match=r"line 2: not an opensm-lfts\.dump line"):
        tables_from_lfts(subnet, opensm_dump.replace("0x0001 001", "garbage", 1))
    with pytest.raises(DumpError, match="not in the fabric"):
        tables_from_lfts(subnet, opensm_dump.replace("guid 0x0002c90000000002", "guid 0x0002c9ffff000002"))
