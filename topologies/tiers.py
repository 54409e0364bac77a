"""Tiers of a fabric, for people: which row a node is drawn in and what a link connects ("leaf-spine").

Metrics labels, the live view and the reports group ports and links by tier, so they must agree on one
answer.  Generated fabrics declare switch tiers (0 = leaf); imported ones (ibnetdiscover) do not, so a
switch's level is then its hop distance from the nearest host.  Routing never reads any of this.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

from topologies.model import Fabric, Link


@dataclass(frozen=True)
class Tiers:
    """Level of every node (hosts 0, leaves 1, ...) and a name for each level."""

    fabric: Fabric

    @cached_property
    def level(self) -> dict[str, int]:
        fabric = self.fabric
        declared = all(n.tier is not None for n in fabric.switches)
        if declared:
            levels = {n.name: (0 if n.is_host else int(n.tier or 0) + 1) for n in fabric.nodes.values()}
        else:
            levels = _hop_levels(fabric)
        return levels

    @cached_property
    def top(self) -> int:
        return max(self.level.values(), default=0)

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Name of each level, bottom up: host, leaf, spine (2 switch tiers) / aggregation, core (3)."""
        switch_levels = self.top
        if switch_levels <= 0:
            return ("host",)
        if switch_levels == 1:
            return ("host", "switch")
        if switch_levels == 2:
            return ("host", "leaf", "spine")
        middle = tuple(f"tier{i}" for i in range(2, switch_levels))
        if switch_levels == 3:
            middle = ("aggregation",)
        return ("host", "leaf", *middle, "core")

    def of(self, node: str) -> str:
        """The tier name of a node."""
        return self.names[self.level[node]]

    def of_link(self, link: Link) -> str:
        """Lower tier first: "host-leaf", "leaf-spine", "aggregation-core"."""
        ends = sorted((self.level[link.a.node], self.level[link.b.node]))
        return f"{self.names[ends[0]]}-{self.names[ends[1]]}"

    def link_tiers(self) -> tuple[str, ...]:
        """Every link tier of the fabric, bottom up."""
        seen = {self.of_link(link): tuple(sorted((self.level[link.a.node], self.level[link.b.node])))
                for link in self.fabric.links}  # fmt: skip
        return tuple(sorted(seen, key=lambda name: seen[name]))


def _hop_levels(fabric: Fabric) -> dict[str, int]:
    """Hosts 0; a switch is one more than its nearest host (switches no host reaches: one above the rest)."""
    levels = {h.name: 0 for h in fabric.hosts}
    queue = deque(levels)
    neighbours: dict[str, list[str]] = {}
    for link in fabric.links:
        neighbours.setdefault(link.a.node, []).append(link.b.node)
        neighbours.setdefault(link.b.node, []).append(link.a.node)
    while queue:
        node = queue.popleft()
        for far in neighbours.get(node, ()):
            if far not in levels:
                levels[far] = levels[node] + 1
                queue.append(far)
    unreached = max(levels.values(), default=0) + 1
    return {n: levels.get(n, unreached) for n in fabric.nodes}


__all__ = ["Tiers"]
