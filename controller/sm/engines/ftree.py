"""ftree: fat-tree routing, congestion-free for shift permutations, robust to missing links and switches.

The idea is OpenSM's ftree / D-mod-k (Zahavi et al.): destinations are numbered leaf by leaf; at every level
a switch spreads destinations over its up ports by successive "digits" of that number, so the k/2 hosts of a
leaf sending to k/2 consecutive destinations never share an uplink, and every destination is reached through
exactly one top switch.  For a shift permutation (host i -> host i+s) that means at most one flow per link.

What makes it work on real fabrics, not just generated ones:

* Levels come from the cabling (see `orientation`): leaves are switches with hosts, roots the top tier.  A
  fabric that is not a tree (two leaves cabled together, a host on a spine, unequal tiers, a cross-link
  inside a tier; see `treecheck`) is reported by `problem()`, and callers refuse it or fall back
  (`select_engine`); `route()` itself still gives deadlock-free tables there through a single root.
* Destinations are numbered in CA order (`hostorder`): leaves in tree order — a pod's leaves contiguous —
  and hosts by leaf port, OpenSM's `opensm-ftree-ca-order.dump` convention.  Numbering by LID (GUID order)
  instead only works where GUIDs happen to follow the tree: on OpenSM's own k=16 fabric it loaded the
  core-to-aggregation links 4x.
* Ports are not chosen by number.  A switch's candidate ports are the up*/down* next hops that still reach
  the destination, ordered by the position of the switch at the far end; positions are assigned top-down
  (roots by GUID, each lower switch after its first parent), so "the j-th uplink" means the same plane of
  the tree on every leaf, whatever the port numbering or GUIDs.
* The digit names an uplink, taken over the uplink count the switch's tier was built with (not over the
  uplinks it has left: modulo fewer, two digits fold onto one uplink); when that uplink is gone or cannot
  reach the destination any more (links or switches missing), the next digit, offset per switch, picks
  among the uplinks that can.  Every destination stays
  reachable, balance is best effort, and only the destinations that used a failed part move — a failure
  changes few entries, which keeps incremental updates small.  A pure formula over port numbers would send
  traffic into dead ports.  When many switches lost uplinks (5 % of the cables), switches repairing alone
  pile onto the same survivors; the repaired entries are then chosen again by measured load
  (`ftree_balance`).
* Parallel links are candidates like any others, and descending routes pick the parallel link with the
  same digit as the ascending one, so flows stay spread over them.

Everything is computed for blocks of switches over all destinations with numpy; no per-entry Python loop.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controller.sm.engines.base import RoutingEngine
from controller.sm.engines.candidate_reuse import first_pass
from controller.sm.engines.common import port_order
from controller.sm.engines.ftree_balance import individually_short, rebalance, wide_damage
from controller.sm.hostorder import HostOrder, host_order, switch_positions, uplink_slots
from controller.sm.orientation import Orientation, orient
from controller.sm.paths import UpDownCandidates, blocks
from controller.sm.subnet import I64, INF, NO_PORT, Bool, Subnet
from controller.sm.tables import RoutingTables, new_lft, set_local_routes
from controller.sm.treecheck import tree_problem

_DIV_CAP = 1 << 30
#: Strength of a switch that can reach the destination going down (never pruned).
_STRONG = 1 << 14


def _weak_targets(strength: npt.NDArray[np.int16], rank: npt.NDArray[np.int32]) -> npt.NDArray[np.intp]:
    """Destination switches toward which some switch has less than half the climbing candidates of the
    strongest switch of its rank (none in an intact tree: then nothing needs pruning)."""
    weak = np.zeros(strength.shape[1], dtype=bool)
    for r in np.unique(rank[rank >= 0]).tolist():
        block = strength[rank == r].astype(np.int32)
        weak |= (block.min(axis=0) * 2) < np.where(block >= _STRONG, 0, block).max(axis=0)
    return np.flatnonzero(weak).astype(np.intp)


def _without_weak_uplinks(
    mask: Bool, nbr: npt.NDArray[np.int32], strength: npt.NDArray[np.int16], n: int
) -> Bool:
    """Candidates minus up-links into switches that kept less than half the up-links their peers have
    toward the destination (an aggregation switch that lost most of its core links): the digit rule would
    send such a switch its full share of traffic through what is left.  Only where stronger candidates
    remain; a single failed link (3 of 4 left) prunes nothing, so routes stay put."""
    far = np.where(nbr >= 0, nbr, n)  # (B, P); row n of strength is _STRONG
    next_strength = strength[far].transpose(0, 2, 1)  # (B, T, P)
    best = np.where(mask, next_strength, 0).max(axis=2, keepdims=True)
    weak = mask & (next_strength.astype(np.int32) * 2 < best)
    pruned: Bool = mask & ~weak
    return pruned


def digit_divisors(subnet: Subnet, o: Orientation) -> I64:
    """div[r]: the destination number is divided by this before taking it modulo the candidate count at
    rank r — the product of the usual up-port counts of the ranks below (D-mod-k's radix)."""
    ranks = int(o.rank.max(initial=0))
    up_count = o.ud.up.sum(axis=1)
    div = np.ones(ranks + 2, dtype=np.int64)
    for r in range(ranks - 1, -1, -1):
        counts = up_count[(o.rank == r + 1) & (up_count > 0)]
        radix = 1
        if counts.size:
            values, freq = np.unique(counts, return_counts=True)
            radix = int(values[freq == freq.max()].max())
        div[r] = min(int(div[r + 1]) * radix, _DIV_CAP)
    return div


def destination_numbers(subnet: Subnet, order: HostOrder | None = None) -> I64:
    """Destination numbers: hosts by their padded CA number (see `hostorder`: leaf by leaf, leaves in tree
    order, hosts by leaf port), so shift permutations in the same order are congestion-free; switch LIDs
    after all hosts, in LID order."""
    order = order or host_order(subnet)
    n_dest = subnet.dest_lids.size
    number = np.empty(n_dest, dtype=np.int64)
    slot_of_lid = np.full(subnet.max_lid + 1, -1, dtype=np.int64)
    slot_of_lid[subnet.ep_lids] = order.slot
    is_host = subnet.dest_is_host
    number[is_host] = slot_of_lid[subnet.dest_lids[is_host]]
    base = order.per_leaf * order.leaves.size
    number[~is_host] = base + np.arange(int((~is_host).sum()))
    return number


def _candidate_tables(
    mask: Bool, descending: Bool, port_rank: npt.NDArray[np.intp], divisors: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint8], npt.NDArray[np.int32], npt.NDArray[np.int32], int]:
    """Distinct (switch, phase, candidate set) triples of a block, so per-destination work is table lookups.

    Returns uid[b, t] naming the triple of switch b toward switch t, and per triple: its candidate ports in
    the switch's preference order (`ports[u * most + i]`, NO_PORT past the end), their count and the digit
    divisor.  A switch has only a few distinct candidate sets (all uplinks, one downlink per child...).
    """
    b, t, width = mask.shape
    packed = np.packbits(mask, axis=2)
    header = np.empty((b, t, 3), dtype=np.uint8)
    header[:, :, 0] = (np.arange(b) >> 8)[:, None]
    header[:, :, 1] = (np.arange(b) & 0xFF)[:, None]
    header[:, :, 2] = descending
    rows = np.ascontiguousarray(np.concatenate([header, packed], axis=2).reshape(b * t, -1))
    nbytes = rows.shape[1]
    if nbytes <= 8:
        # each row as one big-endian integer: the same order as comparing the bytes, sorted as numbers
        # (sorting raw byte strings was a fifth of a k=16 routing)
        key = np.zeros(b * t, dtype=np.uint64)
        for i in range(nbytes):
            key = (key << np.uint64(8)) | rows[:, i]
        keys, inverse = np.unique(key, return_inverse=True)
        shifts = np.uint64(8) * np.arange(nbytes - 1, -1, -1, dtype=np.uint64)
        raw = ((keys[:, None] >> shifts[None, :]) & np.uint64(0xFF)).astype(np.uint8)
    else:
        unique, inverse = np.unique(rows.view(np.dtype((np.void, nbytes))).ravel(), return_inverse=True)
        raw = unique.view(np.uint8).reshape(-1, nbytes)
    owner = (raw[:, 0].astype(np.intp) << 8) | raw[:, 1]
    phase = raw[:, 2].astype(np.intp)
    bits = np.unpackbits(raw[:, 3:], axis=1, count=width).astype(bool)
    count = bits.sum(axis=1)
    most = max(int(count.max(initial=0)), 1)
    preference = np.where(bits, port_rank[owner], width + 1)
    ports = np.argsort(preference, axis=1, kind="stable")[:, :most].astype(np.uint8)
    ports[np.arange(most)[None, :] >= count[:, None]] = NO_PORT
    return (
        inverse.reshape(b, t).astype(np.int32),
        ports.reshape(-1),
        count.astype(np.int32),
        divisors[owner, phase].astype(np.int32),
        most,
    )


