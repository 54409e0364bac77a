"""Rebalancing ftree's repaired entries on a widely damaged fat-tree, by measured load.

ftree's digit rule repairs an entry whose uplink is gone (or can no longer reach the destination) with a
formula: the next digit, offset by the switch's position.  After one or a few losses that is close to the
best spread (one of k=16's 64 cores gone: max/mean 1.157, where 8/7 = 1.143 is perfect) and it keeps a
cut's reroute incremental and cheap.  After many losses it is not: each switch repairs alone, so the
switches that lost different uplinks pile the same destinations onto the same survivor.  With 5 % of
OpenSM's k=16 cables cut, a core's link down to one pod carried 2.0-2.3x the mean link, and ftree was no
better than shortest paths (max/mean 1.78-2.14 over ten seeds, fabriclab's sssp 1.85-1.95).

So when the damage is wide (`wide_damage`), the repaired entries are chosen again one at a time, heaviest
first, as sssp does for every entry: the all-to-all flows of the formula's tables are measured, an entry's
flows are taken off its path, and it takes the candidate port whose path (that link, then the tables onward
to the destination) would have the lowest most-loaded link after adding them — ties keep the formula's
port, then the switch's preference order.  Only repaired entries move and only to up*/down* candidates,
so every destination stays reachable and the tables stay deadlock-free on one lane.

Pure and deterministic: the same subnet gives the same tables.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controller.sm.quality import all_to_all_flows, channel_index
from controller.sm.subnet import I64, U8, Subnet

#: Switches that lost an uplink their group still has, from which the repairs are rebalanced: at most
#: this many (or 1 % of the switches with uplinks, if more) are repaired by the formula alone.
FORMULA_ONLY_UP_TO = 3


def wide_damage(individually_short: int, climbing_switches: int) -> bool:
    """Whether repaired entries are rebalanced by load: more switches lost an uplink of their own than
    `FORMULA_ONLY_UP_TO` or 1 % of the switches with uplinks (k=16: 4 of 256).  A structural test, so a
    routing of some destinations (`route_some`) decides as a full one does."""
    return individually_short > max(FORMULA_ONLY_UP_TO, climbing_switches // 100)


def flows_through(subnet: Subnet, lft: U8) -> npt.NDArray[np.float64]:
    """through[s, c]: the all-to-all flows (every host to every other) that pass switch s toward host
    destination column c, its own hosts' included; 0 for switch destinations and where none pass."""
    through = np.zeros((subnet.n_switches, subnet.dest_lids.size), dtype=np.float64)
    for result, flows, hops in all_to_all_flows(subnet, lft):
        through[:, result.cols] = np.where(hops >= 0, flows, 0.0)
    return through


def rebalance(
    subnet: Subnet,
    lft: U8,
    candidates: U8,
    moved_rows: npt.NDArray[np.intp],
    moved_lids: npt.NDArray[np.intp],
    rank: npt.NDArray[np.integer],
    preference: npt.NDArray[np.intp],
) -> tuple[U8, int]:
    """(tables, entries changed): `lft` (local routes set) with the entries (moved_rows[i], moved_lids[i])
    chosen again by load among `candidates` (packed port bits per switch and destination switch).
    `preference[s]`: switch s's ports, most preferred first.  Entries are taken from the top tier down,
    heaviest first, then by destination and switch."""
    lft = lft.copy()
    if moved_rows.size == 0:
        return lft, 0
    width = subnet.n_ports
    col_of_lid = np.full(subnet.max_lid + 1, -1, dtype=np.intp)
    col_of_lid[subnet.dest_lids] = np.arange(subnet.dest_lids.size)
    cols = col_of_lid[moved_lids]
    through = flows_through(subnet, lft)
    weight = through[moved_rows, cols]
    keep = subnet.dest_is_host[cols] & (weight > 0)  # entries no flow uses cannot unbalance anything
    rows, cols, lids, weight = moved_rows[keep], cols[keep], moved_lids[keep], weight[keep]
    if rows.size == 0:
        return lft, 0
    ids, count = channel_index(subnet)
    # link loads of the formula's tables: every switch's flows toward a destination leave by its entry
    all_rows, all_cols = np.nonzero(through > 0)
    ports = lft[all_rows, subnet.dest_lids[all_cols]].astype(np.intp)
    carried = through[all_rows, all_cols]
    load = np.zeros(count + 1, dtype=np.float64)
    np.add.at(load, ids[all_rows, ports], carried)
    order = np.lexsort((rows, cols, -weight, rank[rows]))
    # candidate ports per (switch, destination switch), in the switch's preference order
    target = subnet.dest_switch[cols].astype(np.intp)
    pairs, pair_of = np.unique(rows * subnet.n_switches + target, return_inverse=True)
    owner, toward = pairs // subnet.n_switches, pairs % subnet.n_switches
    bits = np.unpackbits(candidates[owner, toward], axis=1, count=width)
    ranked = np.take_along_axis(bits, preference[owner], axis=1).astype(bool)
    choice = [preference[s][ok].tolist() for s, ok in zip(owner.tolist(), ranked, strict=True)]
    return _greedy(subnet, lft, ids, load, through, rows, cols, lids, order, choice, pair_of.reshape(-1))


