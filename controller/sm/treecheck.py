"""Is this fabric a (possibly degraded) fat-tree?  One clear reason when it is not.

ftree's promises (congestion-free shifts, one VL, minimal changes on failures) rest on a layered tree: hosts
only on the bottom tier, every cable between adjacent tiers.  Tiers come from the cabling as in
`hostorder`: roots are the switches farthest from any host-attached switch, a switch's rank its distance
from the nearest root.  k-ary n-trees, leaf-spine (oversubscribed or with parallel cables) and rail fabrics
are bipartite by tier with every leaf on the same side, so removing links or whole switches keeps every
leaf's rank even (or every leaf's odd) and never puts two adjacent switches on the same rank — however
badly degraded, a tree passes (ranks may grow; ftree then falls back to a single root), whereas these do not:

* a cable between two switches that both have hosts (two leaves cabled together, or a host on a spine);
* hosts on switches whose ranks differ by an odd number (unequal tiers: one pod a level shorter);
* a cable between two switches of the same rank (a cross-link inside a tier).

Like OpenSM's ftree (which refuses such fabrics and falls back to minhop), the caller refuses or falls
back; the general engines (`sssp`, `dfsssp`) route any topology.
"""

from __future__ import annotations

import numpy as np

from controller.sm.hostorder import tree_ranks
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
    rank = tree_ranks(subnet)
    leaf_ranks = np.unique(rank[leaf])
    odd = leaf_ranks % 2 == 1
    if odd.any() and not odd.all():
        low, high = int(leaf_ranks[~odd][0]), int(leaf_ranks[odd][0])
        a = int(np.flatnonzero(leaf & (rank == low))[0])
        b = int(np.flatnonzero(leaf & (rank == high))[0])
        return (
            f"unequal tiers: host {_a_host_on(subnet, a)}'s switch {subnet.switch_names[a]} is {low} hop(s) "
            f"below the top tier, host {_a_host_on(subnet, b)}'s switch {subnet.switch_names[b]} {high}"
        )
    same = valid & (rank[far] == rank[:, None])
    if same.any():
        s, p = (int(x[0]) for x in np.nonzero(same))
        return f"{_link(subnet, s, p)} connects two switches of the same tier ({int(rank[s])} below the top)"
    return None


__all__ = ["tree_problem"]
