"""Degraded fabrics: the same fabric with some links and switches failed, chosen reproducibly.

Used to test that engines keep every host reachable when the fabric is not pristine, and by the CLI to try a
policy against failures.  What the subnet manager sees after a failure is the part of the fabric still
connected to it, so hosts cut off with their switch disappear too, as they would from an SM's sweep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from topologies.model import Fabric


@dataclass(frozen=True)
class Degradation:
    fabric: Fabric
    failed_links: tuple[str, ...]
    failed_switches: tuple[str, ...]
    lost_hosts: tuple[str, ...]


def degrade(fabric: Fabric, fail_links: int = 0, fail_switches: int = 0, seed: int = 0) -> Degradation:
    """Fail `fail_links` random switch-to-switch links and `fail_switches` random non-leaf switches."""
    if fail_links < 0 or fail_switches < 0:
        raise ValueError("failure counts must be >= 0")
    rng = random.Random(seed)
    leaves: set[str] = set()
    for link in fabric.links:
        a, b = fabric.nodes[link.a.node], fabric.nodes[link.b.node]
        if a.is_switch and b.is_host:
            leaves.add(a.name)
        if b.is_switch and a.is_host:
            leaves.add(b.name)
    inner = [s.name for s in fabric.switches if s.name not in leaves]
    if fail_switches > len(inner):
        raise ValueError(f"cannot fail {fail_switches} switches: only {len(inner)} switches without hosts")
    dead_switches = sorted(rng.sample(inner, fail_switches))
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
    return Degradation(
        fabric=result,
        failed_links=tuple(str(fabric.links[i]) for i in dead_links),
        failed_switches=tuple(dead_switches),
        lost_hosts=lost,
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


__all__ = ["Degradation", "degrade", "largest_component"]
