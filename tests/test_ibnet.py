"""ibnetdiscover / ibsim import and export: golden round trip of the reference, real dumps, bad lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DATA
from topologies.errors import TopologyError
from topologies.ibnet import dump_ibnet, load_ibnet, parse_ibnet


def test_reference_round_trip_is_byte_identical(reference_dir: Path) -> None:
    original = (reference_dir / "fabric.net").read_text()
    fabric = load_ibnet(reference_dir / "fabric.net")
    header = original.splitlines()[0].removeprefix("# ")
    assert dump_ibnet(fabric, header=header) == original
    again = parse_ibnet(dump_ibnet(fabric))
    assert again.nodes == fabric.nodes and again.links == fabric.links


def test_reference_guids_and_ports_are_preserved(reference_dir: Path) -> None:
    fabric = load_ibnet(reference_dir / "fabric.net")
    assert (len(fabric.switches), len(fabric.hosts), len(fabric.links)) == (20, 16, 48)
    h0 = fabric.nodes["h0_p0e0"]
    assert h0.guid == 0x0002C90000000000 and h0.port_guid(1) == 0x0002C90000000001
    assert fabric.nodes["core3"].guid == 0x0002C90013000002
    assert str(fabric.peer("agg_p1_1", 3)) == "core2:2"
    assert all(link.bw_gbps == 10.0 for link in fabric.links)  # ibsim: 4x SDR


def test_real_ibnetdiscover_output() -> None:
    fabric = load_ibnet(DATA / "ibnetdiscover-sample.txt")
    assert (len(fabric.switches), len(fabric.hosts), len(fabric.links)) == (2, 4, 6)
    leaf = fabric.nodes["S-248a0703005c1e60"]
    assert leaf.description == "MF0;leaf-01:MQM8700/U1"
    assert (leaf.ports, leaf.vendor_id, leaf.device_id) == (40, 0x2C9, 0xD2F0)
    host = fabric.nodes["H-0c42a10300b5d950"]
    assert host.description == "node01 HCA-1" and host.port_guid(1) == 0x0C42A10300B5D951
    speeds = {str(link): link.bw_gbps for link in fabric.links}
    assert speeds["S-248a0703005c1e60:39--S-248a0703005c2a10:39"] == 200.0  # 4xHDR, [ext 39] label ignored
    assert speeds["S-248a0703005c2a10:2--H-0c42a10300b5da80:1"] == 100.0  # 2xHDR


def test_explicit_port_guids_that_break_the_rule_are_kept() -> None:
    text = (
        'switchguid=0x10\nSwitch\t2 "sw"\n[1]\t"ca"[1](99)\n[2]\t"cb"[1]\n\n'
        'caguid=0x20\nCa\t1 "ca"\n[1](99)\t"sw"[1]\n\ncaguid=0x30\nCa\t1 "cb"\n[1]\t"sw"[2]\n'
    )
    fabric = parse_ibnet(text)
    assert fabric.nodes["ca"].port_guid(1) == 0x99
    assert fabric.nodes["cb"].port_guid(1) == 0x31
    assert parse_ibnet(dump_ibnet(fabric)).nodes["cb"] == fabric.nodes["cb"]


BASE = 'switchguid=0x10\nSwitch\t2 "sw"\n[1]\t"ca"[1]\n\ncaguid=0x20\nCa\t1 "ca"\n[1]\t"sw"[1]\n'


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (BASE.replace('Switch\t2 "sw"', 'Switch\tx "sw"'), 2, "not an ibnetdiscover line"),
        (BASE.replace('[1]\t"ca"[1]', '[1]\t"ca"'), 3, "not an ibnetdiscover line"),
        (BASE.replace('[1]\t"ca"[1]', '[1]\t"cx"[1]'), 3, "unknown peer node 'cx'"),
        (BASE.replace('[1]\t"ca"[1]', '[3]\t"ca"[1]'), 3, "port 3 is beyond the node's 2 ports"),
        (BASE + 'switchguid=0x40\nSwitch\t2 "sw"\n', 9, "declared twice (first at line 2)"),
        (BASE + 'rtguid=0x50\nRt\t2 "r"\n', 8, "routers are not supported"),
        (BASE.replace("switchguid=0x10\n", ""), 1, "without a preceding switchguid= line"),
        (BASE + 'caguid=0x60\nCa\t1 "cb"\n[1]\t"sw"[1]\n', 10, "already cabled to"),
        (
            BASE.replace('[1]\t"ca"[1]\n', '[1]\t"ca"[1]\n[2]\t"cb"[1]\n')
            + 'caguid=0x60\nCa\t1 "cb"\n[1]\t"sw"[1]\n',
            11,
            "disagrees: line 4 says sw[2]",
        ),
        (
            BASE.replace("caguid=0x20", "caguid=0x10"),
            6,
            "GUID 0x0000000000000010 of ca is already used by sw",
        ),
        (BASE + 'caguid=0x70\nCa\t1 "lonely"\n', 9, "host lonely has no link"),
    ],
)
def test_malformed_dumps_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_ibnet(text, "fabric.net")
    assert info.value.file == "fabric.net"
    assert info.value.line == line, str(info.value)
    assert message in str(info.value)
