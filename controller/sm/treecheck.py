"""Is this fabric a (possibly degraded) fat-tree?  One clear reason when it is not.

ftree's promises (congestion-free shifts, one VL, minimal changes on failures) rest on a layered tree: hosts
only on the bottom tier, every cable between adjacent tiers.  Tiers come from the cabling as in
`hostorder`: roots are the switches farthest from any host-attached switch, a switch's rank its distance
from the nearest root.  k-ary n-trees, leaf-spine (oversubscribed or with parallel cables) and rail fabrics
are bipartite — tiers alternate between two sides — with every leaf on the same side, and removing links or
whole switches keeps them so: however badly degraded, a tree passes (ranks may grow; ftree then falls back
to a single root), whereas these do not:

* a cable between two switches that both have hosts (two leaves cabled together, or a host on a spine);
* a cable that closes an odd cycle, i.e. joins two switches of the same tier (a cross-link inside a tier);
* leaves an odd number of hops apart (unequal tiers: one pod a level shorter than another).

Like OpenSM's ftree (which refuses such fabrics and falls back to minhop), the caller refuses or falls
back; the general engines (`sssp`, `dfsssp`) route any topology.
"""

from __future__ import annotations

import numpy as np

from controller.sm.hostorder import tree_ranks
from controller.sm.paths import multi_source_distances
from controller.sm.subnet import Subnet


def _link(subnet: Subnet, s: int, p: int) -> str:
    far = int(subnet.nbr[s, p])
    return f"{subnet.switch_names[s]}:{p}--{subnet.switch_names[far]}:{int(subnet.nbr_port[s, p])}"


def _a_host_on(subnet: Subnet, s: int) -> str:
    ep = int(np.flatnonzero(subnet.ep_switch == s)[0])
    return subnet.endpoints[ep].node


def tree_problem(subnet: Subnet) -> str | None:
    """None for a fat-tree (intact or degraded), else a one-line reason naming the offending cable/switch."""
    if subnet.ep_lids.size == 0:
        return "the fabric has no hosts"
    if subnet.n_switches == 0:
        return "the fabric has no switches"
    nbr = subnet.nbr
    valid = nbr >= 0
    far = np.where(valid, nbr, 0)
    leaf = subnet.has_hosts
    both = valid & leaf[:, None] & leaf[far]
    if both.any():
        counts = both.sum(axis=1)
        s = int(np.lexsort((subnet.switch_guids, -counts))[0])
        if counts[s] > 1:
            return (
                f"host {_a_host_on(subnet, s)} is on switch {subnet.switch_names[s]}, which is cabled to "
                f"{int(counts[s])} other switches with hosts: hosts must all hang off the bottom tier"
            )
        p = int(np.flatnonzero(both[s])[0])
        return f"{_link(subnet, s, p)} is a cable between two switches with hosts (leaves)"
    # A tree's switches split into two sides (tiers alternate) with every leaf on the same side; removing
    # links or switches keeps it so.  Parity of the distance from one leaf tells the sides apart.
    first = int(np.flatnonzero(leaf)[0])
    start = np.zeros(subnet.n_switches, dtype=bool)
    start[first] = True
    side = multi_source_distances(subnet, start) % 2
    rank = tree_ranks(subnet)
    same = valid & (side[far] == side[:, None])
    if same.any():
        level = valid & (rank[far] == rank[:, None])
        s, p = (int(x[0]) for x in np.nonzero(level if level.any() else same))
        return f"{_link(subnet, s, p)} connects two switches of the same tier ({int(rank[s])} below the top)"
    odd = leaf & (side == 1)
    if odd.any():
        b = int(np.flatnonzero(odd)[0])
        start[:] = False
        start[b] = True
        apart = int(multi_source_distances(subnet, start)[first])
        return (
            f"unequal tiers: the leaves {subnet.switch_names[first]} (host {_a_host_on(subnet, first)}) and "
            f"{subnet.switch_names[b]} (host {_a_host_on(subnet, b)}) are {apart} hops apart, an odd number: "
            "hosts must all be on one tier"
        )
    return None


__all__ = ["tree_problem"]
