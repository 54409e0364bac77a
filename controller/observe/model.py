"""What every view of the fabric shares: link names, tiers, positions by tier, and link utilisation.

Pure functions of the declared fabric and of one published snapshot.  Utilisation is the difference of the
last two port-counter polls (both are in the snapshot), per link direction, as a share of the link's
capacity — the declared speed, or the emulated speed when the fabric runs scaled (`capacity_scale`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from controller.published import PortCounters, PortStats
from topologies.model import Fabric, Link, PortRef
from topologies.scale import Scale
from topologies.tiers import Tiers

#: Fabrics with more nodes than this start with their pods (or host groups) collapsed in the live view.
COLLAPSE_ABOVE_NODES = 400


def link_key(link: Link) -> str:
    """`a:port-b:port`, in declared order: the name of a link in metrics labels and on the page."""
    return f"{link.a}-{link.b}"


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _num(value: int | None) -> int:
    return -1 if value is None else value


@dataclass(frozen=True)
class Placement:
    level: int
    x: float
    group: str | None


@dataclass(frozen=True)
class Group:
    """Nodes the page may draw as one box (a pod; hosts of one leaf where there are no pods)."""

    name: str
    label: str
    members: tuple[str, ...]
    x0: float
    x1: float
    level_min: int
    level_max: int


@dataclass(frozen=True)
class Layout:
    """Rows by tier (hosts at the bottom), order within a row by pod, rail and name; rails side by side."""

    fabric: Fabric

    @cached_property
    def tiers(self) -> Tiers:
        return Tiers(self.fabric)

    @cached_property
    def rail_optimised(self) -> bool:
        return any(n.rail is not None for n in self.fabric.switches)

    def _switch_key(self, name: str) -> tuple[object, ...]:
        node = self.fabric.nodes[name]
        if self.rail_optimised:  # every group's leaf of rail i next to each other, rail after rail
            return (_num(node.rail), _num(node.group), _num(node.pod), _natural(name))
        return (_num(node.pod), _num(node.group), _num(node.rail), _natural(name))

    @cached_property
    def rows(self) -> dict[int, list[str]]:
        level = self.tiers.level
        rows: dict[int, list[str]] = {}
        for node in self.fabric.switches:
            rows.setdefault(level[node.name], []).append(node.name)
        for names in rows.values():
            names.sort(key=self._switch_key)
        order = {name: i for names in rows.values() for i, name in enumerate(names)}
        hosts = []
        for host in self.fabric.hosts:  # under the switch they hang off, in port order
            ports = sorted(ref.port for ref in self.fabric.port_map if ref.node == host.name)
            peer = self.fabric.peer(host.name, ports[0]) if ports else None
            anchor = (order.get(peer.node, 1 << 30), peer.port) if peer else (1 << 30, 0)
            hosts.append((anchor, _natural(host.name), host.name))
        if hosts:
            rows[0] = [name for *_, name in sorted(hosts)]
        return dict(sorted(rows.items()))

    @cached_property
    def groups_of(self) -> dict[str, str]:
        """Collapse groups: pods where the fabric has them, else the hosts of each leaf."""
        fabric = self.fabric
        result: dict[str, str] = {}
        if any(n.pod is not None for n in fabric.switches):
            for node in fabric.nodes.values():
                if node.pod is not None:
                    result[node.name] = f"pod{node.pod}"
            return result
        for host in fabric.hosts:
            ports = sorted(ref.port for ref in fabric.port_map if ref.node == host.name)
            peer = fabric.peer(host.name, ports[0]) if ports else None
            if peer is not None and fabric.nodes[peer.node].is_switch:
                result[host.name] = f"hosts@{peer.node}"
        return result

    @cached_property
    def placements(self) -> dict[str, Placement]:
        """x in [0, 1] per row: evenly spaced, with a gap where the pod or rail changes."""
        groups = self.groups_of
        result: dict[str, Placement] = {}
        for level, names in self.rows.items():
            slots: list[float] = []
            position = 0.0
            previous: object = None
            for name in names:
                node = self.fabric.nodes[name]
                block = node.rail if self.rail_optimised else (node.pod if node.pod is not None else None)
                if slots and block != previous:
                    position += 0.75
                slots.append(position)
                position += 1.0
                previous = block
            span = max(position, 1.0)
            for name, slot in zip(names, slots, strict=True):
                result[name] = Placement(level, (slot + 0.5) / span, groups.get(name))
        return result

    @cached_property
    def groups(self) -> tuple[Group, ...]:
        members: dict[str, list[str]] = {}
        for name, group in self.groups_of.items():
            members.setdefault(group, []).append(name)
        result = []
        for group, names in members.items():
            places = [self.placements[n] for n in names]
            counts: dict[str, int] = {}
            for name in names:
                tier = self.tiers.of(name)
                counts[tier] = counts.get(tier, 0) + 1
            label = ", ".join(f"{n} {_plural(t, n)}" for t, n in counts.items())
            result.append(
                Group(
                    name=group,
                    label=f"{group}: {label}",
                    members=tuple(names),
                    x0=min(p.x for p in places),
                    x1=max(p.x for p in places),
                    level_min=min(p.level for p in places),
                    level_max=max(p.level for p in places),
                )
            )
        return tuple(sorted(result, key=lambda g: (g.x0, g.name)))


def _plural(word: str, n: int) -> str:
    if n == 1:
        return word
    return word[:-1] + "ves" if word.endswith("f") else word + "s"


def capacity_factor(scale: Scale | None) -> float:
    """Emulated speed / declared speed (1 for a real fabric)."""
    return 1.0 if scale is None else scale.emulated_gbps / scale.real_gbps


def _direction_bytes(
    counters: Mapping[tuple[str, int], PortCounters], fabric: Fabric, src: PortRef, dst: PortRef
) -> int | None:
    """Bytes sent from `src` towards `dst`: the sender's transmit counter, or (a host sending) what the
    switch at the far end received."""
    if fabric.nodes[src.node].is_switch:
        c = counters.get((src.node, src.port))
        return c.tx_bytes if c is not None else None
    c = counters.get((dst.node, dst.port))
    return c.rx_bytes if c is not None else None


def link_utilisation(
    fabric: Fabric, previous: PortStats | None, current: PortStats | None, factor: float = 1.0
) -> list[tuple[float | None, float | None]] | None:
    """Per declared link: (a→b, b→a) share of capacity over the last polling interval; None where a
    counter is missing; None overall before two polls exist.  Counter resets count as no traffic."""
    if previous is None or current is None or current.at <= previous.at:
        return None
    dt = current.at - previous.at
    result: list[tuple[float | None, float | None]] = []
    for link in fabric.links:
        capacity_bps = link.bw_gbps * 1e9 * factor
        pair: list[float | None] = []
        for src, dst in ((link.a, link.b), (link.b, link.a)):
            before = _direction_bytes(previous.counters, fabric, src, dst)
            after = _direction_bytes(current.counters, fabric, src, dst)
            if before is None or after is None or capacity_bps <= 0:
                pair.append(None)
            else:
                pair.append(max(0, after - before) * 8.0 / dt / capacity_bps)
        result.append((pair[0], pair[1]))
    return result


def per_mille(values: Sequence[tuple[float | None, float | None]]) -> list[int]:
    """Flattened [a→b, b→a, ...] in thousandths of capacity (-1: unknown), compact for the page."""
    out: list[int] = []
    for pair in values:
        for v in pair:
            out.append(-1 if v is None else min(99_999, round(v * 1000)))
    return out


__all__ = [
    "COLLAPSE_ABOVE_NODES",
    "Group",
    "Layout",
    "Placement",
    "capacity_factor",
    "link_key",
    "link_utilisation",
    "per_mille",
]
