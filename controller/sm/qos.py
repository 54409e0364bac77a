"""The subnet manager's QoS policy, after OpenSM's `qos-policy.conf` (doc/QoS_management_in_OpenSM.txt).

OpenSM's model, kept: **port groups** (members by host name, port GUID, P_Key, node type), **qos-levels** (a
service level, an optional rate limit and P_Key; `DEFAULT` is mandatory), **match rules** (source/destination
group, P_Key, traffic class -> qos-level; the first that matches wins, no match is `DEFAULT`), an **SL -> VL
table** and **VL arbitration** (`vlarb_high`/`vlarb_low` as VL:weight pairs and `vl_high_limit`).

What Ethernet adds: RoCEv2 carries no SL, so the class travels in the IP header's **DSCP** and, where VLANs
are
used, the 802.1Q **PCP**.  The map (overridable with `dscp_to_sl`):

* DSCP -> SL: `dscp >> 2` (DSCP 0-3 -> SL 0, ..., 24-27 -> SL 6, 60-63 -> SL 15); a switch classifies by it.
* SL -> DSCP: what a sender marks for a service level: the DSCP an override names for that SL (lowest
  first), else `sl << 2`.  RoCE's customary DSCP 26 is SL 6 by default.
* PCP: the VL the SL travels on (`sl2vl`), 0-7: 802.1Q priorities select a queue as VLs do.
* VL -> egress queue: queue number = VL.  VLs in `vlarb_high` are strict priority; VLs in `vlarb_low` share
  what is left in proportion to their weights.

Everything here is pure: frozen dataclasses in, frozen dataclasses or JSON-ready dicts out, `QosError` (a
message and the field) for a policy that makes no sense.  The YAML schema layer that builds these objects,
with line numbers, is `controller.formats.qosfile`; emulation turns `queue_plan()` into tc configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topologies.model import Fabric

NODE_TYPES = ("CA", "SWITCH", "ROUTER", "ALL", "SELF")
#: OpenSM's default SL -> VL table (16 SLs over 8 data VLs).
DEFAULT_SL2VL = tuple(sl % 8 for sl in range(16))
#: Data VLs an egress port has queues for (VL15 is management and never arbitrated).
DATA_VLS = 8
DEFAULT_LEVEL = "DEFAULT"


class QosError(ValueError):
    """A policy that is well-formed but wrong; `field` is the path in the file (`qos_levels.gold.sl`)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class PortGroup:
    name: str
    hosts: tuple[str, ...] = ()
    guids: tuple[int, ...] = ()
    pkeys: tuple[int, ...] = ()
    node_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class QosLevel:
    name: str
    sl: int
    #: A cap in the fabric's own units (emulation scales it like the links).
    rate_limit_gbps: float | None = None
    pkey: int | None = None


@dataclass(frozen=True)
class MatchRule:
    level: str
    source: tuple[str, ...] = ()
    destination: tuple[str, ...] = ()
    pkeys: tuple[int, ...] = ()
    #: Traffic classes (DSCP values) the rule applies to; empty: any.
    traffic_classes: tuple[int, ...] = ()


@dataclass(frozen=True)
class VlArbitration:
    high: tuple[tuple[int, int], ...] = ()
    low: tuple[tuple[int, int], ...] = ((0, 255),)
    #: OpenSM's vl_high_limit (0-255; 255: high-priority VLs are never held back).
    high_limit: int = 255


@dataclass(frozen=True)
class QosPolicy:
    levels: tuple[QosLevel, ...]
    port_groups: tuple[PortGroup, ...] = ()
    rules: tuple[MatchRule, ...] = ()
    sl2vl: tuple[int, ...] = DEFAULT_SL2VL
    vlarb: VlArbitration = VlArbitration()
    #: Overrides of the default DSCP -> SL map (dscp >> 2).
    dscp_overrides: tuple[tuple[int, int], ...] = ()

    def level(self, name: str) -> QosLevel:
        return next(level for level in self.levels if level.name == name)


