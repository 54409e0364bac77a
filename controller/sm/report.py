"""The routing report: verification and quality figures as one JSON-able dict and as a text table.

The dict is the contract (the CLI prints it with --json, the REST API will serve it); the table is a
rendering of it for people.
"""

from __future__ import annotations

from typing import Any

from controller.sm.quality import Quality, TierLoad
from controller.sm.tables import RoutingTables
from controller.sm.verify import Verification
from topologies.faults import tier_counts_text


def _tier(t: TierLoad) -> dict[str, Any]:
    return {
        "tier": t.tier,
        "channels": t.channels,
        "max": round(t.max, 3),
        "mean": round(t.mean, 3),
        "max_over_mean": round(t.max_over_mean, 4),
    }


def build_report(
    tables: RoutingTables,
    verification: Verification,
    quality: Quality | None,
    route_s: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    subnet = tables.subnet
    fabric = subnet.fabric
    report: dict[str, Any] = {
        "fabric": {
            "name": fabric.name,
            "switches": subnet.n_switches,
            "hosts": len(fabric.hosts),
            "links": len(fabric.links),
            "switch_links": subnet.links_between_switches,
            "lids": len(subnet.lids),
        },
        "engine": tables.engine,
        "engine_info": dict(tables.info),
        "route_s": round(route_s, 4),
        "digest": tables.digest(),
        "verification": {
            "ok": verification.ok,
            "host_pairs": verification.host_pairs,
            "unreachable_pairs": verification.unreachable_pairs,
            "entries": verification.entries,
            "dead_entries": verification.dead_entries,
            "loop_entries": verification.loop_entries,
            "hops": {
                "mean": round(verification.mean_hops, 4),
                "mean_shortest": round(verification.mean_shortest_hops, 4),
                "max": verification.max_hops,
                "max_extra": verification.max_extra_hops,
                "pairs_longer_than_shortest": verification.pairs_longer_than_shortest,
            },
        },
    }
    d = verification.deadlock
    if d is not None:
        report["verification"]["deadlock"] = {
            "vls": d.vls,
            "acyclic": d.acyclic,
            "layers_used": d.layers_used,
            "channels": d.channels,
            "dependencies": d.dependencies,
            "cycles": d.cycles,
            "note": d.note,
        }
    if quality is not None:
        report["all_to_all"] = {
            "switch_links": _tier(quality.switch_links),
            "tiers": [_tier(t) for t in quality.all_to_all],
        }
        if quality.shift is not None:
            s = quality.shift
            report["shift"] = {
                "hosts": s.hosts,
                "shifts_evaluated": s.shifts_evaluated,
                "worst_max_flows": s.worst_max_flows,
                "worst_shift": s.worst_shift,
                "shifts_with_contention": s.shifts_with_contention,
            }
    if extra:
        report.update(extra)
    return report


def render_report(report: dict[str, Any]) -> str:
    f = report["fabric"]
    v = report["verification"]
    h = v["hops"]
    lines = [
        f"fabric        {f['name']}: {f['switches']} switches, {f['hosts']} hosts, "
        f"{f['switch_links']} switch links, {f['lids']} LIDs",
        f"engine        {report['engine']}  (routing {report['route_s']:.3f} s, tables {report['digest']})",
    ]
    info = report.get("engine_info") or {}
    if info.get("roots"):
        lines.append(f"roots         {', '.join(map(str, info['roots']))} ({info.get('levels')} levels)")
    if info.get("fallback"):
        lines.append(f"fallback      {info['fallback']}")
    if info.get("labels") == "canonical":
        lines.append(
            "labels        canonical: ties broken by GUIDs and port numbers derived from the cabling"
        )
    if info.get("repair"):
        r = info["repair"]
        lines.append(
            f"repair        {r['switches_short_of_uplinks']} switch(es) below their tier's uplink count; "
            f"{r['entries_past_a_lost_uplink']} entries climb past a lost uplink, "
            f"{r['entries_moved']} of them moved and spread over the uplinks left (the digit is still taken "
            "over the tier's count)"
        )
        rebalanced = r.get("entries_rebalanced_by_load")
        if isinstance(rebalanced, int):
            own = r.get("switches_that_lost_an_uplink_of_their_own")
            lines.append(
                f"              {own} switch(es) lost an uplink of their own (wide damage): "
                f"the moved entries were chosen again by measured load, {rebalanced} changed"
            )
    if "fallback" in report:
        lines.append(f"fallback      {report['fallback']['reason']}")
    if "degraded" in report:
        g = report["degraded"]
        which = (
            f" ({tier_counts_text(g.get('failed_switch_tiers') or {})}: {', '.join(g['failed_switches'])})"
        )
        lines.append(
            f"degraded      {len(g['failed_links'])} link(s) and "
            f"{len(g['failed_switches'])} switch(es){which if g['failed_switches'] else ''} failed "
            f"(seed {g['seed']}); {len(g['lost_hosts'])} host(s) cut off"
        )
        if "intact" in g:
            was, now = g["intact"], g["degraded"]
            shift = ""
            if "shift_worst_max_flows" in was and "shift_worst_max_flows" in now:
                shift = (
                    f"; worst shift {now['shift_worst_max_flows']} (intact {was['shift_worst_max_flows']})"
                )
            lines.append(
                f"balance       switch links max/mean {now['switch_links_max_over_mean']:.3f} "
                f"(intact {was['switch_links_max_over_mean']:.3f}), worst tier "
                f"{now['worst_tier_max_over_mean']:.3f} (intact {was['worst_tier_max_over_mean']:.3f}){shift}"
            )
    reach = (
        f"all {v['host_pairs']} host pairs reachable"
        if v["unreachable_pairs"] == 0
        else f"{v['unreachable_pairs']} of {v['host_pairs']} host pairs UNREACHABLE"
    )
    lines.append(f"reachability  {reach}; {v['loop_entries']} loop entries, {v['dead_entries']} dead entries")
    lines.append(
        f"hops          mean {h['mean']:.3f} (shortest {h['mean_shortest']:.3f}), max {h['max']}, "
        f"{h['pairs_longer_than_shortest']} pairs longer than shortest (max +{h['max_extra']})"
    )
    d = v.get("deadlock")
    if d:
        if d["acyclic"] and (report.get("engine_info") or {}).get("layers") is not None:
            text = f"deadlock-free with {d['layers_used']} VL(s), layers assigned by the engine"
        elif d["acyclic"]:
            layers = f" using {d['layers_used']} VL(s)" if d["vls"] > 1 else ""
            text = f"deadlock-free with {d['vls']} VL(s){layers}"
        else:
            text = f"CYCLIC channel dependencies with {d['vls']} VL(s)"
        lines.append(f"deadlock      {text}: {d['channels']} channels, {d['dependencies']} dependencies")
        for cycle in d["cycles"][:3]:
            shown = " -> ".join(cycle[:6]) + (" -> ..." if len(cycle) > 6 else "")
            lines.append(f"  cycle       {shown}")
        if d.get("note"):
            lines.append(f"  note        {d['note']}")
    if "all_to_all" in report:
        lines.append("all-to-all    flows per channel (one flow per host pair)")
        lines.append(f"  {'tier':<14}{'channels':>9}{'max':>10}{'mean':>12}{'max/mean':>10}")
        for t in [*report["all_to_all"]["tiers"], report["all_to_all"]["switch_links"]]:
            lines.append(
                f"  {t['tier']:<14}{t['channels']:>9}{t['max']:>10.0f}"
                f"{t['mean']:>12.2f}{t['max_over_mean']:>10.3f}"
            )
    if "shift" in report:
        s = report["shift"]
        lines.append(
            f"shift perms   worst {s['worst_max_flows']} flow(s) on one link (shift {s['worst_shift']}); "
            f"{s['shifts_with_contention']} of {s['shifts_evaluated']} shifts with contention"
        )
    return "\n".join(lines)


__all__ = ["build_report", "render_report"]
