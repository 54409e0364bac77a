"""RoCEv2 packets: scapy's `scapy.contrib.roce` (BTH, AETH, CNP, ICRC) plus the headers it lacks.

RETH (RDMA WRITE first/only, READ request), DETH (UD sends) and ImmDt (immediate data) are added in the
same style as scapy's own layers and bound to the opcodes that carry them (IBTA spec vol. 1, ch. 9.2-9.3),
so `Ether(raw_bytes)` dissects our frames completely.  Builders here make whole messages the way an RC
queue pair puts them on the wire: segmented at the path MTU into FIRST/MIDDLE/LAST (or ONLY), consecutive
PSNs, the BTH P_Key of the sender's partition, DSCP/ECN in the IP header and the UDP source port as the
flow's entropy.  Scapy crafts them (and computes the ICRC); the hot loop lives in `traffic.fastpath`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from scapy.contrib.roce import AETH, BTH, CNPPadding, opcode
from scapy.fields import BitField, IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

ROCE_UDP_PORT = 4791
DEFAULT_PKEY = 0xFFFF
DEFAULT_QKEY = 0x11111111


def op(transport: str, name: str) -> int:
    return int(opcode(transport, name)[0])


class RETH(Packet):
    """RDMA Extended Transport Header: where the data goes (virtual address, remote key, length)."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dmalen", 0)]  # noqa: RUF012 - scapy API

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        # Only WRITE_ONLY_WITH_IMMEDIATE has immediate data after the RETH; a conditional bind_layers on
        # RETH cannot see the BTH opcode, so look at the underlayer.
        if _opcode_below(self) in _RETH_THEN_IMM:
            return ImmDt
        return Raw


class DETH(Packet):
    """Datagram Extended Transport Header: UD's queue key and source queue pair."""

    name = "DETH"
    fields_desc = [  # noqa: RUF012 - scapy API
        XIntField("qkey", DEFAULT_QKEY),
        BitField("resv8", 0, 8),
        BitField("srcqp", 0, 24),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if _opcode_below(self) == op("UD", "SEND_ONLY_WITH_IMMEDIATE"):
            return ImmDt
        return Raw


class ImmDt(Packet):
    """Immediate data: 32 bits delivered to the receiver's completion (e.g. "layer 17 arrived")."""

    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]  # noqa: RUF012 - scapy API


_RETH_THEN_IMM = {op("RC", "RDMA_WRITE_ONLY_WITH_IMMEDIATE"), op("UC", "RDMA_WRITE_ONLY_WITH_IMMEDIATE")}


def _opcode_below(layer: Packet) -> int | None:
    under = layer.underlayer
    while under is not None and not isinstance(under, BTH):
        under = under.underlayer
    return int(under.opcode) if under is not None else None


for _transport in ("RC", "UC"):
    for _name in ("RDMA_WRITE_FIRST", "RDMA_WRITE_ONLY", "RDMA_WRITE_ONLY_WITH_IMMEDIATE"):
        bind_layers(BTH, RETH, opcode=op(_transport, _name))
    for _name in ("SEND_LAST_WITH_IMMEDIATE", "SEND_ONLY_WITH_IMMEDIATE", "RDMA_WRITE_LAST_WITH_IMMEDIATE"):
        bind_layers(BTH, ImmDt, opcode=op(_transport, _name))
bind_layers(BTH, RETH, opcode=op("RC", "RDMA_READ_REQUEST"))
for _name in ("RDMA_READ_RESPONSE_FIRST", "RDMA_READ_RESPONSE_LAST", "RDMA_READ_RESPONSE_ONLY"):
    bind_layers(BTH, AETH, opcode=op("RC", _name))
bind_layers(BTH, DETH, opcode=op("UD", "SEND_ONLY"))
bind_layers(BTH, DETH, opcode=op("UD", "SEND_ONLY_WITH_IMMEDIATE"))


@dataclass(frozen=True)
class Endpoints:
    """Who talks to whom: addresses, the destination QP, partition and traffic class of the flow."""

    src_mac: str
    dst_mac: str
    src_ip: str
    dst_ip: str
    dqpn: int
    sport: int = 0xC000
    pkey: int = DEFAULT_PKEY
    dscp: int = 26
    ecn: int = 0b10  # ECT(0): RoCE traffic is ECN-capable so switches can mark instead of drop


def frame(ep: Endpoints, bth: BTH, *layers: Packet, payload: bytes = b"") -> Packet:
    """Ether / IPv4 (DSCP, ECN, DF) / UDP 4791 / BTH / headers / payload / ICRC."""
    pkt = (
        Ether(src=ep.src_mac, dst=ep.dst_mac)
        / IP(src=ep.src_ip, dst=ep.dst_ip, tos=(ep.dscp << 2) | ep.ecn, flags="DF", ttl=64, id=0)
        / UDP(sport=ep.sport, dport=ROCE_UDP_PORT, chksum=0)
        / bth
    )
    for layer in layers:
        pkt = pkt / layer
    if payload:
        pkt = pkt / Raw(payload)
    return pkt


def _pad(payload: bytes) -> tuple[bytes, int]:
    """BTH payloads are 4-byte aligned; padcount says how many pad bytes the receiver drops."""
    pad = (-len(payload)) % 4
    return payload + bytes(pad), pad


def _segments(data: bytes, mtu: int) -> Iterator[tuple[int, bytes, bool, bool]]:
    chunks = [data[i : i + mtu] for i in range(0, len(data), mtu)] or [b""]
    for i, chunk in enumerate(chunks):
        yield i, chunk, i == 0, i == len(chunks) - 1