@dataclass(frozen=True)
class QueueSpec:
    """One egress queue of every switch port: the VL's queue, its arbitration and what is classified in."""

    queue: int
    vl: int
    strict: bool
    weight: int
    #: Share of the link among the weighted (low-priority) queues; strict queues: 1.0.
    share: float
    sls: tuple[int, ...]
    dscps: tuple[int, ...]
    #: SL -> cap (fabric units) of levels with a rate limit on this VL.
    rate_limits_gbps: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class QueuePlan:
    queues: tuple[QueueSpec, ...]
    high_limit: int
    default_queue: int = field(default=0)

    def queue_of_dscp(self, dscp: int) -> int:
        return next((q.queue for q in self.queues if dscp in q.dscps), self.default_queue)


# --- the DSCP map ---------------------------------------------------------------------------------------


def dscp_to_sl(policy: QosPolicy) -> tuple[int, ...]:
    table = [dscp >> 2 for dscp in range(64)]
    for dscp, sl in policy.dscp_overrides:
        table[dscp] = sl
    return tuple(table)


def sl_to_dscp(policy: QosPolicy) -> tuple[int | None, ...]:
    """What a sender marks for each SL (None: no DSCP classifies into that SL)."""
    table = dscp_to_sl(policy)
    named = sorted(policy.dscp_overrides)
    marks: list[int | None] = []
    for sl in range(16):
        choice = next((d for d, s in named if s == sl), None)
        if choice is None and table[sl << 2] == sl:
            choice = sl << 2
        if choice is None:
            choice = next((d for d in range(64) if table[d] == sl), None)
        marks.append(choice)
    return tuple(marks)


def sl_to_pcp(policy: QosPolicy) -> tuple[int, ...]:
    return tuple(vl & 7 for vl in policy.sl2vl)


# --- validation (layer 3: cross-references and meaning) --------------------------------------------------


def _check_pkey(value: int, where: str) -> None:
    if not 0x0001 <= value & 0x7FFF <= 0x7FFF:
        raise QosError(f"P_Key {value:#06x} out of 0x0001-0x7fff (bit 15 is membership)", where)


def _check_pairs(pairs: Sequence[tuple[int, int]], where: str) -> None:
    seen: set[int] = set()
    for vl, weight in pairs:
        if not 0 <= vl <= 14:
            raise QosError(f"VL {vl} out of 0-14 (VL15 is management)", where)
        if not 0 <= weight <= 255:
            raise QosError(f"weight {weight} of VL {vl} out of 0-255", where)
        if vl in seen:
            raise QosError(f"VL {vl} appears twice", where)
        seen.add(vl)


