"""The channel dependency graph (CDG) of a routing, its cycles, and virtual-lane layers that break them.

Channels are directed switch-to-switch links; a dependency c1 -> c2 exists when a packet that arrives over c1
leaves over c2.  Tables are deadlock-free on one virtual lane iff the graph of the routes that host traffic
uses is acyclic (Dally & Seitz).  Where it is not, DFSSSP (Domke et al.) spreads routes over several lanes
(layers) whose graphs are each acyclic; fabriclab assigns a layer per destination, because the controller
maps a destination, not a (source, destination) path, to a traffic class.

Graphs are arrays of edge codes `c_in * n_channels + c_out`; acyclicity is tested by peeling (Kahn's
algorithm both ways, a whole wave of nodes at a time), cycles are found by walking first successors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import I64, U8, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.walk import Follow, follow_hosts

#: Beyond this many (switch, destination) pairs, layering is not attempted.
LAYERING_LIMIT = 20_000_000


def _reached_turns(subnet: Subnet, result: Follow) -> tuple[I64, I64, I64, I64, npt.NDArray[np.intp]]:
    """The turns host traffic makes in one block: for each, the switch it comes from (src_rows), the
    host-destination column (src_cols), the middle switch (mid); with the block's host destinations (cols)
    and their out ports.  A switch is on the way to a destination if it has hosts or a switch on the way
    forwards to it; a turn needs the middle switch to forward onward (not deliver)."""
    host = subnet.dest_is_host[result.cols]
    cols = result.cols[host]
    nxt = result.next_switch[:, host]
    port = result.port[:, host].astype(np.intp)
    width = cols.size
    used = np.repeat(subnet.has_hosts[:, None], width, axis=1)
    col_index = np.broadcast_to(np.arange(width), nxt.shape)
    for _ in range(subnet.n_switches):
        forward = used & (nxt >= 0)
        grown = used.copy()
        grown[nxt[forward], col_index[forward]] = True
        if (grown == used).all():
            break
        used = grown
    src_rows, src_cols = np.nonzero(used & (nxt >= 0))
    mid = nxt[src_rows, src_cols]
    onward = nxt[mid, src_cols] >= 0
    return src_rows[onward], src_cols[onward], mid[onward].astype(np.int64), cols, port


def block_dependencies(subnet: Subnet, result: Follow, per_destination: bool) -> tuple[I64, I64]:
    """Dependency codes (c_in * n_channels + c_out) of one block's host destinations, with the destination
    column causing each: unique codes (one owner each), or with `per_destination` every distinct
    (code, destination) pair.  Only entries that host traffic can reach count (`_reached_turns`)."""
    chan, n_chan = subnet.switch_channels
    src_rows, src_cols, mid, cols, port = _reached_turns(subnet, result)
    c_in = chan[src_rows, port[src_rows, src_cols]]
    c_out = chan[mid, port[mid, src_cols]]
    code = c_in.astype(np.int64) * n_chan + c_out
    owner = cols[src_cols].astype(np.int64)
    if per_destination:
        n_dest = int(subnet.dest_lids.size)
        pair = np.unique(code * n_dest + owner)
        return pair // n_dest, pair % n_dest
    unique, first = np.unique(code, return_index=True)
    return unique, owner[first]


def block_turns(subnet: Subnet, result: Follow) -> npt.NDArray[np.bool_]:
    """The dependencies of one block's host destinations as turns: turns[m, p, q] when traffic that host
    traffic can reach enters switch m on port p and leaves it on port q toward another switch.  A set of
    turns is a fixed-size bitmap whatever the channel numbering (unions are ORs, no sorting or hashing);
    `turn_codes` gives the dependency codes."""
    width = subnet.n_ports
    turns = np.zeros(subnet.n_switches * width * width, dtype=bool)
    turns[block_turn_index(subnet, result)] = True
    return turns.reshape(subnet.n_switches, width, width)


def block_turn_index(subnet: Subnet, result: Follow) -> I64:
    """`block_turns` as flat indices (m * width + p) * width + q, once per (turn, destination) that makes
    it: counted (`np.bincount`), they say how many destinations use each turn."""
    width = subnet.n_ports
    src_rows, src_cols, mid, _, port = _reached_turns(subnet, result)
    p_in = subnet.nbr_port[src_rows, port[src_rows, src_cols]]
    index: I64 = (mid * width + p_in) * width + port[mid, src_cols]
    return index


def turn_codes(subnet: Subnet, turns: npt.NDArray[np.bool_]) -> I64:
    """Sorted dependency codes (c_in * n_channels + c_out) of a set of turns: c_in is the channel that
    enters the middle switch on the turn's in port, c_out the one leaving on its out port."""
    chan, n_chan = subnet.switch_channels
    m, p_in, q = np.nonzero(turns)
    codes = chan[subnet.nbr[m, p_in], subnet.nbr_port[m, p_in]].astype(np.int64) * n_chan + chan[m, q]
    return np.sort(codes)