class FatTreeEngine(RoutingEngine):
    name = "ftree"
    summary = "fat-tree (D-mod-k) routing; shift-congestion-free on full fat-trees and rail fabrics"
    deadlock_free = "trees (any topology when it falls back to a single root)"

    def problem(self, subnet: Subnet) -> str | None:
        problem = tree_problem(subnet)
        return None if problem is None else f"not a fat-tree: {problem}"

    def route(self, subnet: Subnet) -> RoutingTables:
        return self._route(subnet, None)

    def route_some(self, subnet: Subnet, lids: npt.NDArray[np.integer]) -> RoutingTables:
        """Only the entries toward `lids` are chosen (each destination's entries are a formula over
        per-switch candidate tables, independent of the others'); the alternatives are whole.  A k=16
        cable cut moves ~a tenth of the destinations."""
        return self._route(subnet, np.asarray(lids, dtype=np.intp))

    def _route(self, subnet: Subnet, only: npt.NDArray[np.intp] | None) -> RoutingTables:
        o = orient(subnet, "exclude")
        pos = switch_positions(subnet, o.rank, o.ud.up)
        order = port_order(subnet, pos)
        div = digit_divisors(subnet, o)
        number = destination_numbers(subnet)
        n, width = subnet.n_switches, subnet.n_ports
        lft = new_lft(subnet)
        port_rank = np.empty_like(order)
        np.put_along_axis(port_rank, order, np.broadcast_to(np.arange(width), order.shape), axis=1)
        # Uplinks of each switch in preference order: the "j-th uplink" of the digit rule.
        n_up = o.ud.up.sum(axis=1).astype(np.int64)
        designed = designed_uplinks(n_up, o.rank)
        by_slot, group_uplinks = _uplinks_by_slot(subnet, o, pos, order, designed)
        short_alone = individually_short(n_up, group_uplinks, designed)
        wide = wide_damage(short_alone, int((n_up > 0).sum()))
        if wide:  # the rebalancing weighs every destination's flows: part of the routing is the whole's part
            only = None
        # the destination columns routed: all, or those of `only`
        cols = slice(None) if only is None else np.searchsorted(subnet.dest_lids, only)
        target_all = subnet.dest_switch.astype(np.intp)[cols]
        lids = subnet.dest_lids.astype(np.intp)[cols]
        number = number[cols]
        number32 = number.astype(np.int32)
        # the destination switches they are on (columns of the per-switch candidate tables), and each
        # destination's among them
        targets, target = np.unique(target_all, return_inverse=True)
        target = target.reshape(-1).astype(np.intp)
        leaf_target = subnet.has_hosts[None, targets]
        candidates = UpDownCandidates(subnet, o.ud, o.hops)
        # Pass 1: every switch's candidate ports (kept whole as the alternatives) and how many it has toward
        # each destination switch while climbing (its "strength"; a switch that can go down is never weak).
        # (Switches a change did not reach keep the last routing's: `candidate_reuse`.)
        alt, strength = first_pass(subnet, o, candidates, _STRONG, blocks(n, width)[0].size)
        weak_all = _weak_targets(strength[:n], o.rank)
        weak = np.flatnonzero(np.isin(targets, weak_all))  # positions among `targets`
        repaired_entries = moved_entries = 0
        moved_rows: list[npt.NDArray[np.intp]] = []
        moved_lids: list[npt.NDArray[np.intp]] = []
        for rows in blocks(n, width) if targets.size else []:  # no destinations asked for: alternatives only
            mask = np.unpackbits(alt[rows][:, targets], axis=2, count=width).astype(bool)
            if weak.size:
                mask[:, weak] = _without_weak_uplinks(
                    mask[:, weak], subnet.nbr[rows], strength[:, targets[weak]], n
                )
            rank = o.rank[rows].astype(np.intp)
            divisors = np.stack([div[rank], div[rank + 1]], axis=1)  # per row: [ascending, descending]
            descending = o.ud.down_dist[rows][:, targets] != INF
            uid, ports, count, divisor, most = _candidate_tables(mask, descending, port_rank[rows], divisors)
            u = uid[:, target]  # (B, D)
            pick = (number32[None, :] // divisor[u]) % np.maximum(count[u], 1)
            chosen = ports[u * most + pick]
            up_count = designed[rows]
            # (B, T): climbing toward a leaf, but fewer uplinks reach it than the switch's tier was built
            # with (some cannot reach it, or are gone); in an intact tree all can
            reach = o.ud.dist[rows][:, targets] != INF
            degraded = ~descending & leaf_target & reach & (count[uid] < up_count[:, None])
            if degraded.any():
                entries = degraded[:, target]
                repaired_entries += int(entries.sum())
                chosen, moved_at = self._degraded(
                    chosen,
                    entries,
                    mask,
                    target,
                    number,
                    div[rank],
                    up_count,
                    by_slot[rows],
                    pos[rows],
                    ports,
                    u,
                    count,
                    most,
                )
                moved_entries += moved_at[0].size
                moved_rows.append(rows[moved_at[0]])
                moved_lids.append(lids[moved_at[1]])
            lft[rows[0] : rows[-1] + 1, lids] = chosen
        set_local_routes(lft, subnet)
        rebalanced = 0
        if wide and moved_rows:
            lft, rebalanced = rebalance(
                subnet, lft, alt, np.concatenate(moved_rows), np.concatenate(moved_lids), o.rank, order
            )
        info = o.describe(subnet)
        short = int((n_up < designed).sum())
        if short or repaired_entries:
            info["repair"] = {
                "switches_short_of_uplinks": short,
                "switches_that_lost_an_uplink_of_their_own": short_alone,
                "entries_past_a_lost_uplink": repaired_entries,
                "entries_moved": moved_entries,
                "entries_rebalanced_by_load": rebalanced if wide else "no (damage not wide)",
            }
        return RoutingTables(self.name, subnet, lft, alt, info)

    @staticmethod
    def _degraded(
        chosen: npt.NDArray[np.uint8],
        degraded: Bool,
        mask: Bool,
        target: npt.NDArray[np.intp],
        number: I64,
        divisor: I64,
        up_count: I64,
        by_slot: npt.NDArray[np.intp],
        pos: I64,
        ports: npt.NDArray[np.uint8],
        u: npt.NDArray[np.int32],
        count: npt.NDArray[np.int32],
        most: int,
    ) -> tuple[npt.NDArray[np.uint8], tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]]:
        """Entries climbing from a switch where fewer uplinks lead to the destination than its tier was
        built with (`up_count`; `by_slot[s, j]`: the port of its j-th uplink as the intact tree numbers
        them, -1 where that uplink is gone).

        The digit is taken over the tier's uplink count, as in the intact tree, and names the uplink it
        would there; that uplink keeps the destination if it exists and still works, so destinations that
        did not use the failed part keep their routes.  The others (a digit past the uplinks left, or an
        uplink that cannot reach) take the next digit, offset by the switch's position, so that different
        switches spread one destination's flows over the remaining uplinks instead of all moving to the
        same one.  Taking the digit modulo the uplinks left instead folds two digits onto one uplink: with
        one of k=16's 64 core switches gone, one core-to-aggregation link per pod carried twice the mean.
        """
        # Only the degraded entries are computed (a cable cut degrades a few switches' rows of thousands).
        r, d = np.nonzero(degraded)
        up = np.maximum(up_count[r], 1)
        num = number[d]
        digit = ((num // divisor[r]) % up).astype(np.intp)
        slot_port = by_slot[r, np.minimum(digit, by_slot.shape[1] - 1)]
        exists = (digit < by_slot.shape[1]) & (slot_port >= 0)
        preferred = np.maximum(slot_port, 0)
        usable = exists & mask[r, target[d], preferred]
        second = num // np.minimum(divisor[r] * up, _DIV_CAP) + pos[r]
        uu = u[r, d]
        fallback = ports[uu * most + second % np.maximum(count[uu], 1)]
        repaired = chosen.copy()
        repaired[r, d] = np.where(usable, preferred, fallback)
        return repaired, (r[~usable], d[~usable])


def _uplinks_by_slot(
    subnet: Subnet, o: Orientation, pos: I64, order: npt.NDArray[np.intp], designed: I64
) -> tuple[npt.NDArray[np.intp], I64]:
    """(by_slot, per switch the uplink count of its group).  by_slot[s, j]: the port of switch s's j-th
    uplink (-1: gone).  Slots come from the switch's group
    (`hostorder.uplink_slots`: a lost uplink leaves the others' numbers alone) where the group has as many
    uplinks as the tier was built with; elsewhere (a tier built uneven) the uplinks left, in order."""
    width = subnet.n_ports
    slots, group_uplinks = uplink_slots(subnet, o.rank, o.ud.up, pos)
    up_in_order = np.take_along_axis(o.ud.up, order, axis=1)
    up_sorted = np.take_along_axis(order, np.argsort(~up_in_order, axis=1, kind="stable"), axis=1)
    n_up = o.ud.up.sum(axis=1)
    by_slot = np.where(np.arange(width)[None, :] < n_up[:, None], up_sorted, -1).astype(np.intp)
    grouped = np.flatnonzero(group_uplinks == designed)
    if grouped.size:
        rows, ports = np.nonzero(slots[grouped] >= 0)
        by_slot[grouped] = -1
        by_slot[grouped[rows], slots[grouped[rows], ports]] = ports
    return by_slot, group_uplinks


def designed_uplinks(n_up: I64, rank: npt.NDArray[np.integer]) -> I64:
    """Per switch: the uplink count its tier was built with — the most common count in the tier when at
    least half the tier has it (a fat-tree's tiers are uniform; those below it lost uplinks), else the
    switch's own (a tier built uneven is taken as it is).  With 5 % of k=16's cables cut only ~60 % of
    the aggregation switches keep all 8 uplinks; a 3/4 threshold then took each switch's own count, and
    the digit modulo 7 folded two destination leaves onto one core (core-to-pod links at 2x the mean)."""
    designed = n_up.copy()
    for tier in np.unique(rank).tolist():
        members = rank == tier
        counts = np.bincount(n_up[members])
        common = int(counts.argmax())
        if counts[common] * 2 >= int(members.sum()):
            designed[members & (n_up < common)] = common
    return designed


__all__ = ["FatTreeEngine", "designed_uplinks", "destination_numbers", "digit_divisors"]
