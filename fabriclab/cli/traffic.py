"""`fabriclab traffic plan|pcap`: workload plans as people read them, and the frames they would send.

    fabriclab traffic plan allreduce --algo ring --ranks h1..h16 --size 256MiB
    fabriclab traffic plan kv-transfer --model llama3-70b --prompt-tokens 4096 --prefill h1,h2 --decode h9
    fabriclab traffic pcap kv-transfer --model llama3-70b --prompt-tokens 64 --prefill h1 --decode h2 \
        -o kv.pcap

Hosts get the addresses the subnet manager gives them in `--topology` (default: the shipped k=4 fat-tree),
so a pcap shows exactly the MACs, IPs and QPs an emulated run uses.  `--trace FILE` writes the plan as a
congestion trace (JSON Lines) for replay.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from controller.sm.manager import SubnetManager
from fabriclab.cli.common import SEED, CliError, integer, load_fabric, output_file
from traffic.errors import TrafficError, parse_hosts, parse_size
from traffic.kvcache import KvMessage, kv_transfer, model_shape, summary
from traffic.patterns import Plan, bus_factor, hotspot, incast, permutation, plan
from traffic.trace import from_kv, from_plan, write_trace

DEFAULT_TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "fat-tree-k4.yaml"
#: InfiniBand path MTUs (what a RoCE NIC negotiates); BTH packets carry at most this much payload.
ROCE_MTUS = (256, 512, 1024, 2048, 4096)
#: About 2 GB of pcap at a 1 KiB MTU: a bound on one command's output.
MAX_PCAP_FRAMES = 2_000_000
COLLECTIVES = {
    ("allreduce", "ring"): "allreduce-ring",
    ("allreduce", "hd"): "allreduce-hd",
    ("alltoall", "pairwise"): "alltoall",
    ("allgather", "ring"): "allgather",
    ("reduce-scatter", "ring"): "reduce-scatter",
    ("broadcast", "ring"): "broadcast",
}


def register(commands: Any) -> None:
    traffic = commands.add_parser(
        "traffic", help="plan workloads (collectives, KV-cache transfers), write pcaps"
    )
    sub = traffic.add_subparsers(dest="traffic_command", required=True, metavar="ACTION")
    for action, helptext in (
        ("plan", "show the steps and flows of a workload"),
        ("pcap", "write its frames"),
    ):
        p = sub.add_parser(action, help=helptext)
        workloads = ["allreduce", "alltoall", "allgather", "reduce-scatter", "broadcast", "kv-transfer",
                     "incast", "permutation", "hotspot"]  # fmt: skip
        p.add_argument("workload", choices=workloads)
        p.add_argument("--algo", default=None, help="ring (default), hd (halving-doubling; all-reduce only)")
        p.add_argument("--ranks", help="hosts, e.g. h1..h16 or h1,h3,h5")
        p.add_argument("--size", help="per-rank buffer, e.g. 256MiB (nccl-tests semantics)")
        p.add_argument("--model", help="preset (llama3-70b, ...) or with --layers/--kv-heads/--head-dim")
        for name in ("--layers", "--kv-heads", "--head-dim", "--dtype-bytes"):
            p.add_argument(name, type=int)
        p.add_argument("--prompt-tokens", type=int)
        p.add_argument("--prefill", help="prefill hosts, e.g. h1,h2")
        p.add_argument("--decode", help="decode host")
        p.add_argument("--page-tokens", type=int, default=16)
        p.add_argument("--requests", type=int, default=1)
        p.add_argument("--rate", type=float, default=0.0, help="request arrivals per second (Poisson)")
        p.add_argument("--layer-time-us", type=float, default=0.0)
        p.add_argument("--seed", type=SEED, default=0)
        p.add_argument("--to", help="(incast) the receiving host; (hotspot) the hot host")
        p.add_argument("--fraction", type=float, default=0.5, help="(hotspot) share of flows to the hot host")
        p.add_argument("--topology", type=Path, default=DEFAULT_TOPOLOGY)
        p.add_argument("--json", action="store_true", help="(plan) JSON instead of text")
        p.add_argument("--trace", type=Path, help="(plan) also write the workload as a congestion trace")
        p.add_argument("-o", "--output", type=Path, help="(pcap) output file")
        p.add_argument(
            "--mtu", type=int, choices=ROCE_MTUS, default=1024, help="(pcap) RoCE path MTU (default 1024)"
        )
        p.add_argument(
            "--pkey",
            type=integer(0x0001, 0xFFFF, base=0, show=lambda v: f"0x{v:04x}"),
            default=0xFFFF,
            help="(pcap) BTH partition key, 16 bits (default 0xffff)",
        )
        p.set_defaults(handler=run_plan if action == "plan" else run_pcap)


def _hosts_of(args: argparse.Namespace) -> list[str]:
    return [h.name for h in load_fabric(args.topology).hosts]


def _workload(args: argparse.Namespace) -> Plan | list[KvMessage]:
    known = _hosts_of(args)
    try:
        if args.workload == "kv-transfer":
            for name in ("prompt_tokens", "prefill", "decode"):
                if getattr(args, name) is None:
                    raise TrafficError(f"--{name.replace('_', '-')} is required for kv-transfer", field=name)
            shape = model_shape(args.model, args.layers, args.kv_heads, args.head_dim, args.dtype_bytes)
            prefill = parse_hosts(args.prefill, known, field="prefill")
            decode = parse_hosts(args.decode, known, field="decode")
            if len(decode) != 1:
                raise TrafficError("one decode host", field="decode")
            return kv_transfer(shape, args.prompt_tokens, prefill, decode[0], args.page_tokens, args.requests,
                               args.rate, args.layer_time_us, args.seed)  # fmt: skip
        if args.ranks is None or args.size is None:
            raise TrafficError("--ranks and --size are required for collectives", field="ranks")
        ranks = parse_hosts(args.ranks, known)
        size = parse_size(args.size)
        if args.workload in ("incast", "hotspot"):
            if args.to is None:
                raise TrafficError(f"--to is required for {args.workload}", field="to")
            target = parse_hosts(args.to, known, field="to")[0]
            if args.workload == "incast":
                return incast([r for r in ranks if r != target], target, size)
            return hotspot(ranks, target, size, args.fraction, args.seed)
        if args.workload == "permutation":
            return permutation(ranks, size, args.seed)
        algo = args.algo or ("pairwise" if args.workload == "alltoall" else "ring")
        kind = COLLECTIVES.get((args.workload, algo))
        if kind is None:
            raise TrafficError(f"no {algo!r} algorithm for {args.workload}", field="algo")
        return plan(kind, ranks, size)
    except TrafficError as exc:
        option = _OPTION_OF.get(exc.field or "", exc.field)
        if option is not None and not exc.file and f"--{option}" not in exc.message:
            raise CliError(f"--{option.replace('_', '-')}: {exc.message}") from None
        raise CliError(str(exc)) from None


#: TrafficError fields whose option has another name (the rest are the option with `-` for `_`).
_OPTION_OF = {
    "arrival_rate_per_s": "rate",
    "hot": "to",
    "receiver": "to",
    "hosts": "ranks",
    "size_bytes": "size",
}


def run_plan(args: argparse.Namespace) -> int:
    work = _workload(args)
    if isinstance(work, Plan):
        n = len(work.ranks)
        factor = bus_factor(work.kind, n) if work.kind in COLLECTIVES.values() else None
        info: dict[str, Any] = {
            "workload": work.kind,
            "ranks": n,
            "size_bytes": work.size_bytes,
            "steps": work.n_steps,
            "transfers": len(work.transfers),
            "total_bytes": work.total_bytes,
            "bus_factor": round(factor, 4) if factor is not None else "n/a (not a collective)",
        }
        records = from_plan(work)
    else:
        info = {"workload": "kv-transfer", **summary(work)}
        records = from_kv(work)
    if args.trace:
        with output_file(args.trace, "--trace") as tmp:
            try:
                write_trace(tmp, records)
            except TrafficError as exc:
                raise CliError(f"--trace: {exc.message}") from None
        info["trace"] = str(args.trace)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        print(f"{key:<22} {value}")
    if isinstance(work, Plan):
        for step in work.steps[:3]:
            shown = ", ".join(f"{t.src}->{t.dst} {t.size_bytes}B" for t in step[:6])
            more = f" ... (+{len(step) - 6})" if len(step) > 6 else ""
            print(f"step {step[0].step:<3} {shown}{more}")
        if work.n_steps > 3:
            print(f"... {work.n_steps - 3} more steps")
    else:
        for m in work[:5]:
            print(f"t={m.time_us:9.1f}us req {m.request} layer {m.layer:3} page {m.page:3} "
                  f"{m.src}->{m.dst} {m.size_bytes}B")  # fmt: skip
    return 0


def run_pcap(args: argparse.Namespace) -> int:
    if args.output is None:
        raise CliError("-o/--output: where to write the pcap")
    from scapy.utils import PcapWriter  # noqa: PLC0415 - scapy only for this command

    work = _workload(args)
    addresses = SubnetManager(load_fabric(args.topology)).addresses
    # QPs 0 and 1 are InfiniBand's management QPs (SMI/GSI): data QPs start at 0x100.
    records = from_kv(work, qp_base=0x100) if not isinstance(work, Plan) else from_plan(work, qp_base=0x100)
    frames = sum(max(1, -(-r.size_bytes // args.mtu)) for r in records)
    if frames > MAX_PCAP_FRAMES:
        raise CliError(
            f"-o/--output: {frames:,} frames at MTU {args.mtu}, more than one pcap may have "
            f"({MAX_PCAP_FRAMES:,}); use a smaller workload or a larger --mtu"
        )
    writer = _MessageWriter(args.mtu, args.pkey)
    with output_file(args.output) as tmp, PcapWriter(str(tmp), sync=False, linktype=1) as pcap:
        pcap.write_header(None)  # write_packet (used for explicit timestamps) does not write it
        for record in records:
            src, dst = addresses.of_host(record.src), addresses.of_host(record.dst)
            sec, usec = divmod(int(record.time_us), 1_000_000)
            for data in writer.message(src, dst, record.qp, record.size_bytes):
                pcap.write_packet(data, sec=sec, usec=usec)
    print(
        f"wrote {args.output}: {writer.frames} frames, {len(records)} RDMA WRITE messages, "
        f"{len(writer.psn)} QPs"
    )
    return 0


class _MessageWriter:
    """RDMA WRITE messages as frames: scapy builds each message's first and last packet, a per-QP template
    the middle ones (identical but for the PSN) — a 64-token llama3-70b pcap in seconds, not half a minute."""

    def __init__(self, mtu: int, pkey: int) -> None:
        self.mtu, self.pkey = mtu, pkey
        self.psn: dict[tuple[str, int], int] = {}
        self.middles: dict[tuple[str, int], Any] = {}
        self.frames = 0

    def message(self, src: Any, dst: Any, qp: int, size: int) -> list[bytes]:
        from scapy.compat import raw  # noqa: PLC0415
        from scapy.contrib.roce import BTH  # noqa: PLC0415

        from traffic.fastpath import FrameTemplate  # noqa: PLC0415
        from traffic.roce import RETH, Endpoints, frame, op, rdma_write  # noqa: PLC0415

        key = (src.host, qp)
        ep = Endpoints(src.mac_str, dst.mac_str, src.ipv4_str, dst.ipv4_str, dqpn=qp,
                       sport=0xC000 | (qp & 0x3FFF), pkey=self.pkey)  # fmt: skip
        start = self.psn.get(key, 0)
        n = max(1, -(-size // self.mtu))
        if n <= 2:
            frames = [raw(f) for f in rdma_write(ep, bytes(size), psn=start, mtu=self.mtu)]
        else:
            if key not in self.middles:
                bth = BTH(opcode=op("RC", "RDMA_WRITE_MIDDLE"), pkey=ep.pkey, dqpn=qp)
                self.middles[key] = FrameTemplate(raw(frame(ep, bth, payload=bytes(self.mtu))))
            first_bth = BTH(opcode=op("RC", "RDMA_WRITE_FIRST"), pkey=ep.pkey, dqpn=qp, psn=start)
            first = raw(
                frame(ep, first_bth, RETH(va=0x10000, rkey=0x1234, dmalen=size), payload=bytes(self.mtu))
            )
            tail = size - self.mtu * (n - 1)
            pad = (-tail) % 4
            last_bth = BTH(opcode=op("RC", "RDMA_WRITE_LAST"), padcount=pad, pkey=ep.pkey, dqpn=qp,
                           psn=(start + n - 1) & 0xFFFFFF, ackreq=1)  # fmt: skip
            last = raw(frame(ep, last_bth, payload=bytes(tail + pad)))
            frames = [first, *(self.middles[key].render(start + i) for i in range(1, n - 1)), last]
        self.psn[key] = (start + len(frames)) & 0xFFFFFF
        self.frames += len(frames)
        return frames


__all__ = ["register"]