def dependencies(tables: RoutingTables, per_destination: bool = False) -> tuple[I64, I64, int]:
    """`block_dependencies` over the whole table."""
    parts = [
        block_dependencies(tables.subnet, result, per_destination)
        for result in follow_hosts(tables.subnet, tables.lft)
    ]
    return merge(parts, per_destination, tables.subnet.switch_channels[1])


def merge(parts: list[tuple[I64, I64]], per_destination: bool, n_chan: int) -> tuple[I64, I64, int]:
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), n_chan
    codes = np.concatenate([p[0] for p in parts])
    owners = np.concatenate([p[1] for p in parts])
    if per_destination:
        return codes, owners, n_chan
    unique, first = np.unique(codes, return_index=True)
    return unique, owners[first], n_chan


def acyclic_core(codes: I64, n_chan: int) -> npt.NDArray[np.bool_]:
    """Nodes left after repeatedly removing nodes without incoming or without outgoing edges (Kahn, both
    ways, a whole wave at a time).  Empty iff the graph is acyclic."""
    src = codes // n_chan
    dst = codes % n_chan
    alive = np.ones(n_chan, dtype=bool)
    edge_alive = np.ones(codes.size, dtype=bool)
    while True:
        indeg = np.bincount(dst[edge_alive], minlength=n_chan)
        outdeg = np.bincount(src[edge_alive], minlength=n_chan)
        drop = alive & ((indeg == 0) | (outdeg == 0))
        if not drop.any():
            return alive
        alive &= ~drop
        edge_alive &= alive[src] & alive[dst]


def find_cycles(codes: I64, n_chan: int, alive: npt.NDArray[np.bool_], limit: int = 3) -> list[list[int]]:
    """Up to `limit` disjoint cycles among the `alive` core (every node there has an alive successor)."""
    src = codes // n_chan
    dst = codes % n_chan
    keep = alive[src] & alive[dst]
    successor = np.full(n_chan, -1, dtype=np.int64)
    successor[src[keep][::-1]] = dst[keep][::-1]  # the first listed successor of each node
    cycles: list[list[int]] = []
    seen_nodes: set[int] = set()
    for start in np.flatnonzero(alive).tolist():
        if len(cycles) >= limit:
            break
        if start in seen_nodes:
            continue
        path: list[int] = []
        index: dict[int, int] = {}
        node = start
        while node not in index:
            index[node] = len(path)
            path.append(node)
            node = int(successor[node])
        cycle = path[index[node] :]
        seen_nodes.update(cycle)
        cycles.append(cycle)
    return cycles