def validate_policy(policy: QosPolicy, fabric: Fabric | None = None) -> QosPolicy:
    """The policy if it makes sense (else `QosError` naming the field); with a fabric, members too."""
    names = [level.name for level in policy.levels]
    if DEFAULT_LEVEL not in names:
        raise QosError("a policy needs a DEFAULT qos-level (OpenSM requires it)", "qos_levels")
    for level in policy.levels:
        where = f"qos_levels.{level.name}"
        if not 0 <= level.sl <= 15:
            raise QosError(f"SL {level.sl} out of 0-15", f"{where}.sl")
        if level.rate_limit_gbps is not None and not level.rate_limit_gbps > 0:
            raise QosError("must be > 0", f"{where}.rate_limit_gbps")
        if level.pkey is not None:
            _check_pkey(level.pkey, f"{where}.pkey")
    groups = {group.name for group in policy.port_groups}
    for group in policy.port_groups:
        where = f"port_groups.{group.name}"
        for pkey in group.pkeys:
            _check_pkey(pkey, f"{where}.pkeys")
        for kind in group.node_types:
            if kind not in NODE_TYPES:
                raise QosError(f"unknown node type {kind!r} ({', '.join(NODE_TYPES)})", f"{where}.node_types")
        if fabric is not None:
            for host in group.hosts:
                if host not in fabric.nodes:
                    raise QosError(f"unknown host {host!r}", f"{where}.hosts")
            guids = _port_guids(fabric)
            for guid in group.guids:
                if guid not in guids:
                    raise QosError(f"no port of the topology has GUID {guid:#018x}", f"{where}.guids")
    for i, rule in enumerate(policy.rules):
        where = f"match_rules[{i}]"
        if rule.level not in names:
            raise QosError(f"unknown qos-level {rule.level!r} ({', '.join(names)})", f"{where}.level")
        for key, members in (("source", rule.source), ("destination", rule.destination)):
            for name in members:
                if name not in groups:
                    known = ", ".join(sorted(groups)) or "none defined"
                    raise QosError(f"unknown port group {name!r} ({known})", f"{where}.{key}")
        for pkey in rule.pkeys:
            _check_pkey(pkey, f"{where}.pkeys")
        for dscp in rule.traffic_classes:
            if not 0 <= dscp <= 63:
                raise QosError(f"traffic class (DSCP) {dscp} out of 0-63", f"{where}.traffic_class")
    if len(policy.sl2vl) != 16:
        raise QosError(f"16 entries (one per SL), got {len(policy.sl2vl)}", "sl2vl")
    for sl, vl in enumerate(policy.sl2vl):
        if not 0 <= vl < DATA_VLS:
            raise QosError(f"SL {sl} -> VL {vl}: data VLs are 0-{DATA_VLS - 1}", "sl2vl")
    _check_pairs(policy.vlarb.high, "vlarb.high")
    _check_pairs(policy.vlarb.low, "vlarb.low")
    if not 0 <= policy.vlarb.high_limit <= 255:
        raise QosError(f"{policy.vlarb.high_limit} out of 0-255", "vlarb.high_limit")
    for dscp, sl in policy.dscp_overrides:
        if not 0 <= dscp <= 63:
            raise QosError(f"DSCP {dscp} out of 0-63", "dscp_to_sl")
        if not 0 <= sl <= 15:
            raise QosError(f"DSCP {dscp} -> SL {sl} out of 0-15", "dscp_to_sl")
    weighted = {vl for vl, w in policy.vlarb.high + policy.vlarb.low if w > 0}
    marks = sl_to_dscp(policy)
    for level in policy.levels:
        vl = policy.sl2vl[level.sl]
        if vl not in weighted:
            raise QosError(
                f"SL {level.sl} travels on VL {vl}, which has no weight in vlarb.high or vlarb.low: its "
                "packets would never be sent",
                f"qos_levels.{level.name}.sl",
            )
        if marks[level.sl] is None:
            raise QosError(
                f"no DSCP classifies into SL {level.sl} (see dscp_to_sl)", f"qos_levels.{level.name}.sl"
            )
    limits: dict[int, float] = {}
    for level in policy.levels:
        if level.rate_limit_gbps is None:
            continue
        if limits.get(level.sl, level.rate_limit_gbps) != level.rate_limit_gbps:
            raise QosError(
                f"SL {level.sl} already has another rate limit ({limits[level.sl]} Gb/s): the fabric "
                "caps per SL, so levels sharing an SL must agree",
                f"qos_levels.{level.name}.rate_limit_gbps",
            )
        limits[level.sl] = level.rate_limit_gbps
    return policy


def _port_guids(fabric: Fabric) -> set[int]:
    guids = {node.guid for node in fabric.nodes.values()}
    guids |= {fabric.nodes[r.node].port_guid(r.port) for r in fabric.port_map}
    return guids


# --- resolution ------------------------------------------------------------------------------------------


