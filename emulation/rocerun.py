"""RoCEv2 collectives inside a scenario run: the planner's bytes as RDMA WRITE streams between ranks.

Each (src, dst) pair of the plan becomes one stream on its own QP, sized to the bytes the collective moves
between them (in MTU-sized WRITE packets).  Every source host runs one `traffic.agent send-many` that
interleaves its streams at its rate; every destination host runs one `traffic.agent recv` that verifies
PSN order and ICRC per QP.  The collective's time is first packet to last packet over all its QPs, scored
as nccl-tests does: algbw = per-rank size / time, busbw = algbw × the collective's bus factor.  (Steps are
not barriered: this measures the fabric carrying the collective's traffic matrix, not NCCL's pipelining.)
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.partitions_file import load_partitions
from controller.sm.partitions import Partitions
from emulation.mnfabric import MininetFabric
from emulation.scenario import RoceCollective, Scenario, collective_plan
from traffic.patterns import Plan, bus_factor
from traffic.roce import DEFAULT_PKEY

QP_BASE = 0x100


@dataclass
class _Collective:
    item: RoceCollective
    plan: Plan
    pairs: dict[tuple[str, str], tuple[int, int]]  # (src, dst) -> (qp, packets)
    #: (src, dst) -> the P_Key its packets carry in the BTH (the partition the pair shares)
    pkeys: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class RoceRun:
    collectives: list[_Collective]
    #: Source hosts whose senders vary the UDP source port per packet (the policy sprays).
    spraying: set[str] = field(default_factory=set)
    receivers: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    senders: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    #: Frames each receiver's socket dropped (buffer full): the emulator's, counted before the socket closed.
    socket_drops: dict[str, int] = field(default_factory=dict)


def pair_pkey(partitions: Partitions | None, src: str, dst: str) -> int:
    """The P_Key a RoCEv2 packet from `src` to `dst` carries: the lowest partition they may talk in, with
    the membership bit of the sender (no partitions file: 0xffff, full member of the default partition).
    A pair that shares none gets the default's limited key: the fabric drops its packets anyway."""
    if partitions is None:
        return DEFAULT_PKEY
    pkey = partitions.pkey_for(src, dst)
    return pkey if pkey is not None else DEFAULT_PKEY & 0x7FFF


def prepare(scenario: Scenario) -> RoceRun:
    hosts = [h.name for h in scenario.fabric.hosts]
    file = scenario.partitions_file
    partitions = load_partitions(file, scenario.fabric) if file is not None else None
    collectives = []
    qp = QP_BASE
    for item in scenario.spec.traffic:
        if not isinstance(item, RoceCollective):
            continue
        plan = collective_plan(item, hosts)
        pairs = {}
        for (src, dst), size in sorted(plan.bytes_by_pair().items()):
            pairs[(src, dst)] = (qp, -(-size // item.mtu))
            qp += 1
        pkeys = {pair: pair_pkey(partitions, *pair) for pair in pairs}
        collectives.append(_Collective(item, plan, pairs, pkeys))
    spraying = {src for c in collectives if scenario.sprays(c.item.entropy) for src, _ in c.pairs}
    return RoceRun(collectives, spraying)


def start_receivers(run: RoceRun, net: MininetFabric, seconds: float) -> None:
    dsts = sorted({dst for c in run.collectives for (_, dst) in c.pairs})
    for host in dsts:
        argv = [
            sys.executable,
            "-m",
            "traffic.agent",
            "recv",
            net.intf_name(host, 1),
            "--duration",
            str(seconds),
        ]
        run.receivers[host] = net.popen(
            host, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
    for proc in run.receivers.values():
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def rates(run: RoceRun) -> dict[str, float]:
    """Packets per second each source host sends (its agent interleaves all its streams at one rate)."""
    rate: dict[str, float] = {}
    for c in run.collectives:
        for src, _ in c.pairs:
            rate[src] = max(rate.get(src, 0.0), c.item.rate_pps)
    return rate


def start_senders(run: RoceRun, net: MininetFabric, work: Path) -> None:
    by_src: dict[str, list[dict[str, Any]]] = {}
    rate: dict[str, float] = {}
    mtu: dict[str, int] = {}
    for c in run.collectives:
        for (src, dst), (qp, packets) in c.pairs.items():
            mac, ip = net.addresses[(dst, 1)]
            stream = {
                "dst_mac": mac,
                "dst_ip": ip,
                "qp": qp,
                "packets": packets,
                "pkey": c.pkeys.get((src, dst), DEFAULT_PKEY),
            }
            if c.item.dscp is not None:  # the collective's traffic class (QoS); else the agent's RoCE default
                stream["dscp"] = c.item.dscp
            by_src.setdefault(src, []).append(stream)
            rate[src] = max(rate.get(src, 0.0), c.item.rate_pps)
            mtu[src] = c.item.mtu
    for src, streams in by_src.items():
        path = work / f"streams-{src}.json"
        path.write_text(json.dumps(streams))
        mac, ip = net.addresses[(src, 1)]
        argv = [sys.executable, "-m", "traffic.agent", "send-many", net.intf_name(src, 1), "--src-mac", mac,
                "--src-ip", ip, "--streams", str(path), "--rate", str(rate[src]),
                "--size", str(mtu[src]), *(["--spray"] if src in run.spraying else [])]  # fmt: skip
        run.senders[src] = net.popen(src, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finish(run: RoceRun) -> list[dict[str, Any]]:
    starts = []
    for proc in run.senders.values():
        out = proc.communicate(timeout=120)[0]
        with contextlib.suppress(ValueError, KeyError, TypeError):
            starts.append(float(json.loads(out)["start"]))
    start = min(starts, default=None)
    received: dict[str, dict[str, Any]] = {}
    for host, proc in run.receivers.items():
        report = json.loads(proc.communicate(timeout=120)[0])
        received[host] = report["qps"]
        run.socket_drops[host] = int(report.get("socket_drops", 0))
    results = []
    for c in run.collectives:
        expected = got = lost = out_of_order = bad = 0
        first, last = float("inf"), 0.0
        fcts: list[float] = []
        for (_, dst), (qp, packets) in c.pairs.items():
            stats = received.get(dst, {}).get(str(qp))
            expected += packets
            if stats:
                got += stats["received"]
                lost += stats["lost"] + max(0, packets - stats["received"] - stats["lost"])
                out_of_order += stats["out_of_order"]
                bad += stats["bad_icrc"]
                first, last = min(first, stats["first"]), max(last, stats["last"])
                if start is not None:
                    fcts.append(round(stats["last"] - start, 4))  # this QP's transfer: start to last byte
            else:
                lost += packets
        seconds = last - first if got else 0.0
        n = len(c.plan.ranks)
        algbw = c.plan.size_bytes / seconds / 1e9 if seconds > 0 else 0.0
        results.append(
            {
                "collective": c.plan.kind,
                "ranks": n,
                "size_bytes": c.plan.size_bytes,
                "qps": len(c.pairs),
                "packets_expected": expected,
                "packets_received": got,
                "lost": lost,
                "out_of_order": out_of_order,
                "bad_icrc": bad,
                "seconds": round(seconds, 4),
                "algbw_gbps": float(f"{algbw:.6g}"),
                "busbw_gbps": float(f"{algbw * bus_factor(c.plan.kind, n):.6g}"),
                "qp_fct_s": sorted(fcts),
                "sprayed": any(src in run.spraying for src, _ in c.pairs),
                "dscp": c.item.dscp,
                "mtu": c.item.mtu,
            }
        )
    return results


__all__ = ["RoceRun", "finish", "prepare", "rates", "start_receivers", "start_senders"]
