"""The order of hosts (CAs) that shift permutations and fat-tree routing number destinations by.

OpenSM's ftree numbers compute nodes leaf by leaf — leaf switches in the order of its tree indexing, the
CAs of a leaf in the order of the leaf's ports — writes that order to `opensm-ftree-ca-order.dump`, and
spreads destinations over up-links by that number.  A shift permutation (host i -> host i+s) is only
congestion-free in the order the routing numbered hosts by, so fabriclab uses one order for both, computed
from the cabling alone:

* tiers as in `orientation`: roots are the switches farthest from any host-attached switch, a switch's rank
  is its distance from the nearest root, an up-link leads to a smaller rank;
* switch positions top-down: roots by GUID, then each rank in groups — switches sharing a parent, directly
  or through other members (a pod's leaves, a plane's aggregation switches) — ordered by the group's first
  parent, and by GUID inside a group, so the switches under one parent are contiguous;
* leaves (switches with hosts) by position, hosts of a leaf by leaf port number.

This is the order OpenSM's indexing produces on OpenSM's own fabrics (`tests/data/opensm-ft3-k4`,
`opensm-ft3-k16`: there it is also the LID order), it does not depend on names, node order, cable order or
(apart from parallel cables) port numbers, and a failed link does not reorder it: a leaf that loses the
cable to its first parent stays in its pod's group (ordering each switch by its own first parent moved it
behind its pod's other leaves, renumbering 640 hosts of OpenSM-layout k=16 and changing 11,101 entries,
where a cut of any other uplink changes 565).  `slot` pads every leaf to
the largest number of hosts on a leaf (OpenSM's "dummy" CAs), so a leaf that loses a host does not shift the
numbers of all the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controller.sm.paths import multi_source_distances
from controller.sm.subnet import I32, I64, Bool, Subnet


def top_tier(subnet: Subnet) -> Bool:
    """Switches farthest from any host-attached switch (the roots of a tree)."""
    leaf_dist = multi_source_distances(subnet, subnet.has_hosts)
    top: Bool = leaf_dist == leaf_dist.max(initial=0)
    return top


def tree_ranks(subnet: Subnet, roots: Bool | None = None) -> I32:
    """Hop distance of every switch from the nearest root (the top tier unless `roots` is given)."""
    return multi_source_distances(subnet, top_tier(subnet) if roots is None else roots)


def up_ports(subnet: Subnet, rank: I32) -> Bool:
    """up[s, p]: port p of switch s leads to a switch of smaller rank."""
    valid = subnet.nbr >= 0
    far = np.where(valid, subnet.nbr, 0)
    result: Bool = valid & (rank[far] < rank[:, None])
    return result


def switch_positions(subnet: Subnet, rank: I32, up: Bool) -> I64:
    """Top-down order of switches: roots by GUID, then each rank by (its group's first parent, GUID),
    where a group is the switches of a rank linked by shared parents (see `_parent_groups`)."""
    n = subnet.n_switches
    pos = np.full(n, n, dtype=np.int64)
    far = np.where(subnet.nbr >= 0, subnet.nbr, n)
    next_pos = 0
    for r in range(int(rank.max(initial=0)) + 1):
        members = np.flatnonzero(rank == r)
        if r == 0:
            key = np.zeros(members.size, dtype=np.int64)
        else:
            parents = np.where(up[members], far[members], n)
            key = _group_first_parent(parents, np.append(pos, n), n)
        order = members[np.lexsort((subnet.switch_guids[members], key))]
        pos[order] = np.arange(next_pos, next_pos + order.size)
        next_pos += order.size
    unranked = np.flatnonzero(pos == n)  # not connected to a root: last, by GUID
    if unranked.size:
        order = unranked[np.argsort(subnet.switch_guids[unranked], kind="stable")]
        pos[order] = np.arange(next_pos, next_pos + order.size)
    return pos


def _group_labels(parents: I64, none: int) -> I64:
    """Per member (row of `parents`: the switch indices of its parents, `none` padding): a label shared by
    the members connected through shared parents — the smallest member index, spread over parents and
    back until nothing changes (a pod's leaves share every aggregation switch: one round)."""
    m, width = parents.shape
    label = np.arange(m, dtype=np.int64)
    flat = parents.ravel()
    while True:
        lowest = np.full(none + 1, m, dtype=np.int64)
        np.minimum.at(lowest, flat, np.repeat(label, width))
        lowest[none] = m
        grown = np.minimum(label, lowest[parents].min(axis=1, initial=m))
        if (grown == label).all():
            return label
        label = grown


def _group_first_parent(parents: I64, padded_pos: I64, none: int) -> I64:
    """Per member: the smallest parent position in its group (`none` if a member has no parent)."""
    label = _group_labels(parents, none)
    first = padded_pos[parents].min(axis=1, initial=none)
    group_first = np.full(parents.shape[0], none, dtype=np.int64)
    np.minimum.at(group_first, label, first)
    result: I64 = group_first[label]
    return result


def uplink_slots(subnet: Subnet, rank: I32, up: Bool, pos: I64) -> tuple[I64, I64]:
    """(slot[s, p]: which of its group's uplinks port p of switch s is, -1 if not an uplink; per switch,
    how many uplinks its group has).

    A group's uplinks are the (parent, k-th parallel cable) pairs of all its members, in parent position
    order; in an intact fat-tree every leaf of a pod has all of them, so the slot is the uplink's index.
    When a switch loses an uplink its others keep their slots — the index among the uplinks left would
    shift every uplink after the lost one, and with it the routes that never used the lost cable."""
    n, width = subnet.n_switches, subnet.n_ports
    far = np.where(subnet.nbr >= 0, subnet.nbr, n)
    padded = np.append(pos, n)
    slots = np.full((n, width), -1, dtype=np.int64)
    group_uplinks = np.zeros(n, dtype=np.int64)
    # a tier at a time: each uplink's key is (its parent's position, which parallel cable to that parent
    # it is), numbered among its group's keys (a loop over switches was ~3 ms of a k=16 routing)
    span = (n + 1) * (width + 1)
    for r in range(1, int(rank.max(initial=0)) + 1):
        members = np.flatnonzero(rank == r)
        if members.size == 0:
            continue
        parents = np.where(up[members], far[members], n)
        label = _group_labels(parents, n)
        row, port = np.nonzero(up[members])
        parent_pos = padded[far[members[row], port]]
        order = np.lexsort((port, parent_pos, row))
        row, port, parent_pos = row[order], port[order], parent_pos[order]
        index = np.arange(row.size)
        new_run = np.r_[True, (row[1:] != row[:-1]) | (parent_pos[1:] != parent_pos[:-1])]
        parallel = index - np.maximum.accumulate(np.where(new_run, index, 0))
        key = label[row] * span + parent_pos * (width + 1) + parallel
        distinct, slot = np.unique(key, return_inverse=True)
        group = distinct // span
        slot = slot.reshape(-1)
        slots[members[row], port] = slot - np.searchsorted(group, group)[slot]
        group_uplinks[members] = np.bincount(group, minlength=members.size)[label]
    return slots, group_uplinks


@dataclass(frozen=True)
class HostOrder:
    #: Endpoint indices (into `Subnet.endpoints`) in CA order.
    order: I64
    #: Per endpoint: leaf index * `per_leaf` + index among the leaf's hosts (the padded CA number).
    slot: I64
    #: The largest number of hosts on one leaf.
    per_leaf: int
    #: Per switch, its position (see `switch_positions`).
    position: I64
    #: Leaves (switches with hosts) in order.
    leaves: I64

    def lids(self, subnet: Subnet) -> I32:
        """LIDs of the hosts in CA order."""
        lids: I32 = subnet.ep_lids[self.order]
        return lids


def host_order(subnet: Subnet) -> HostOrder:
    rank = tree_ranks(subnet)
    position = switch_positions(subnet, rank, up_ports(subnet, rank))
    n_ep = int(subnet.ep_lids.size)
    if n_ep == 0:
        empty = np.zeros(0, dtype=np.int64)
        return HostOrder(empty, empty, 0, position, empty)
    leaves = np.flatnonzero(subnet.has_hosts)
    leaves = leaves[np.argsort(position[leaves], kind="stable")]
    leaf_index = np.full(subnet.n_switches, -1, dtype=np.int64)
    leaf_index[leaves] = np.arange(leaves.size)
    ep_leaf = leaf_index[subnet.ep_switch]
    order = np.lexsort((subnet.ep_switch_port, ep_leaf)).astype(np.int64)
    first = np.searchsorted(ep_leaf[order], np.arange(leaves.size))
    within = np.empty(n_ep, dtype=np.int64)
    within[order] = np.arange(n_ep) - first[ep_leaf[order]]
    per_leaf = int(subnet.hosts_per_switch.max(initial=0))
    return HostOrder(order, ep_leaf * per_leaf + within, per_leaf, position, leaves)


def format_ca_order(subnet: Subnet, order: HostOrder | None = None) -> str:
    """`opensm-ftree-ca-order.dump`: `0xLID<TAB>node description` per CA in order, and `0xFFFF<TAB>DUMMY`
    for the missing hosts of leaves with fewer than the most, as OpenSM writes it."""
    order = order or host_order(subnet)
    nodes = subnet.fabric.nodes
    out: list[str] = []
    ep_leaf = order.slot // max(order.per_leaf, 1)
    counts = np.bincount(ep_leaf, minlength=order.leaves.size)
    cursor = 0
    for leaf in range(order.leaves.size):
        for ep in order.order[cursor : cursor + int(counts[leaf])].tolist():
            endpoint = subnet.endpoints[ep]
            out.append(f"0x{int(subnet.ep_lids[ep]):04x}\t{nodes[endpoint.node].node_description}\n")
        cursor += int(counts[leaf])
        out.extend("0xFFFF\tDUMMY\n" for _ in range(order.per_leaf - int(counts[leaf])))
    return "".join(out)


__all__ = [
    "HostOrder",
    "format_ca_order",
    "host_order",
    "switch_positions",
    "top_tier",
    "tree_ranks",
    "up_ports",
    "uplink_slots",
]