def rdma_write(
    ep: Endpoints, data: bytes, psn: int, va: int = 0x1000, rkey: int = 0x1234, mtu: int = 1024,
    imm: int | None = None, ackreq_last: bool = True,
) -> list[Packet]:  # fmt: skip
    """An RC RDMA WRITE message: ONLY, or FIRST (with RETH) / MIDDLE... / LAST; `imm` adds immediate data
    to the last packet (WRITE_..._WITH_IMMEDIATE)."""
    packets = []
    for i, chunk, first, last in _segments(data, mtu):
        body, pad = _pad(chunk)
        extra: list[Packet] = []
        if first and last:
            name = "RDMA_WRITE_ONLY" if imm is None else "RDMA_WRITE_ONLY_WITH_IMMEDIATE"
        elif first:
            name = "RDMA_WRITE_FIRST"
        elif last:
            name = "RDMA_WRITE_LAST" if imm is None else "RDMA_WRITE_LAST_WITH_IMMEDIATE"
        else:
            name = "RDMA_WRITE_MIDDLE"
        if first:
            extra.append(RETH(va=va, rkey=rkey, dmalen=len(data)))
        if last and imm is not None:
            extra.append(ImmDt(imm=imm))
        bth = BTH(opcode=op("RC", name), padcount=pad, pkey=ep.pkey, dqpn=ep.dqpn, psn=(psn + i) & 0xFFFFFF,
                  ackreq=int(last and ackreq_last))  # fmt: skip
        packets.append(frame(ep, bth, *extra, payload=body))
    return packets


def rc_send(ep: Endpoints, data: bytes, psn: int, mtu: int = 1024, imm: int | None = None) -> list[Packet]:
    """An RC SEND message: ONLY or FIRST / MIDDLE... / LAST (with immediate on the last if given)."""
    packets = []
    for i, chunk, first, last in _segments(data, mtu):
        body, pad = _pad(chunk)
        if first and last:
            name = "SEND_ONLY" if imm is None else "SEND_ONLY_WITH_IMMEDIATE"
        else:
            name = "SEND_FIRST" if first else ("SEND_MIDDLE" if not last else "SEND_LAST")
            if last and imm is not None:
                name = "SEND_LAST_WITH_IMMEDIATE"
        extra = [ImmDt(imm=imm)] if last and imm is not None else []
        bth = BTH(opcode=op("RC", name), padcount=pad, pkey=ep.pkey, dqpn=ep.dqpn, psn=(psn + i) & 0xFFFFFF,
                  ackreq=int(last))  # fmt: skip
        packets.append(frame(ep, bth, *extra, payload=body))
    return packets


def read_request(ep: Endpoints, length: int, psn: int, va: int = 0x1000, rkey: int = 0x1234) -> Packet:
    bth = BTH(opcode=op("RC", "RDMA_READ_REQUEST"), pkey=ep.pkey, dqpn=ep.dqpn, psn=psn, ackreq=1)
    return frame(ep, bth, RETH(va=va, rkey=rkey, dmalen=length))


def read_response(ep: Endpoints, data: bytes, psn: int, msn: int = 1, mtu: int = 1024) -> list[Packet]:
    """READ response: ONLY, or FIRST/MIDDLE/LAST; AETH on FIRST, LAST and ONLY (not MIDDLE)."""
    packets = []
    for i, chunk, first, last in _segments(data, mtu):
        body, pad = _pad(chunk)
        if first and last:
            name = "RDMA_READ_RESPONSE_ONLY"
        else:
            name = "RDMA_READ_RESPONSE_FIRST" if first else (
                "RDMA_READ_RESPONSE_LAST" if last else "RDMA_READ_RESPONSE_MIDDLE")  # fmt: skip
        extra = [AETH(syndrome=0, msn=msn)] if first or last else []
        bth = BTH(opcode=op("RC", name), padcount=pad, pkey=ep.pkey, dqpn=ep.dqpn, psn=(psn + i) & 0xFFFFFF)
        packets.append(frame(ep, bth, *extra, payload=body))
    return packets


def ack(ep: Endpoints, psn: int, msn: int = 1, syndrome: int = 0) -> Packet:
    """RC ACK (syndrome 0 = ACK with credit count 0; 0x60.. = NAK)."""
    bth = BTH(opcode=op("RC", "ACKNOWLEDGE"), pkey=ep.pkey, dqpn=ep.dqpn, psn=psn)
    return frame(ep, bth, AETH(syndrome=syndrome, msn=msn))


def cnp(ep: Endpoints) -> Packet:
    """Congestion Notification Packet (DCQCN): from the notification point back to the sender's QP."""
    bth = BTH(opcode=0x81, becn=1, pkey=ep.pkey, dqpn=ep.dqpn, psn=0)
    return frame(ep, bth, CNPPadding())


def ud_send(ep: Endpoints, data: bytes, psn: int, src_qp: int = 1, imm: int | None = None) -> Packet:
    body, pad = _pad(data)
    name = "SEND_ONLY" if imm is None else "SEND_ONLY_WITH_IMMEDIATE"
    bth = BTH(opcode=op("UD", name), padcount=pad, pkey=ep.pkey, dqpn=ep.dqpn, psn=psn)
    extra: list[Packet] = [DETH(srcqp=src_qp)]
    if imm is not None:
        extra.append(ImmDt(imm=imm))
    return frame(ep, bth, *extra, payload=body)


__all__ = [
    "DETH",
    "RETH",
    "ROCE_UDP_PORT",
    "Endpoints",
    "ImmDt",
    "ack",
    "cnp",
    "frame",
    "op",
    "rc_send",
    "rdma_write",
    "read_request",
    "read_response",
    "ud_send",
]
