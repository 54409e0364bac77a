"""RoCEv2 frames: golden bytes per opcode, ICRC checked two independent ways (scapy's builder vs our
masked-image CRC), dissection round trips, the fast template against scapy for any PSN/port, and tshark
decoding every frame as InfiniBand/RoCE without malformed warnings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether
from scapy.packet import Packet
from scapy.utils import wrpcap

from tests.emulation_support import require_emulation
from traffic.fastpath import FrameTemplate, icrc_ok
from traffic.roce import (
    DETH,
    RETH,
    Endpoints,
    ImmDt,
    ack,
    cnp,
    rc_send,
    rdma_write,
    read_request,
    read_response,
    ud_send,
)

EP = Endpoints(
    "02:fa:b1:00:00:01", "02:fa:b1:00:00:10", "10.0.0.1", "10.0.0.16", dqpn=0x12, sport=0xC001, pkey=0x8001
)
HEAD = "02fab100001002fab10000010800456a"

GOLDEN: dict[str, tuple[Packet, str]] = {
    "write_only": (
        rdma_write(EP, b"\x01\x02\x03\x04\x05", psn=7)[0],
        HEAD + "0044000040004011262f0a0000010a000010c00112b7003000000a30800100000012800000070000000000001000"
        "000012340000000501020304050000008177da57",
    ),
    "write_only_imm": (
        rdma_write(EP, b"\xaa" * 8, psn=7, imm=0xDEADBEEF)[0],
        HEAD + "0048000040004011262b0a0000010a000010c00112b7003400000b008001000000128000000700000000000010"
        "000000123400000008deadbeefaaaaaaaaaaaaaaaa478cb66b",
    ),
    "send_only_imm": (
        rc_send(EP, b"\xbb" * 4, psn=9, imm=3)[0],
        HEAD + "0034000040004011263f0a0000010a000010c00112b70020000005008001000000128000000900000003bbbbbbbb"
        "53d5f53c",
    ),
    "read_request": (
        read_request(EP, 4096, psn=11, va=0x2000, rkey=0x55),
        HEAD + "003c00004000401126370a0000010a000010c00112b7002800000c008001000000128000000b00000000000020"
        "000000005500001000e4809704",
    ),
    "read_response_only": (
        read_response(EP, b"\xcc" * 4, psn=11, msn=2)[0],
        HEAD + "0034000040004011263f0a0000010a000010c00112b70020000010008001000000120000000b00000002cccccccc"
        "e12da18d",
    ),
    "ack": (
        ack(EP, psn=12, msn=2),
        HEAD + "003000004000401126430a0000010a000010c00112b7001c000011008001000000120000000c000000025772d152",
    ),
    "cnp": (
        cnp(EP),
        HEAD + "003c00004000401126370a0000010a000010c00112b70028000081008001400000120000000000000000000000"
        "000000000000000000e9eab3ff",
    ),
    "ud_send_imm": (
        ud_send(EP, b"\xdd" * 4, psn=1, src_qp=5, imm=6),
        HEAD + "003c00004000401126370a0000010a000010c00112b700280000650080010000001200000001111111110000000"
        "500000006dddddddda0944a80",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_bytes_and_icrc(name: str) -> None:
    packet, golden = GOLDEN[name]
    data = raw(packet)
    assert data.hex() == golden
    assert icrc_ok(data)  # our masked-image CRC agrees with scapy's ICRC
    assert not icrc_ok(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])  # one flipped payload bit fails


def test_dissection_finds_every_extension_header() -> None:
    first, *_, last = rdma_write(EP, bytes(3000), psn=0xFFFFFE, imm=9)
    assert Ether(raw(first)).haslayer(RETH) and Ether(raw(first))[RETH].dmalen == 3000
    assert Ether(raw(last))[ImmDt].imm == 9 and not Ether(raw(last)).haslayer(RETH)
    assert [Ether(raw(p))[BTH].psn for p in rdma_write(EP, bytes(3000), psn=0xFFFFFE)] == [
        0xFFFFFE,
        0xFFFFFF,
        0,
    ]
    assert Ether(raw(ud_send(EP, b"", psn=1, src_qp=77)))[DETH].srcqp == 77
    assert Ether(raw(read_request(EP, 64, psn=1)))[RETH].dmalen == 64
    assert Ether(raw(rc_send(EP, b"x", psn=1)[0]))[BTH].padcount == 3
    assert Ether(raw(rc_send(EP, b"x", psn=1)[0]))[BTH].pkey == 0x8001


@pytest.mark.parametrize(("psn", "sport"), [(0, None), (1, 0xC000), (0xABCDEF, 0xFFFF), (0xFFFFFF, 1)])
def test_fast_template_matches_scapy_for_any_psn_and_source_port(psn: int, sport: int | None) -> None:
    template = FrameTemplate.from_packet(rdma_write(EP, bytes(1024), psn=0)[0])
    fast = template.render(psn, sport)
    reference = Ether(fast)
    reference[BTH].icrc = None  # let scapy recompute the ICRC for these fields
    assert raw(reference) == fast
    assert reference[BTH].psn == psn


def test_tshark_decodes_every_opcode_without_malformed_frames(tmp_path: Path) -> None:
    if shutil.which("tshark") is None:
        require_emulation("tshark not installed (Debian: tshark; .ci/run installs it)")
    packets = [p for p, _ in GOLDEN.values()]
    packets += rdma_write(EP, bytes(3000), psn=100) + rc_send(EP, bytes(2500), psn=200)
    packets += read_response(EP, bytes(2500), psn=300)
    pcap = tmp_path / "roce.pcap"
    wrpcap(str(pcap), packets)
    summary = subprocess.run(["tshark", "-r", str(pcap)], capture_output=True, text=True, check=True).stdout
    detail = subprocess.run(
        ["tshark", "-r", str(pcap), "-V"], capture_output=True, text=True, check=True
    ).stdout
    assert summary.count("RRoCE") == len(packets)
    assert "malformed" not in detail.lower() and "Expert Info (Error" not in detail
    names = ["RDMA Write Only Immediate", "Send Only Immediate", "RDMA Read Request", "Read Response Only",
             "Acknowledge", "UD Send Only Immediate", "RDMA Write First", "RDMA Write Middle",
             "RDMA Write Last", "Send First", "Read Response Last"]  # fmt: skip
    for name in names:
        assert name in summary, name
    assert "Partition Key: 32769" in detail and "Remote Key: 0x00001234" in detail
    assert "Immediate Data: deadbeef" in detail
