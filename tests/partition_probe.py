"""Raw-socket probes for the partition tests, run inside a Mininet host's namespace.

    python -m tests.partition_probe sniff IFACE --duration S
        prints "ready", then after S seconds (or a line on stdin) one JSON line: every frame received,
        by source MAC and kind (arp, icmp, udp, roce, lldp, other), and the sequence numbers of the UDP
        stream (port 9999) per source MAC
    python -m tests.partition_probe send IFACE --kind udp|icmp|roce|arp --src-mac M --src-ip A
                                               --dst-mac M --dst-ip A [--count N] [--rate PPS] [--pkey 0x8001]
        sends frames as given (any source address: forging is the point); for arp, a who-has for --dst-ip,
        then prints whether the controller answered within a second

Frames are built with scapy (RoCEv2 with the BTH P_Key given) and sent on an AF_PACKET socket; the sniffer
reads an AF_PACKET socket too, so it sees exactly what the switch delivered to the host's port.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time
from typing import Any

ETH_P_ALL = 0x0003
STREAM_PORT = 9999
ROCE_PORT = 4791


def _kind(frame: bytes) -> str:
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == 0x0806:
        return "arp"
    if ethertype == 0x88CC:
        return "lldp"  # the controller's link probes, sent by the switch itself
    if ethertype != 0x0800 or len(frame) < 34:
        return "other"
    proto = frame[23]
    if proto == 1:
        return "icmp"
    if proto == 17:
        ihl = (frame[14] & 0x0F) * 4
        dport = struct.unpack_from("!H", frame, 14 + ihl + 2)[0]
        return "roce" if dport == ROCE_PORT else "udp"
    return "other"


def sniff(iface: str, duration_s: float) -> dict[str, Any]:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((iface, 0))
    sock.settimeout(0.2)
    print("ready", flush=True)
    counts: dict[str, dict[str, int]] = {}
    seqs: dict[str, list[int]] = {}
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        if select.select([sys.stdin], [], [], 0)[0]:
            break  # told to stop
        try:
            frame, address = sock.recvfrom(65535)
        except TimeoutError:
            continue
        if address[2] == socket.PACKET_OUTGOING:
            continue
        src = ":".join(f"{b:02x}" for b in frame[6:12])
        kind = _kind(frame)
        per = counts.setdefault(src, {})
        per[kind] = per.get(kind, 0) + 1
        if kind == "udp":
            ihl = (frame[14] & 0x0F) * 4
            if struct.unpack_from("!H", frame, 14 + ihl + 2)[0] == STREAM_PORT:
                seqs.setdefault(src, []).append(struct.unpack_from("!I", frame, 14 + ihl + 8)[0])
    return {"frames": counts, "stream": {k: sorted(set(v)) for k, v in seqs.items()}}


def _frames(args: argparse.Namespace) -> list[bytes]:
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import ICMP, IP, UDP
    from scapy.layers.l2 import ARP, Ether

    from traffic.roce import RETH, op

    ether = Ether(src=args.src_mac, dst=args.dst_mac)
    out = []
    for i in range(args.count):
        if args.kind == "udp":
            pkt = ether / IP(src=args.src_ip, dst=args.dst_ip) / UDP(sport=40000, dport=STREAM_PORT)
            pkt = pkt / struct.pack("!I", i) / (b"\0" * 60)
        elif args.kind == "icmp":
            pkt = ether / IP(src=args.src_ip, dst=args.dst_ip) / ICMP(id=7, seq=i) / (b"p" * 56)
        elif args.kind == "roce":
            bth = BTH(opcode=op("RC", "RDMA_WRITE_ONLY"), pkey=args.pkey, dqpn=17, psn=i)
            pkt = (ether / IP(src=args.src_ip, dst=args.dst_ip) / UDP(sport=49152, dport=ROCE_PORT) / bth
                   / RETH(va=0, rkey=1, dmalen=64) / (b"r" * 64))  # fmt: skip
        else:
            pkt = Ether(src=args.src_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(
                op=1, hwsrc=args.src_mac, psrc=args.src_ip, pdst=args.dst_ip
            )
        out.append(bytes(pkt))
    return out


def send(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((args.iface, 0))
    sock.settimeout(0.1)
    frames = _frames(args)
    gap = 1.0 / args.rate if args.rate > 0 else 0.0
    start = time.monotonic()
    for i, frame in enumerate(frames):
        if gap:
            delay = start + i * gap - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        sock.send(frame)
    result: dict[str, Any] = {"sent": len(frames)}
    if args.kind == "arp":
        answered = False
        end = time.monotonic() + 1.0
        while time.monotonic() < end and not answered:
            try:
                frame = sock.recv(65535)
            except TimeoutError:
                continue
            if (
                struct.unpack_from("!H", frame, 12)[0] == 0x0806
                and struct.unpack_from("!H", frame, 20)[0] == 2
            ):
                answered = socket.inet_ntoa(frame[28:32]) == args.dst_ip
        result["answered"] = answered
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.partition_probe")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sniff")
    s.add_argument("iface")
    s.add_argument("--duration", type=float, required=True)
    t = sub.add_parser("send")
    t.add_argument("iface")
    t.add_argument("--kind", required=True, help="udp, icmp, roce or arp; several comma-separated")
    for name in ("--src-mac", "--src-ip", "--dst-mac", "--dst-ip"):
        t.add_argument(name, required=True)
    t.add_argument("--count", type=int, default=5)
    t.add_argument("--rate", type=float, default=0.0)
    t.add_argument("--pkey", type=lambda v: int(v, 0), default=0xFFFF)
    args = parser.parse_args(argv)
    if args.command == "sniff":
        print(json.dumps(sniff(args.iface, args.duration)), flush=True)
        return 0
    results = {}
    for kind in args.kind.split(","):
        results[kind] = send(argparse.Namespace(**{**vars(args), "kind": kind}))
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
