"""Seeded random walks of cable cuts, restores and whole-switch losses over a fabric: the `ports_down` maps
a controller would see, one per step.  Shared by the incremental-routing and incremental-compile tests."""

from __future__ import annotations

import random
from collections.abc import Iterator

from topologies.model import Fabric, PortRef


def switch_links(fabric: Fabric) -> list[int]:
    return [
        i
        for i, link in enumerate(fabric.links)
        if fabric.nodes[link.a.node].is_switch and fabric.nodes[link.b.node].is_switch
    ]


def hostless_switches(fabric: Fabric) -> list[str]:
    """Switches with no host attached (aggregation, core, spine): the ones whose loss strands no host."""
    edge = {
        end.node
        for lk in fabric.links
        for end, other in ((lk.a, lk.b), (lk.b, lk.a))
        if fabric.nodes[other.node].is_host
    }
    return sorted(s.name for s in fabric.switches if s.name not in edge)


def walk(fabric: Fabric, seed: int, steps: int) -> Iterator[tuple[str, dict[PortRef, float]]]:
    """(what happened, ports down after it) for `steps` random steps: a quarter lose or regain a whole
    host-less switch (all its cables at once, as when it dies), the rest cut a random switch-to-switch
    cable or, with cables down, restore one of them."""
    rnd = random.Random(seed)
    links = switch_links(fabric)
    spines = hostless_switches(fabric)
    down: dict[PortRef, float] = {}
    for step in range(steps):
        cut = [i for i in links if fabric.links[i].a in down]
        if rnd.random() < 0.25:
            name = rnd.choice(spines)
            theirs = [
                fabric.links[i] for i in links if name in (fabric.links[i].a.node, fabric.links[i].b.node)
            ]
            if any(lk.a in down for lk in theirs):
                what = f"switch {name} back"
                for lk in theirs:
                    down.pop(lk.a, None)
                    down.pop(lk.b, None)
            else:
                what = f"switch {name} lost"
                for lk in theirs:
                    down[lk.a] = down[lk.b] = float(step)
        elif cut and rnd.random() < 0.4:
            link = fabric.links[rnd.choice(cut)]
            what = f"restore {link}"
            down.pop(link.a)
            down.pop(link.b)
        else:
            link = fabric.links[rnd.choice(links)]
            what = f"cut {link}"
            down[link.a] = down[link.b] = float(step)
        yield what, dict(down)