def group_members(
    group: PortGroup, fabric: Fabric, pkey_members: Mapping[int, Iterable[str]] | None = None
) -> list[str]:
    """Node names a port group stands for.  P_Key members come from the partitions (`pkey_members`: P_Key ->
    hosts); without partitions every host is in the default partition only."""
    members: set[str] = set(group.hosts)
    guid_owner = {node.guid: node.name for node in fabric.nodes.values()}
    guid_owner |= {fabric.nodes[r.node].port_guid(r.port): r.node for r in fabric.port_map}
    members |= {guid_owner[g] for g in group.guids if g in guid_owner}
    for kind in group.node_types:
        if kind in ("CA", "ALL"):
            members |= {h.name for h in fabric.hosts}
        if kind in ("SWITCH", "ALL"):
            members |= {s.name for s in fabric.switches}
        # ROUTER: the fabric has none; SELF is the subnet manager's own port (no node of the topology)
    for pkey in group.pkeys:
        if pkey_members is not None:
            members |= set(pkey_members.get(pkey & 0x7FFF, ()))
        elif pkey & 0x7FFF == 0x7FFF:
            members |= {h.name for h in fabric.hosts}
    return sorted(members, key=lambda n: (fabric.nodes[n].is_switch, n) if n in fabric.nodes else (True, n))


def match_level(
    policy: QosPolicy,
    members: Mapping[str, Sequence[str]],
    src: str,
    dst: str,
    pkey: int | None = None,
    dscp: int | None = None,
) -> QosLevel:
    """The qos-level of a path (OpenSM's PathRecord query): the first rule whose every given criterion holds;
    `members` is group -> node names (`group_members`).  A rule's own P_Key criterion and the level's P_Key
    must agree with the path's P_Key when one is asked."""
    for rule in policy.rules:
        if rule.source and not any(src in members.get(g, ()) for g in rule.source):
            continue
        if rule.destination and not any(dst in members.get(g, ()) for g in rule.destination):
            continue
        if rule.pkeys and (pkey is None or pkey & 0x7FFF not in {p & 0x7FFF for p in rule.pkeys}):
            continue
        if rule.traffic_classes and (dscp is None or dscp not in rule.traffic_classes):
            continue
        return policy.level(rule.level)
    return policy.level(DEFAULT_LEVEL)


def queue_plan(policy: QosPolicy) -> QueuePlan:
    """Egress queues every switch port gets: one per data VL that carries an SL and has a weight."""
    table = dscp_to_sl(policy)
    high = dict(policy.vlarb.high)
    low = dict(policy.vlarb.low)
    limits = {lv.sl: lv.rate_limit_gbps for lv in policy.levels if lv.rate_limit_gbps is not None}
    used = sorted({vl for vl in policy.sl2vl if high.get(vl, 0) > 0 or low.get(vl, 0) > 0})
    low_total = sum(low.get(vl, 0) for vl in used if high.get(vl, 0) == 0) or 1
    queues = []
    for vl in used:
        sls = tuple(sl for sl in range(16) if policy.sl2vl[sl] == vl)
        strict = high.get(vl, 0) > 0
        weight = high[vl] if strict else low[vl]
        queues.append(
            QueueSpec(
                queue=vl,
                vl=vl,
                strict=strict,
                weight=weight,
                share=1.0 if strict else round(weight / low_total, 6),
                sls=sls,
                dscps=tuple(d for d in range(64) if table[d] in sls),
                rate_limits_gbps=tuple((sl, limits[sl]) for sl in sls if sl in limits),
            )
        )
    default_vl = policy.sl2vl[policy.level(DEFAULT_LEVEL).sl]
    return QueuePlan(tuple(queues), policy.vlarb.high_limit, default_queue=default_vl)


