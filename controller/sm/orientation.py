"""Tree levels inferred from the cabling, and the up/down orientation of links built on them.

Engines get no tiers from the topology file (an imported fabric has none).  Like OpenSM's ftree they infer:
leaves are switches with hosts; roots are the switches farthest from any leaf (the top tier); a switch's rank
is its hop distance from the nearest root.  A link goes *up* towards a smaller rank.

Links between switches of equal rank are either left out (`ftree`: a fat-tree has none, and using them would
break the congestion-freedom argument) or oriented by GUID (`updn`, as in Autonet: any total order keeps
up*/down* routes deadlock-free).

Several roots give balanced trees but do not guarantee that every leaf can reach every other leaf by an
up*/down* route on an arbitrary or badly degraded fabric.  When they do not, the orientation falls back to a
single root — the fabric's centre — which always does (every switch goes up its BFS-tree path to the root
and the root reaches everything going down), and says so in `fallback`.  (Pairs of switches without hosts,
such as two roots, never have an up*/down* route with several roots; see `paths.UpDownCandidates`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from controller.sm.hostorder import top_tier
from controller.sm.paths import UpDown, hop_distances, multi_source_distances, updown
from controller.sm.subnet import I32, INF, U8, Bool, Subnet

Horizontal = Literal["exclude", "guid"]


@dataclass(frozen=True)
class Orientation:
    rank: I32
    roots: tuple[int, ...]
    ud: UpDown
    fallback: str | None
    #: Unrestricted hop distances, to complete switch pairs that have no up*/down* route.
    hops: U8

    def describe(self, subnet: Subnet) -> dict[str, object]:
        names = [subnet.switch_names[r] for r in self.roots]
        return {
            "roots": names if len(names) <= 16 else [*names[:16], f"... ({len(names)} roots)"],
            "levels": int(self.rank.max(initial=0)) + 1,
            "fallback": self.fallback,
        }


def _directions(subnet: Subnet, rank: I32, horizontal: Horizontal) -> tuple[Bool, Bool]:
    nbr = subnet.nbr
    valid = nbr >= 0
    far = np.where(valid, nbr, 0)
    if horizontal == "exclude":
        key = rank.astype(np.int64)
    else:
        # Total order (rank, GUID): position in the sorted order is the key.
        order = np.lexsort((subnet.switch_guids, rank))
        key = np.empty(subnet.n_switches, dtype=np.int64)
        key[order] = np.arange(subnet.n_switches)
    here = key[:, None]
    there = key[far]
    return valid & (there < here), valid & (there > here)


def orient(subnet: Subnet, horizontal: Horizontal, roots: Bool | None = None) -> Orientation:
    """Orientation from the top tier (or given roots); single-root fallback if leaves cannot all route."""
    chosen = top_tier(subnet) if roots is None else roots
    rank = multi_source_distances(subnet, chosen)
    up, down = _directions(subnet, rank, horizontal)
    ud = updown(subnet, up, down)
    dist = hop_distances(subnet)
    # Host traffic starts at leaves and, on legal routes, only enters switches that have a legal route on
    # (candidates exclude the others), so what must be routable is leaf -> leaf.  Every other pair without
    # a legal route (a root that lost its link to a pod, two roots) is completed with shortest paths that
    # host traffic never takes.
    leaves = subnet.has_hosts
    unreachable = int((ud.dist[np.ix_(leaves, leaves)] == INF).sum())
    if unreachable == 0:
        return Orientation(rank, tuple(int(i) for i in np.flatnonzero(chosen)), ud, None, dist)
    eccentricity = dist.max(axis=1).astype(np.int64)
    centre = int(np.lexsort((subnet.switch_guids, eccentricity))[0])
    single = np.zeros(subnet.n_switches, dtype=bool)
    single[centre] = True
    rank = multi_source_distances(subnet, single)
    up, down = _directions(subnet, rank, horizontal)
    ud = updown(subnet, up, down)
    reason = (
        f"{unreachable} leaf pairs had no up*/down* route from the top tier; "
        f"using the single root {subnet.switch_names[centre]}"
    )
    return Orientation(rank, (centre,), ud, reason, dist)


__all__ = ["Horizontal", "Orientation", "orient", "top_tier"]