def path_dependencies(tables: RoutingTables) -> tuple[I64, I64, int]:
    """Dependency codes of every route that host traffic takes, with the route causing each: the owner is
    `source leaf index * n_dest + destination column` (leaves = switches with hosts, in switch order).

    Routes are walked hop by hop for all (leaf, destination) pairs of a block of destinations at once.  A
    route from a leaf to a destination is the same for every host on that leaf, so these are exactly
    DFSSSP's per-path dependencies."""
    subnet = tables.subnet
    chan, n_chan = subnet.switch_channels
    leaves = np.flatnonzero(subnet.has_hosts)
    n_dest = int(subnet.dest_lids.size)
    width = subnet.n_ports
    codes: list[I64] = []
    owners: list[I64] = []
    host_cols = np.flatnonzero(subnet.dest_is_host)
    step = max(1, (1 << 22) // max(1, leaves.size))
    for start in range(0, host_cols.size, step):
        cols = host_cols[start : start + step]
        lids = subnet.dest_lids[cols].astype(np.intp)
        cur: npt.NDArray[np.intp] = np.repeat(leaves, cols.size).astype(np.intp)
        owner: I64 = (np.arange(leaves.size)[:, None] * n_dest + cols[None, :]).astype(np.int64).ravel()
        prev: npt.NDArray[np.intp] = np.full(cur.size, n_chan, dtype=np.intp)
        lid = np.tile(lids, leaves.size)
        for _ in range(subnet.n_switches):
            port = tables.lft[cur, lid].astype(np.intp)
            ok = port < width
            here = np.where(ok, chan[cur, np.where(ok, port, 0)], n_chan)
            moving = here < n_chan
            both = moving & (prev < n_chan)
            codes.append(prev[both].astype(np.int64) * n_chan + here[both])
            owners.append(owner[both])
            keep = np.flatnonzero(moving)
            if keep.size == 0:
                break
            cur = subnet.nbr[cur[keep], port[keep]].astype(np.intp)
            prev, owner, lid = here[keep], owner[keep], lid[keep]
    if not codes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), n_chan
    return np.concatenate(codes), np.concatenate(owners), n_chan


@dataclass(frozen=True)
class Layering:
    """Virtual lane per route: `layers[s, lid]` is the lane of traffic that enters the fabric at leaf s
    towards `lid` (the ingress switch stamps it; rows of switches without hosts are 0)."""

    layers: U8 | None
    #: Layers used (1 = one VL is enough).
    count: int
    #: Every layer's dependency graph is acyclic.
    acyclic: bool
    note: str | None = None


def assign_layers(tables: RoutingTables, max_layers: int) -> Layering:
    """DFSSSP's cycle breaking: while layer L has a cycle, take the edge of that cycle used by the fewest
    routes and move those routes to layer L+1; then go on with L+1.  `acyclic=False` if more than
    `max_layers` would be needed.

    Each layer's graph is kept as a count of routes per dependency, updated as routes move: the graph of a
    layer is the dependencies with a count, and the weakest edge of a cycle is the one with the smallest
    count.  The layer's cyclic core is kept up to date as edges disappear (`_Core`) rather than peeled
    again after every move: peeling from scratch was 80 % of the time on a 4x4x4 torus (8 layers)."""
    subnet = tables.subnet
    leaves = int(subnet.has_hosts.sum())
    if leaves * int(subnet.dest_is_host.sum()) * 4 > LAYERING_LIMIT:
        return Layering(None, 1, False, "fabric too large for VL layering; only the one-VL check was done")
    codes, owners, n_chan = path_dependencies(tables)
    n_paths = leaves * int(subnet.dest_lids.size)
    uniq, code_id = np.unique(codes, return_inverse=True)
    by_route = np.argsort(owners, kind="stable")
    route_start = np.searchsorted(owners[by_route], np.arange(n_paths + 1)).tolist()
    route_codes = code_id[by_route].tolist()
    by_code = np.argsort(code_id, kind="stable")
    code_start = np.searchsorted(code_id[by_code], np.arange(uniq.size + 1)).tolist()
    code_routes = owners[by_code].tolist()
    layer = [0] * n_paths
    count = np.bincount(code_id, minlength=uniq.size).tolist()
    for current in range(max_layers):
        above = [0] * uniq.size
        core = _Core(uniq, n_chan, count)
        moved_any = False
        while core.cyclic():
            if current == max_layers - 1:
                return Layering(
                    _per_route(subnet, np.array(layer, dtype=np.int64)),
                    max_layers,
                    False,
                    f"still cyclic with {max_layers} VL(s)",
                )
            weakest = -1
            for e in core.cycle():  # the edge of fewest routes; ids are in code order, so ties go low
                if weakest < 0 or count[e] < count[weakest] or (count[e] == count[weakest] and e < weakest):
                    weakest = e
            span = code_routes[code_start[weakest] : code_start[weakest + 1]]
            for route in sorted({r for r in span if layer[r] == current}):
                layer[route] = current + 1
                moved_any = True
                for e in route_codes[route_start[route] : route_start[route + 1]]:
                    count[e] -= 1
                    above[e] += 1
                    if count[e] == 0:
                        core.remove(e)
        if not moved_any:
            return Layering(_per_route(subnet, np.array(layer, dtype=np.int64)), current + 1, True)
        count = above
    return Layering(_per_route(subnet, np.array(layer, dtype=np.int64)), max_layers, True)


