"""Measure QoS on an emulated fabric with real packets: classes (DSCP-marked UDP probe flows) into one
bottleneck, per-class throughput and one-way latency, with and without the policy on the same fabric.

`QosBench` starts the controller and a Mininet fabric once (plain HTB links), runs flow sets with `run()`,
and `apply_qos()` switches the fabric's switch ports to the policy's queues (`emulation.qosqueues`) so that a
baseline and a QoS run share one fabric.  Used by tests/test_qos_emulated.py and benchmarks/qos.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.sm.manager import SubnetManager
from controller.sm.qos import QosPolicy
from emulation.controlproc import ControllerProcess
from emulation.headroom import assess, snapshot
from emulation.mnfabric import MininetFabric, Scale
from topologies.loader import load_topology

#: Probe payload: large packets, so a few thousand packets a second fill a scaled link.
SIZE_BYTES = 1000
#: How long receivers listen beyond the senders: the snapshot before the senders start (1-2 s under load)
#: plus draining full class queues at their own rate, so queued packets are received, not counted as lost.
DRAIN_S = 8.0
#: Wire bits of one probe packet (payload + UDP/IP/Ethernet headers).
WIRE_BITS = (SIZE_BYTES + 8 + 20 + 14) * 8


@dataclass(frozen=True)
class ClassFlow:
    name: str
    src: str
    dst: str
    dscp: int
    rate_pps: float
    size_bytes: int = SIZE_BYTES


def link_scale(link_pps: float, bw_gbps: float = 400.0) -> Scale:
    """The scale that makes a `bw_gbps` link carry `link_pps` probe packets a second."""
    return Scale(bw_gbps, link_pps * WIRE_BITS / 1e9)


def steady_rate_pps(record: dict[str, Any], trim: float = 0.25) -> float:
    """Arrivals per second over the middle of a receiver's record (start-up and drain trimmed)."""
    buckets = [count for _, count in record.get("buckets", [])]
    if not buckets:
        return 0.0
    cut = int(len(buckets) * trim)
    middle = buckets[cut : len(buckets) - cut] or buckets
    return float(sum(middle) / len(middle) / float(record["bucket_s"]))


class QosBench:
    def __init__(
        self, topology: Path, scale: Scale, workdir: Path, prefix: str, buffer_packets: int = 200
    ) -> None:
        self.fabric = load_topology(topology)
        self.addresses = SubnetManager(self.fabric).addresses.as_strings()
        # no LLDP rounds during measurements (the declared topology routes; a round costs a frame per port)
        self.ctl = ControllerProcess(
            topology, workdir / "state", workdir / "controller.log", "--lldp-interval", "3600"
        )
        self.net = MininetFabric(
            self.fabric,
            self.addresses,
            controller=self.ctl.openflow,
            scale=scale,
            name_prefix=prefix,
            buffer_packets=buffer_packets,
        )
        self.scale = scale

    def start(self) -> None:
        self.ctl.start()
        try:
            self.net.start()
            self.ctl.ready(len(self.fabric.switches))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self.net.stop()
        finally:
            self.ctl.stop()

    def apply_qos(self, policy: QosPolicy) -> None:
        self.net.qos = policy
        self.net._apply_qos(self.scale)

    def ip(self, host: str) -> str:
        return next(ip for (h, _), (_, ip) in self.addresses.items() if h == host)

    def run(self, flows: Sequence[ClassFlow], duration_s: float) -> dict[str, Any]:
        """Every flow at once for `duration_s`; per flow: steady received rate, latency, loss."""
        # ARP first (the controller answers): a flow's first packets must not wait for it while timed
        pings = [
            self.net.popen(f.src, ["ping", "-c1", "-W2", self.ip(f.dst)], stdout=subprocess.DEVNULL)
            for f in flows
        ]
        for ping in pings:
            ping.wait(timeout=10)
        receivers = []
        for i, flow in enumerate(flows):
            argv = [
                sys.executable,
                "-m",
                "emulation.probe",
                "recv",
                str(9000 + i),
                str(duration_s + DRAIN_S),
                "0.1",
            ]
            proc = self.net.popen(flow.dst, argv, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"receiver of {flow.name} did not start")
            receivers.append(proc)
        before = snapshot(self.net.switch_interfaces(), self.net.headroom_hosts())
        senders = []
        for i, flow in enumerate(flows):
            argv = [
                sys.executable,
                "-m",
                "emulation.probe",
                "send",
                self.ip(flow.dst),
                str(9000 + i),
                f"{flow.rate_pps:.1f}",
                str(duration_s),
                str(flow.size_bytes),
                "--sport",
                str(20000 + i),
                "--dscp",
                str(flow.dscp),
            ]
            senders.append(self.net.popen(flow.src, argv, stdout=subprocess.PIPE, text=True))
        sent = [json.loads(p.communicate(timeout=duration_s + 60)[0]) for p in senders]
        got = [json.loads(p.communicate(timeout=duration_s + 60)[0]) for p in receivers]
        time.sleep(0.2)
        after = snapshot(self.net.switch_interfaces(), self.net.headroom_hosts())
        offered = sum(s["sent"] for s in sent)
        received = sum(g["received"] for g in got)
        headroom = assess(before, after, offered, received_packets=received)
        dropped = {k: v - before.interface_drops.get(k, 0) for k, v in after.interface_drops.items()}
        result: dict[str, Any] = {
            "flows": {},
            "headroom": headroom,
            "interface_drops": {k: v for k, v in dropped.items() if v > 0},
        }
        for flow, s, g in zip(flows, sent, got, strict=True):
            pps = steady_rate_pps(g)
            result["flows"][flow.name] = {
                "src": flow.src,
                "dst": flow.dst,
                "dscp": flow.dscp,
                "offered_pps": flow.rate_pps,
                "sent": s["sent"],
                "received": g["received"],
                "rate_pps": round(pps, 1),
                "rate_mbps": round(pps * (flow.size_bytes + 42) * 8 / 1e6, 3),
                "latency_ms": g["latency_ms"],
                "arrivals_s": round((g["last"] or 0) - (g["first"] or 0), 3),
            }
        return result


__all__ = ["SIZE_BYTES", "WIRE_BITS", "ClassFlow", "QosBench", "link_scale", "steady_rate_pps"]
