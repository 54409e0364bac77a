"""Per-class results of a scenario run with QoS: what each traffic class (qos-level) got of the fabric.

Flows and RoCE collectives carry a DSCP; the policy maps it to an SL and so to a qos-level (the first level
on that SL; DSCPs no level claims are reported by their SL).  Per class: flows, packets sent/received,
goodput, its share of all classes' goodput, and one-way latency (p50 = median of the flows' medians; p99 =
the worst flow's p99).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.sm.qos import QosPolicy, dscp_to_sl

#: The DSCP RoCE senders mark when a collective names none (traffic.agent's default).
ROCE_DEFAULT_DSCP = 26


def class_of(policy: QosPolicy, dscp: int | None) -> str:
    sl = dscp_to_sl(policy)[dscp or 0]
    return next((lv.name for lv in policy.levels if lv.sl == sl), f"SL{sl}")


def class_summary(
    policy: QosPolicy, flows: Sequence[dict[str, Any]], collectives: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    classes: dict[str, dict[str, Any]] = {}

    def entry(name: str, dscp: int) -> dict[str, Any]:
        sl = dscp_to_sl(policy)[dscp]
        return classes.setdefault(
            name,
            {
                "class": name,
                "sl": sl,
                "vl": policy.sl2vl[sl],
                "dscp": dscp,
                "flows": 0,
                "sent": 0,
                "received": 0,
                "goodput_mbps": 0.0,
                "p50s": [],
                "p99s": [],
            },
        )

    for f in flows:
        e = entry(class_of(policy, f.get("dscp")), f.get("dscp") or 0)
        e["flows"] += 1
        e["sent"] += int(f["sent"])
        e["received"] += int(f["received"])
        e["goodput_mbps"] += float(f["goodput_mbps"])
        if f.get("latency_ms"):
            e["p50s"].append(f["latency_ms"]["p50"])
            e["p99s"].append(f["latency_ms"]["p99"])
    for c in collectives:
        dscp = c.get("dscp")
        dscp = ROCE_DEFAULT_DSCP if dscp is None else dscp
        e = entry(class_of(policy, dscp), dscp)
        e["flows"] += int(c["qps"])
        e["sent"] += int(c["packets_expected"])
        e["received"] += int(c["packets_received"])
        seconds = float(c["seconds"]) or 0.0
        if seconds > 0:  # what arrived (MTU-sized payloads) over the collective's own duration
            e["goodput_mbps"] += int(c["packets_received"]) * int(c.get("mtu", 1024)) * 8 / seconds / 1e6
    total = sum(e["goodput_mbps"] for e in classes.values()) or 1.0
    result = []
    for e in sorted(classes.values(), key=lambda e: (e["sl"], e["class"])):
        p50s, p99s = sorted(e.pop("p50s")), e.pop("p99s")
        e["goodput_mbps"] = round(e["goodput_mbps"], 3)
        e["share"] = round(e["goodput_mbps"] / total, 4)
        e["latency_p50_ms"] = p50s[len(p50s) // 2] if p50s else None
        e["latency_p99_ms"] = max(p99s) if p99s else None
        result.append(e)
    return result


def class_block(classes: Sequence[dict[str, Any]]) -> tuple[str, list[str], list[list[Any]]]:
    """The report's table (emulation.report's block format)."""
    return (
        "table",
        [
            "QoS class",
            "SL",
            "VL/queue",
            "DSCP",
            "flows/QPs",
            "received/sent",
            "goodput Mb/s",
            "share",
            "latency p50 ms",
            "latency p99 ms",
        ],
        [
            [
                c["class"],
                c["sl"],
                c["vl"],
                c["dscp"],
                c["flows"],
                f"{c['received']}/{c['sent']}",
                c["goodput_mbps"],
                f"{100 * c['share']:.1f} %",
                c["latency_p50_ms"],
                c["latency_p99_ms"],
            ]
            for c in classes
        ],
    )


__all__ = ["ROCE_DEFAULT_DSCP", "class_block", "class_of", "class_summary"]
