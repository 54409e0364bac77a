"""Degraded fabrics: the same fabric with some links and switches failed, chosen reproducibly.

Used to test that engines keep every host reachable when the fabric is not pristine, and by the CLI to try a
policy against failures.  What the subnet manager sees after a failure is the part of the fabric still
connected to it, so hosts cut off with their switch disappear too, as they would from an SM's sweep.

Switches to fail are a count of random switches without hosts (`3`), counts per tier (`core:1,agg:2`), or
names (`agg_p4_2,core3`).  Tiers come from the cabling, not from names or metadata, so they mean the same on
an imported or relabelled file: a switch's tier is its distance in switch hops from the nearest switch with
hosts (leaf 0, aggregation/spine 1, core 2, then `tier3`...).
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field

from topologies.model import Fabric

#: Tier names -> hops from the nearest switch with hosts.
TIERS = {"leaf": 0, "agg": 1, "spine": 1, "core": 2}
_TIER_ITEM = re.compile(r"^([a-z]+[0-9]*):([0-9]+)$")


@dataclass(frozen=True)
class SwitchFailures:
    """Which switches to fail: `count` random ones without hosts, `per_tier` counts, or `names`."""

    count: int = 0
    per_tier: tuple[tuple[int, int], ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> SwitchFailures:
        """`N`, `tier:N[,tier:N...]` or `name[,name...]`; ValueError saying what is wrong."""
        text = text.strip()
        if not text:
            raise ValueError("--fail-switches is empty: give a count, tier:count or switch names")
        if text.isdigit():
            return cls(count=int(text))
        items = [item.strip() for item in text.split(",")]
        if any(not item for item in items):
            raise ValueError(f"--fail-switches: an empty item in {text!r}")
        tiered = [_TIER_ITEM.match(item) for item in items]
        if all(tiered):
            counts: dict[int, int] = {}
            for match in tiered:
                assert match is not None
                tier = tier_number(match.group(1))
                counts[tier] = counts.get(tier, 0) + int(match.group(2))
            return cls(per_tier=tuple(sorted(counts.items())))
        if any(tiered) or any(":" in item for item in items):
            raise ValueError(
                f"--fail-switches {text!r}: use tier:count items (leaf, agg/spine, core, tierN) or switch "
                "names, not both"
            )
        if len(set(items)) != len(items):
            raise ValueError(f"--fail-switches: a switch named twice in {text!r}")
        return cls(names=tuple(items))

    @property
    def empty(self) -> bool:
        return not (self.count or any(n for _, n in self.per_tier) or self.names)


def tier_number(name: str) -> int:
    if name in TIERS:
        return TIERS[name]
    if name.startswith("tier") and name[4:].isdigit():
        return int(name[4:])
    raise ValueError(f"--fail-switches: unknown tier {name!r} (leaf, agg, spine, core or tierN)")


def tier_name(tier: int) -> str:
    return {0: "leaf", 1: "agg", 2: "core"}.get(tier, f"tier{tier}")


def tier_counts_text(counts: dict[str, int]) -> str:
    """`{"agg": 1, "core": 2}` -> "1 agg, 2 core" (reports and file headers say the same)."""
    return ", ".join(f"{n} {tier}" for tier, n in sorted(counts.items()))


def switch_tiers(fabric: Fabric) -> dict[str, int]:
    """Each switch's hops from the nearest switch with hosts (switches no such switch reaches: absent)."""
    neighbours: dict[str, list[str]] = {s.name: [] for s in fabric.switches}
    tiers: dict[str, int] = {}
    for link in fabric.links:
        a, b = fabric.nodes[link.a.node], fabric.nodes[link.b.node]
        if a.is_switch and b.is_switch:
            neighbours[a.name].append(b.name)
            neighbours[b.name].append(a.name)
        elif a.is_switch and b.is_host:
            tiers[a.name] = 0
        elif b.is_switch and a.is_host:
            tiers[b.name] = 0
    queue = deque(sorted(tiers))
    while queue:
        name = queue.popleft()
        for nxt in neighbours[name]:
            if nxt not in tiers:
                tiers[nxt] = tiers[name] + 1
                queue.append(nxt)
    return tiers