def resolve(policy: QosPolicy, fabric: Fabric | None = None) -> dict[str, object]:
    """The policy as `qos check` prints it and REST serves it: members resolved, tables spelt out."""
    marks = sl_to_dscp(policy)
    plan = queue_plan(policy)
    groups: dict[str, object] = {}
    for group in policy.port_groups:
        entry: dict[str, object] = {
            "hosts": list(group.hosts),
            "guids": [f"{g:#018x}" for g in group.guids],
            "pkeys": [f"{p:#06x}" for p in group.pkeys],
            "node_types": list(group.node_types),
        }
        if fabric is not None:
            entry["members"] = group_members(group, fabric)
        groups[group.name] = entry
    return {
        "port_groups": groups,
        "qos_levels": [
            {
                "name": lv.name,
                "sl": lv.sl,
                "dscp": marks[lv.sl],
                "vl": policy.sl2vl[lv.sl],
                "queue": policy.sl2vl[lv.sl],
                "rate_limit_gbps": lv.rate_limit_gbps,
                "pkey": None if lv.pkey is None else f"{lv.pkey:#06x}",
            }
            for lv in policy.levels
        ],
        "match_rules": [
            {
                "level": r.level,
                "source": list(r.source),
                "destination": list(r.destination),
                "pkeys": [f"{p:#06x}" for p in r.pkeys],
                "traffic_class": list(r.traffic_classes),
            }
            for r in policy.rules
        ],
        "sl2vl": list(policy.sl2vl),
        "vlarb": {
            "high": [[vl, w] for vl, w in policy.vlarb.high],
            "low": [[vl, w] for vl, w in policy.vlarb.low],
            "high_limit": policy.vlarb.high_limit,
        },
        "dscp_to_sl": list(dscp_to_sl(policy)),
        "sl_to_dscp": list(marks),
        "sl_to_pcp": list(sl_to_pcp(policy)),
        "queues": [
            {
                "queue": q.queue,
                "vl": q.vl,
                "arbitration": "strict" if q.strict else "weighted",
                "weight": q.weight,
                "share": q.share,
                "sls": list(q.sls),
                "dscps": list(q.dscps),
                "rate_limits_gbps": {str(sl): cap for sl, cap in q.rate_limits_gbps},
            }
            for q in plan.queues
        ],
        "default_queue": plan.default_queue,
    }


def default_policy() -> QosPolicy:
    """No QoS file: one DEFAULT level on SL 0, VL 0, one queue (what the fabric does without QoS)."""
    return QosPolicy(levels=(QosLevel(DEFAULT_LEVEL, 0),))


def policy_data(policy: QosPolicy) -> dict[str, Any]:
    """The policy as file data again (what `parse_policy` reads back to the same policy), as
    ``--state-dir`` keeps it."""
    data: dict[str, Any] = {
        "port_groups": {
            g.name: {
                "hosts": list(g.hosts),
                "guids": list(g.guids),
                "pkeys": list(g.pkeys),
                "node_types": list(g.node_types),
            }
            for g in policy.port_groups
        },
        "qos_levels": {
            lv.name: {
                "sl": lv.sl,
                **({"rate_limit_gbps": lv.rate_limit_gbps} if lv.rate_limit_gbps else {}),
                **({"pkey": lv.pkey} if lv.pkey is not None else {}),
            }
            for lv in policy.levels
        },
        "match_rules": [
            {
                "level": r.level,
                "source": list(r.source),
                "destination": list(r.destination),
                "pkey": list(r.pkeys),
                "traffic_class": list(r.traffic_classes),
            }
            for r in policy.rules
        ],
        "sl2vl": list(policy.sl2vl),
        "vlarb": {
            "high": [list(p) for p in policy.vlarb.high],
            "low": [list(p) for p in policy.vlarb.low],
            "high_limit": policy.vlarb.high_limit,
        },
        "dscp_to_sl": {d: sl for d, sl in policy.dscp_overrides},
    }
    return data


def diff(old: Mapping[str, object], new: Mapping[str, object]) -> dict[str, object]:
    """Top-level sections of two resolved policies that differ (a REST dry run shows them)."""
    return {
        key: {"from": old.get(key), "to": new.get(key)}
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    }


__all__ = [
    "DATA_VLS",
    "DEFAULT_LEVEL",
    "DEFAULT_SL2VL",
    "NODE_TYPES",
    "MatchRule",
    "PortGroup",
    "QosError",
    "QosLevel",
    "QosPolicy",
    "QueuePlan",
    "QueueSpec",
    "VlArbitration",
    "default_policy",
    "diff",
    "dscp_to_sl",
    "group_members",
    "match_level",
    "policy_data",
    "queue_plan",
    "resolve",
    "sl_to_dscp",
    "sl_to_pcp",
    "validate_policy",
]