def _greedy(
    subnet: Subnet,
    lft: U8,
    ids: npt.NDArray[np.intp],
    load_array: npt.NDArray[np.float64],
    through: npt.NDArray[np.float64],
    rows: npt.NDArray[np.intp],
    cols: npt.NDArray[np.intp],
    lids: npt.NDArray[np.intp],
    order: npt.NDArray[np.intp],
    choice: list[list[int]],
    pair_of: npt.NDArray[np.intp],
) -> tuple[U8, int]:
    """The entry-at-a-time loop, on Python lists (a numpy scalar access per hop costs more than the hop)."""
    table = lft.tolist()
    channel = ids.tolist()
    neighbour = subnet.nbr.tolist()
    load = load_array.tolist()
    flows = through.tolist()
    cap = subnet.n_switches

    def path(switch: int, port: int, lid: int) -> tuple[list[int], list[int]]:
        """Channels from `switch` out of `port`, then along the tables to the destination, and the
        switches after `switch` on the way (ftree's tables have no loops; never walk more than `cap`)."""
        links: list[int] = [channel[switch][port]]
        nodes: list[int] = []
        nxt = neighbour[switch][port]
        while nxt >= 0 and len(nodes) < cap:
            nodes.append(nxt)
            port = table[nxt][lid]
            links.append(channel[nxt][port])
            nxt = neighbour[nxt][port]
        return links, nodes

    def move(links: list[int], nodes: list[int], c: int, w: float) -> None:
        for x in links:
            load[x] += w
        for t in nodes:
            flows[t][c] += w

    at = load.__getitem__
    changed = 0
    for i in order.tolist():
        s, c, lid = int(rows[i]), int(cols[i]), int(lids[i])
        w = flows[s][c]
        ports = choice[int(pair_of[i])]
        if w <= 0.0 or len(ports) < 2:
            continue
        current = table[s][lid]
        links, nodes = path(s, current, lid)
        move(links, nodes, c, -w)
        # the lowest most-loaded link once these flows are added; then the lowest total; then stay
        best = (max(map(at, links)), sum(map(at, links)), False)
        picked = (current, links, nodes)
        for port in ports:
            if port == current:
                continue
            links, nodes = path(s, port, lid)
            peak = max(map(at, links))
            if peak > best[0]:
                continue
            cost = (peak, sum(map(at, links)), True)
            if cost < best:
                best, picked = cost, (port, links, nodes)
        port, links, nodes = picked
        move(links, nodes, c, w)
        if port != current:
            table[s][lid] = port
            changed += 1
    return np.array(table, dtype=lft.dtype), changed


def individually_short(n_up: I64, group_uplinks: I64, designed: I64) -> int:
    """Switches that lost an uplink their group still has (a cut cable), not those whose whole group lost
    a parent (a failed switch above: the formula spreads that well)."""
    return int(((n_up < group_uplinks) & (group_uplinks >= designed)).sum())


__all__ = ["FORMULA_ONLY_UP_TO", "flows_through", "individually_short", "rebalance", "wide_damage"]