@dataclass(frozen=True)
class Degradation:
    fabric: Fabric
    failed_links: tuple[str, ...]
    failed_switches: tuple[str, ...]
    lost_hosts: tuple[str, ...]
    #: Tier name -> how many of `failed_switches` were in it.
    failed_switch_tiers: dict[str, int] = field(default_factory=dict)


def _pick_switches(fabric: Fabric, failures: SwitchFailures, rng: random.Random) -> list[str]:
    tiers = switch_tiers(fabric)
    if failures.names:
        unknown = [n for n in failures.names if n not in fabric.nodes or not fabric.nodes[n].is_switch]
        if unknown:
            raise ValueError(f"--fail-switches: no switch {unknown[0]!r} in the fabric")
        return sorted(failures.names)
    if failures.per_tier:
        chosen: list[str] = []
        for tier, count in failures.per_tier:
            members = sorted(name for name, t in tiers.items() if t == tier)
            if count > len(members):
                raise ValueError(
                    f"--fail-switches: cannot fail {count} {tier_name(tier)} switches: the fabric has "
                    f"{len(members)}"
                )
            chosen += rng.sample(members, count)
        return sorted(chosen)
    inner = [s.name for s in fabric.switches if tiers.get(s.name) != 0]
    if failures.count > len(inner):
        raise ValueError(f"cannot fail {failures.count} switches: only {len(inner)} switches without hosts")
    return sorted(rng.sample(inner, failures.count))


def degrade(
    fabric: Fabric, fail_links: int = 0, fail_switches: int | SwitchFailures = 0, seed: int = 0
) -> Degradation:
    """Fail `fail_links` random switch-to-switch links and the switches `fail_switches` names (a count:
    random switches without hosts)."""
    failures = fail_switches if isinstance(fail_switches, SwitchFailures) else SwitchFailures(fail_switches)
    if fail_links < 0 or failures.count < 0:
        raise ValueError("failure counts must be >= 0")
    rng = random.Random(seed)
    dead_switches = _pick_switches(fabric, failures, rng)
    switch_links = [
        index
        for index, link in enumerate(fabric.links)
        if fabric.nodes[link.a.node].is_switch
        and fabric.nodes[link.b.node].is_switch
        and link.a.node not in dead_switches
        and link.b.node not in dead_switches
    ]
    if fail_links > len(switch_links):
        raise ValueError(
            f"cannot fail {fail_links} links: only {len(switch_links)} switch-to-switch links left"
        )
    dead_links = sorted(rng.sample(switch_links, fail_links))
    reduced = fabric.without(links=dead_links, nodes=dead_switches)
    kept = largest_component(reduced)
    lost = tuple(sorted(n.name for n in reduced.hosts if n.name not in kept))
    stray = [name for name in reduced.nodes if name not in kept]
    result = reduced.without(nodes=stray) if stray else reduced
    tiers = switch_tiers(fabric)
    per_tier: dict[str, int] = {}
    for name in dead_switches:
        tier = tier_name(tiers[name]) if name in tiers else "unattached"
        per_tier[tier] = per_tier.get(tier, 0) + 1
    return Degradation(
        fabric=result,
        failed_links=tuple(str(fabric.links[i]) for i in dead_links),
        failed_switches=tuple(dead_switches),
        lost_hosts=lost,
        failed_switch_tiers=per_tier,
    )


def largest_component(fabric: Fabric) -> set[str]:
    """Names in the connected part with the most hosts: what a subnet manager there can still reach."""
    adjacency: dict[str, list[str]] = {name: [] for name in fabric.nodes}
    for link in fabric.links:
        adjacency[link.a.node].append(link.b.node)
        adjacency[link.b.node].append(link.a.node)
    best: set[str] = set()
    best_hosts = -1
    seen: set[str] = set()
    for start in fabric.nodes:
        if start in seen:
            continue
        part = {start}
        stack = [start]
        while stack:
            for nxt in adjacency[stack.pop()]:
                if nxt not in part:
                    part.add(nxt)
                    stack.append(nxt)
        seen |= part
        hosts = sum(1 for name in part if fabric.nodes[name].is_host)
        if hosts > best_hosts:
            best, best_hosts = part, hosts
    return best


__all__ = [
    "TIERS",
    "Degradation",
    "SwitchFailures",
    "degrade",
    "largest_component",
    "switch_tiers",
    "tier_counts_text",
    "tier_name",
    "tier_number",
]
