"""RoCEv2 sender/receiver agents for emulated hosts (`python -m traffic.agent ...`), reporting JSON.

    agent send IFACE --src-mac M --dst-mac M --src-ip A --dst-ip A --qp N [--count N] [--rate PPS]
               [--size BYTES] [--opcode write|send] [--spray N] [--pkey 0xffff] [--dscp 26]
    agent recv IFACE --duration S [--expect N] [--no-icrc]

The sender builds one frame with scapy (RDMA WRITE MIDDLE or SEND MIDDLE of `size` payload bytes: what the
bulk of a long message looks like on the wire) and streams it through `fastpath`, new PSN and ICRC on every
packet.  The receiver prints per-QP received/lost/out-of-order/bad-ICRC counts and goodput.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from scapy.contrib.roce import BTH

from traffic.entropy import flow_sport, spray_sport
from traffic.fastpath import FrameTemplate, Receiver, raw_socket, send_stream
from traffic.roce import DEFAULT_PKEY, Endpoints, frame, op


def build_template(args: argparse.Namespace) -> FrameTemplate:
    ep = Endpoints(args.src_mac, args.dst_mac, args.src_ip, args.dst_ip, dqpn=args.qp, pkey=args.pkey,
                   dscp=args.dscp)  # fmt: skip
    name = "RDMA_WRITE_MIDDLE" if args.opcode == "write" else "SEND_MIDDLE"
    bth = BTH(opcode=op("RC", name), pkey=ep.pkey, dqpn=ep.dqpn, psn=0)
    return FrameTemplate.from_packet(frame(ep, bth, payload=bytes(args.size)))


def send_many(args: argparse.Namespace) -> dict[str, Any]:
    """Round-robin over the streams, one packet each per turn, PSNs from 0 per QP: every destination
    sees its stream in order while all of them progress together (as a collective step does)."""
    with open(args.streams) as handle:
        streams = json.load(handle)
    templates = []
    for s in streams:
        # the QP's own source port, as Linux derives it from the QP numbers (both ends use the same here)
        ep = Endpoints(args.src_mac, s["dst_mac"], args.src_ip, s["dst_ip"], dqpn=s["qp"],
                       sport=flow_sport(s["qp"], s["qp"]), pkey=int(s.get("pkey", DEFAULT_PKEY)),
                       dscp=int(s.get("dscp", 26)))  # fmt: skip
        bth = BTH(opcode=op("RC", "RDMA_WRITE_MIDDLE"), pkey=ep.pkey, dqpn=ep.dqpn, psn=0)
        templates.append(
            (FrameTemplate.from_packet(frame(ep, bth, payload=bytes(args.size))), int(s["packets"]))
        )
    sock = raw_socket(args.iface)
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    start = time.perf_counter()
    sent = 0
    wall0 = time.time()
    for psn in range(max((n for _, n in templates), default=0)):
        for offset, (template, count) in enumerate(templates):
            if psn < count:
                if interval and sent % 8 == 0:
                    ahead = start + sent * interval - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                sock.send(template.render(psn, spray_sport(psn, offset) if args.spray else None))
                sent += 1
    return {"sent": sent, "start": wall0, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="traffic.agent")
    sub = parser.add_subparsers(dest="role", required=True)
    send = sub.add_parser("send")
    send.add_argument("iface")
    for name in ("--src-mac", "--dst-mac", "--src-ip", "--dst-ip"):
        send.add_argument(name, required=True)
    send.add_argument("--qp", type=int, required=True)
    send.add_argument("--count", type=int, default=100_000)
    send.add_argument("--rate", type=float, default=0.0, help="packets/s (0: as fast as possible)")
    send.add_argument("--size", type=int, default=1024, help="payload bytes (a multiple of 4)")
    send.add_argument("--opcode", choices=["write", "send"], default="write")
    send.add_argument("--spray", type=int, default=0, help="cycle the UDP source port over N values")
    send.add_argument("--pkey", type=lambda s: int(s, 0), default=0xFFFF)
    send.add_argument("--dscp", type=int, default=26)
    send.add_argument("--psn", type=int, default=0)
    many = sub.add_parser("send-many", help="several streams (one per QP) interleaved, e.g. a rank's share")
    many.add_argument("iface")
    many.add_argument("--src-mac", required=True)
    many.add_argument("--src-ip", required=True)
    many.add_argument(
        "--streams", required=True, help="JSON file: [{dst_mac, dst_ip, qp, packets[, dscp]}, ...]"
    )
    many.add_argument("--rate", type=float, default=0.0, help="total packets/s (0: as fast as possible)")
    many.add_argument("--size", type=int, default=1024)
    many.add_argument(
        "--spray", action="store_true", help="another UDP source port for every packet (multipath NICs)"
    )
    recv = sub.add_parser("recv")
    recv.add_argument("iface")
    recv.add_argument("--duration", type=float, required=True)
    recv.add_argument("--expect", type=int, default=0, help="stop after this many frames")
    recv.add_argument("--no-icrc", action="store_true", help="do not verify ICRCs")
    args = parser.parse_args(argv)
    result: dict[str, Any]
    if args.role == "send-many":
        result = send_many(args)
    elif args.role == "send":
        if args.size % 4:
            parser.error("--size: must be a multiple of 4 (BTH payloads are 4-byte aligned)")
        template = build_template(args)
        sock = raw_socket(args.iface)
        result = send_stream(sock, template, args.count, args.rate, args.psn, args.spray)
    else:
        receiver = Receiver(raw_socket(args.iface), check_icrc=not args.no_icrc)
        print("ready", flush=True)
        start = time.perf_counter()
        result = receiver.run(args.duration, stop_after=args.expect)
        result["seconds"] = time.perf_counter() - start
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