class _Core:
    """The cyclic core of one layer's dependency graph (nodes left after removing, again and again, nodes
    without an incoming or an outgoing edge), kept as edges disappear — they only ever disappear while a
    layer is being broken, so the core only shrinks and each node and edge is peeled once per layer.

    `count` is shared with the caller: an edge exists while its count is positive; the caller decrements
    it and calls `remove` when it reaches zero.  A cycle is walked as `find_cycles` walks one (from the
    lowest node, along each node's lowest successor), so layers do not depend on the order of peeling."""

    def __init__(self, uniq: I64, n_chan: int, count: list[int]) -> None:
        self.src = (uniq // n_chan).tolist()
        self.dst = (uniq % n_chan).tolist()
        self.count = count
        self.out_edges: list[list[int]] = [[] for _ in range(n_chan)]
        self.in_edges: list[list[int]] = [[] for _ in range(n_chan)]
        self.indeg = [0] * n_chan
        self.outdeg = [0] * n_chan
        for e, (s, d) in enumerate(zip(self.src, self.dst, strict=True)):
            self.out_edges[s].append(e)  # codes are sorted, so each list is in successor order
            self.in_edges[d].append(e)
            if count[e] > 0:
                self.outdeg[s] += 1
                self.indeg[d] += 1
        self.alive = [True] * n_chan
        self._lowest = 0
        self._next = [0] * n_chan
        self._peel([node for node in range(n_chan) if self.indeg[node] == 0 or self.outdeg[node] == 0])

    def cyclic(self) -> bool:
        while self._lowest < len(self.alive) and not self.alive[self._lowest]:
            self._lowest += 1
        return self._lowest < len(self.alive)

    def remove(self, e: int) -> None:
        s, d = self.src[e], self.dst[e]
        if not (self.alive[s] and self.alive[d]):
            return
        self.outdeg[s] -= 1
        self.indeg[d] -= 1
        self._peel([node for node in (s, d) if self.outdeg[node] == 0 or self.indeg[node] == 0])

    def cycle(self) -> list[int]:
        """The edges of a cycle of the core (call only when `cyclic()`; every core node has a successor in
        the core).  A node's lowest live successor: edges only disappear and nodes only die, so the first
        live edge of a node only moves right — each node keeps its place in its list (`_next`)."""
        out_edges, first, count, alive, dst = self.out_edges, self._next, self.count, self.alive, self.dst
        taken: list[int] = []
        index: dict[int, int] = {}
        node = self._lowest
        while node not in index:
            index[node] = len(taken)
            edges = out_edges[node]
            at = first[node]
            while not (count[edges[at]] > 0 and alive[dst[edges[at]]]):
                at += 1
            first[node] = at
            taken.append(edges[at])
            node = dst[edges[at]]
        return taken[index[node] :]

    def _peel(self, queue: list[int]) -> None:
        alive, count, src, dst = self.alive, self.count, self.src, self.dst
        while queue:
            node = queue.pop()
            if not alive[node]:
                continue
            alive[node] = False
            for e in self.out_edges[node]:
                d = dst[e]
                if count[e] > 0 and alive[d]:
                    self.indeg[d] -= 1
                    if self.indeg[d] == 0:
                        queue.append(d)
            for e in self.in_edges[node]:
                s = src[e]
                if count[e] > 0 and alive[s]:
                    self.outdeg[s] -= 1
                    if self.outdeg[s] == 0:
                        queue.append(s)


def lanes(tables: RoutingTables, max_layers: int) -> tuple[U8, dict[str, object]]:
    """Per-route lanes for `tables` (see `Layering`) and what to report: all zero when one lane is enough
    (the plain graph is acyclic, as on every tree), DFSSSP layers otherwise."""
    subnet = tables.subnet
    zero = np.zeros((subnet.n_switches, subnet.max_lid + 1), dtype=np.uint8)
    codes, _, n_chan = dependencies(tables)
    if not acyclic_core(codes, n_chan).any():
        return zero, {"layers": 1}
    layering = assign_layers(tables, max_layers)
    info: dict[str, object] = {"layers": layering.count}
    if not layering.acyclic:
        info["note"] = layering.note
    return (layering.layers if layering.layers is not None else zero), info


def _per_route(subnet: Subnet, layer: I64) -> U8:
    leaves = np.flatnonzero(subnet.has_hosts)
    result = np.zeros((subnet.n_switches, subnet.max_lid + 1), dtype=np.uint8)
    per_leaf = layer.reshape(leaves.size, subnet.dest_lids.size)
    result[np.ix_(leaves, subnet.dest_lids)] = per_leaf.astype(np.uint8)
    return result


def layer_cycles(tables: RoutingTables, layers: U8) -> tuple[int, int, list[list[int]]]:
    """Check per-route layers: (number of layers, dependencies, cycles of the first cyclic layer — empty
    when every layer is acyclic)."""
    subnet = tables.subnet
    leaves = np.flatnonzero(subnet.has_hosts)
    per_path = layers[np.ix_(leaves, subnet.dest_lids)].astype(np.int64).ravel()
    host_paths = np.tile(subnet.dest_is_host, leaves.size)
    count = int(per_path[host_paths].max(initial=0)) + 1
    if count == 1:  # one layer: the plain graph, without the per-route bookkeeping
        codes, _, n_chan = dependencies(tables)
        alive = acyclic_core(codes, n_chan)
        return 1, int(codes.size), find_cycles(codes, n_chan, alive) if alive.any() else []
    codes, owners, n_chan = path_dependencies(tables)
    total = 0
    for current in range(count):
        unique = np.unique(codes[per_path[owners] == current])
        total += int(unique.size)
        alive = acyclic_core(unique, n_chan)
        if alive.any():
            return count, total, find_cycles(unique, n_chan, alive)
    return count, total, []


def destination_layers(tables: RoutingTables, vls: int) -> tuple[int | None, str | None]:
    """Layers when a destination, not a route, picks the lane (what `verify(vls=N)` checks for tables
    without their own layers): moves the destinations behind the weakest edge of a cycle to the next layer.
    Returns (layers needed, note)."""
    subnet = tables.subnet
    if int(subnet.dest_is_host.sum()) * subnet.n_switches > LAYERING_LIMIT:
        return None, "fabric too large for VL layering; only the one-VL check was done"
    codes, owners, n_chan = dependencies(tables, per_destination=True)
    layer = np.zeros(subnet.dest_lids.size, dtype=np.int64)
    for current in range(vls):
        while True:
            mine = layer[owners] == current
            unique = np.unique(codes[mine])
            alive = acyclic_core(unique, n_chan)
            if not alive.any():
                break
            if current == vls - 1:
                return None, f"still cyclic with {vls} VLs"
            cycle = find_cycles(unique, n_chan, alive, limit=1)[0]
            edge = cycle[0] * n_chan + cycle[1 % len(cycle)]
            layer[np.unique(owners[mine & (codes == edge)])] = current + 1
        if not (layer > current).any():
            return current + 1, None
    return vls, None


__all__ = [
    "LAYERING_LIMIT",
    "Layering",
    "acyclic_core",
    "assign_layers",
    "block_dependencies",
    "block_turn_index",
    "block_turns",
    "dependencies",
    "destination_layers",
    "find_cycles",
    "lanes",
    "layer_cycles",
    "merge",
    "path_dependencies",
    "turn_codes",
]
