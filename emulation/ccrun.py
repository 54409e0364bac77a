"""ECN marking on the emulated fabric for `cc: dcqcn`: one phantom-queue marker (`emulation.ecnmark`) at
the egress of every shaped switch port, draining at the port's scaled rate, marking with DCQCN's profile.

Why every switch egress: the congestion point is wherever a queue builds, and which port that is depends on
the routing policy under test — marking only where we expect the bottleneck would decide the answer.  Host
egresses are not marked: a NIC's own queue is not a switch's (the sender's DCQCN paces it).

The summary says where marks happened (topology ports, not interface names), how many, and the deepest
phantom queue — the "marked queue stays bounded" figure of a report.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from emulation.ecnmark import EcnMarker, ecn_marking_available
from emulation.mnfabric import MininetFabric
from labspec import workplan
from labspec.scenario import Scenario, nic_gbps
from topologies.model import Fabric
from topologies.scale import Scale
from traffic.dcqcn import DcqcnParams

#: Ports listed by name in a summary (the most marked first); the totals count them all.
LISTED_PORTS = 12


@dataclass
class Marking:
    markers: dict[str, EcnMarker] = field(default_factory=dict)  # "leaf8:1" -> its marker
    stats: dict[str, dict[str, int]] = field(default_factory=dict)


def refuses(scenario: Scenario, shards: int = 1) -> str | None:
    """Why `cc: dcqcn` cannot run on this emulator for `scenario` (None: it can, or cc is none)."""
    if scenario.spec.cc != "dcqcn":
        return None
    if scenario.scale is None:
        return "cc: dcqcn needs shaped links (give `scale:`): marking models a link's queue at its rate"
    if scenario.qos is not None:
        return "cc: dcqcn with `qos:` is not supported yet (the marker would have to sit on each class's IFB)"
    if shards > 1:
        return "cc: dcqcn runs on one emulator only (the shards' switch ports are in other namespaces)"
    return ecn_marking_available()


def _limit_bytes(scenario: Scenario, kmax_bytes: int) -> int:
    """The phantom queue's bound: the real port buffer (`buffer_packets` of the largest RoCE frame)."""
    frames = [j.frame_bytes for j in workplan.jobs(scenario) if j.frame_bytes]
    packets = scenario.spec.buffer_packets or 1000
    return max(kmax_bytes, packets * max(frames, default=1500))


def attach_markers(
    fabric: Fabric, net: MininetFabric, scale: Scale, params: DcqcnParams, limit_bytes: int
) -> dict[str, EcnMarker]:
    """A marker on every switch egress of a shaped link ("leaf8:2" -> its marker); all or none (a failure
    detaches the ones attached and raises EcnMarkError)."""
    markers: dict[str, EcnMarker] = {}
    try:
        for link in fabric.links:
            for end in (link.a, link.b):
                if fabric.nodes[end.node].is_host:
                    continue
                tag = f"fl{os.getpid()}-{len(markers)}"
                marker = EcnMarker(net.intf_name(end.node, end.port), scale.mbps(link.bw_gbps) * 1e6,
                                   params.kmin_bytes, params.kmax_bytes, params.pmax, tag=tag,
                                   limit_bytes=limit_bytes)  # fmt: skip
                marker.attach()
                markers[f"{end.node}:{end.port}"] = marker
    except BaseException:
        detach_markers(markers)
        raise
    return markers


def detach_markers(markers: dict[str, EcnMarker]) -> dict[str, dict[str, int]]:
    """Detach every marker; their last counters (a port gone with its switch has none)."""
    stats: dict[str, dict[str, int]] = {}
    for name, marker in markers.items():
        with contextlib.suppress(Exception):
            stats[name] = marker.stats()
        marker.detach()
    return stats


@contextlib.contextmanager
def marking(scenario: Scenario, net: MininetFabric) -> Iterator[Marking]:
    """Markers on every switch egress of a shaped link for the block's duration (none under `cc: none`);
    detached on the way out whatever happened, their last counters kept in `stats`."""
    out = Marking()
    fabric, scale = scenario.fabric, scenario.scale
    speed = next((s for h in fabric.hosts if (s := nic_gbps(fabric, h.name))), None)
    params = scenario.dcqcn(speed) if speed else None
    if params is None or scale is None:
        yield out
        return
    out.markers = attach_markers(fabric, net, scale, params, _limit_bytes(scenario, params.kmax_bytes))
    try:
        yield out
    finally:
        out.stats = detach_markers(out.markers)


def summary(marking: Marking) -> dict[str, Any]:
    """Where marks happened and how deep the marked queues got."""
    stats = marking.stats
    if not marking.markers:
        return {}
    ranked = sorted(stats.items(), key=lambda kv: (-kv[1]["marked"], -kv[1]["peak_queue_bytes"], kv[0]))
    total = {k: sum(s[k] for s in stats.values()) for k in ("packets", "ect_packets", "marked", "overflow")}
    ect = total["ect_packets"]
    return {
        "marking_ports": len(marking.markers),
        "ports_with_marks": sum(1 for s in stats.values() if s["marked"]),
        **total,
        "switch_marked_fraction": round(total["marked"] / ect, 6) if ect else None,
        "peak_queue_bytes": max((s["peak_queue_bytes"] for s in stats.values()), default=0),
        "ports": {
            name: {k: s[k] for k in ("packets", "ect_packets", "marked", "overflow", "peak_queue_bytes")}
            for name, s in ranked[:LISTED_PORTS]
            if s["ect_packets"]
        },
    }


__all__ = ["Marking", "attach_markers", "detach_markers", "marking", "refuses", "summary"]
