"""Verification of computed tables: reachability, loops, hop counts, deadlock freedom.

Run on every table the controller is about to install, not just in tests: a table that fails is never
pushed.  Deadlock freedom is checked on the channel dependency graph (Dally & Seitz): channels are directed
switch-to-switch links; a dependency c1 -> c2 exists when a packet that arrives over c1 leaves over c2.  The
tables are deadlock-free with V virtual lanes if destinations can be split into at most V layers whose
graphs are each acyclic (the layering is DFSSSP's idea, per destination here because the controller maps a
destination, not a path, to a traffic class).  What matters is the data traffic, so the graph is built from
routes to host LIDs as they are used by traffic from hosts.

Fast failover and the multipath policies send packets over every equal-cost alternative the engine
recorded (`RoutingTables.alt`), not only the table's port.  With ``alternatives=True`` a second check covers
all of them: the dependency graph of every path a packet can take when any switch may pick any of its
alternatives toward the destination (plus the table's own entries), which must be acyclic on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.sm.paths import hop_distances
from controller.sm.subnet import I64, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.walk import ARRIVED, DEAD, Follow, column_blocks, follow, follow_hosts

#: Beyond this many (dependency, destination) pairs, VL layering is not attempted.
_LAYERING_LIMIT = 20_000_000


@dataclass(frozen=True)
class DeadlockReport:
    vls: int
    channels: int
    dependencies: int
    acyclic: bool
    #: VLs needed by the layering (<= vls when acyclic), or None if one layer is enough / not attempted.
    layers_used: int
    cycles: list[list[str]] = field(default_factory=list)
    note: str | None = None


@dataclass(frozen=True)
class Verification:
    engine: str
    host_pairs: int
    unreachable_pairs: int
    entries: int
    dead_entries: int
    loop_entries: int
    mean_hops: float
    mean_shortest_hops: float
    max_hops: int
    max_extra_hops: int
    pairs_longer_than_shortest: int
    deadlock: DeadlockReport | None
    #: The same check over every alternative path (fast failover, multipath policies), one VL.
    deadlock_alternatives: DeadlockReport | None = None

    @property
    def ok(self) -> bool:
        deadlock_ok = self.deadlock is None or self.deadlock.acyclic
        if self.deadlock_alternatives is not None:
            deadlock_ok = deadlock_ok and self.deadlock_alternatives.acyclic
        return (
            self.unreachable_pairs == 0 and self.loop_entries == 0 and self.dead_entries == 0 and deadlock_ok
        )


def channel_names(subnet: Subnet) -> list[str]:
    rows, ports = np.nonzero(subnet.nbr >= 0)
    return [
        f"{subnet.switch_names[s]}:{p}->{subnet.switch_names[subnet.nbr[s, p]]}"
        for s, p in zip(rows.tolist(), ports.tolist(), strict=True)
    ]


def verify(
    tables: RoutingTables, vls: int = 1, deadlock: bool = True, alternatives: bool = False
) -> Verification:
    """`alternatives`: also check deadlock freedom over every equal-cost alternative (see module doc)."""
    subnet = tables.subnet
    lft = tables.lft
    hosts = subnet.hosts_per_switch
    n_hosts = int(subnet.ep_lids.size)
    shortest = hop_distances(subnet)
    unreachable = dead = loops = 0
    hop_sum = shortest_sum = 0.0
    max_hops = max_extra = longer = 0
    dependencies: list[tuple[I64, I64]] = []
    for cols in column_blocks(subnet):
        result = follow(subnet, lft, cols)
        dead += int((result.outcome == DEAD).sum())
        loops += int((result.outcome >= 0).sum())
        host_cols = subnet.dest_is_host[cols]
        if not host_cols.any():
            continue
        if deadlock:
            dependencies.append(_block_dependencies(subnet, result, per_destination=False))
        outcome = result.outcome[:, host_cols]
        weights = hosts[:, None] * np.ones((1, int(host_cols.sum())), dtype=np.int64)
        # a host is not a source toward itself
        targets = subnet.dest_switch[cols][host_cols]
        weights[targets, np.arange(targets.size)] -= 1
        arrived = outcome == ARRIVED
        unreachable += int(weights[~arrived].sum())
        hops = result.hops[:, host_cols].astype(np.int64) + 2
        best = shortest[:, targets].astype(np.int64) + 2
        w = np.where(arrived, weights, 0)
        hop_sum += float((hops * w).sum())
        shortest_sum += float((best * w).sum())
        used = w > 0
        if used.any():
            max_hops = max(max_hops, int(hops[used].max()))
            extra = hops - best
            max_extra = max(max_extra, int(extra[used].max()))
            longer += int(w[used & (extra > 0)].sum())
    routed_pairs = n_hosts * (n_hosts - 1) - unreachable
    report = alt_report = None
    if deadlock:
        merged = _merge(dependencies, False, subnet.switch_channels[1])
        report = _deadlock_report(tables, vls, merged)
        if alternatives:
            codes = np.union1d(merged[0], alternative_dependencies(tables))
            alt_report = _deadlock_report(tables, 1, (codes, codes, merged[2]))
    return Verification(
        engine=tables.engine,
        host_pairs=n_hosts * (n_hosts - 1),
        unreachable_pairs=unreachable,
        entries=int(subnet.n_switches * subnet.dest_lids.size),
        dead_entries=dead,
        loop_entries=loops,
        mean_hops=hop_sum / routed_pairs if routed_pairs else 0.0,
        mean_shortest_hops=shortest_sum / routed_pairs if routed_pairs else 0.0,
        max_hops=max_hops,
        max_extra_hops=max_extra,
        pairs_longer_than_shortest=longer,
        deadlock=report,
        deadlock_alternatives=alt_report,
    )


def alternative_dependencies(tables: RoutingTables) -> I64:
    """Channel dependency codes (c_in * n_channels + c_out) of every path host traffic can take when each
    switch may forward over any of its alternatives toward the destination's switch."""
    subnet = tables.subnet
    chan, n_chan = subnet.switch_channels
    n, width = subnet.n_switches, subnet.n_ports
    nbr = subnet.nbr
    is_link = nbr >= 0
    targets = np.unique(subnet.ep_switch)
    codes: list[I64] = []
    for t in targets.tolist():
        allowed = np.unpackbits(tables.alt[:, t, :], axis=1, count=width).astype(bool) & is_link
        allowed[t] = False  # at the destination's switch the packet leaves to a host
        # switches host traffic toward t can reach
        used = subnet.has_hosts.copy()
        while True:
            rows, ports = np.nonzero(allowed & used[:, None])
            grown = used.copy()
            grown[nbr[rows, ports]] = True
            if (grown == used).all():
                break
            used = grown
        rows, ports = np.nonzero(allowed & used[:, None])
        if rows.size == 0:
            continue
        mid = nbr[rows, ports]
        c_in = chan[rows, ports]
        # every way on from each middle switch
        onward = allowed[mid]  # (edges, width)
        e_idx, q = np.nonzero(onward)
        if e_idx.size == 0:
            continue
        c_out = chan[mid[e_idx], q]
        codes.append(np.unique(c_in[e_idx].astype(np.int64) * n_chan + c_out))
    if not codes:
        return np.zeros(0, dtype=np.int64)
    assert n > 0
    return np.unique(np.concatenate(codes))


def _block_dependencies(subnet: Subnet, result: Follow, per_destination: bool) -> tuple[I64, I64]:
    """Dependency codes (c_in * n_channels + c_out) of one block's host destinations, with the destination
    column causing each: unique codes (one owner each), or with `per_destination` every distinct
    (code, destination) pair.  Only entries that host traffic can reach count: a switch is on the way to a
    destination if it has hosts or a switch on the way forwards to it."""
    chan, n_chan = subnet.switch_channels
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
    src_rows, src_cols, mid = src_rows[onward], src_cols[onward], mid[onward]
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


def _dependencies(tables: RoutingTables, per_destination: bool = False) -> tuple[I64, I64, int]:
    """`_block_dependencies` over the whole table."""
    parts = [
        _block_dependencies(tables.subnet, result, per_destination)
        for result in follow_hosts(tables.subnet, tables.lft)
    ]
    return _merge(parts, per_destination, tables.subnet.switch_channels[1])


def _merge(parts: list[tuple[I64, I64]], per_destination: bool, n_chan: int) -> tuple[I64, I64, int]:
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), n_chan
    codes = np.concatenate([p[0] for p in parts])
    owners = np.concatenate([p[1] for p in parts])
    if per_destination:
        return codes, owners, n_chan
    unique, first = np.unique(codes, return_index=True)
    return unique, owners[first], n_chan


def _acyclic_core(codes: I64, n_chan: int) -> npt.NDArray[np.bool_]:
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


def _find_cycles(codes: I64, n_chan: int, alive: npt.NDArray[np.bool_], limit: int = 3) -> list[list[int]]:
    src = codes // n_chan
    dst = codes % n_chan
    keep = alive[src] & alive[dst]
    succ: dict[int, list[int]] = {}
    for a, b in zip(src[keep].tolist(), dst[keep].tolist(), strict=True):
        succ.setdefault(a, []).append(b)
    cycles: list[list[int]] = []
    seen_nodes: set[int] = set()
    for start in np.flatnonzero(alive).tolist():
        if start in seen_nodes or len(cycles) >= limit:
            continue
        path: list[int] = []
        index: dict[int, int] = {}
        node = start
        while node not in index:
            index[node] = len(path)
            path.append(node)
            node = succ[node][0]
        cycle = path[index[node] :]
        seen_nodes.update(cycle)
        cycles.append(cycle)
    return cycles


def deadlock_check(tables: RoutingTables, vls: int = 1) -> DeadlockReport:
    return _deadlock_report(tables, vls, _dependencies(tables))


def _deadlock_report(tables: RoutingTables, vls: int, dependencies: tuple[I64, I64, int]) -> DeadlockReport:
    subnet = tables.subnet
    codes, _, n_chan = dependencies
    alive = _acyclic_core(codes, n_chan)
    if not alive.any():
        return DeadlockReport(vls, n_chan, int(codes.size), True, 1)
    names = channel_names(subnet)
    cycles = [[names[c] for c in cycle] for cycle in _find_cycles(codes, n_chan, alive)]
    if vls <= 1:
        return DeadlockReport(vls, n_chan, int(codes.size), False, 1, cycles)
    layers, note = _layer(tables, vls)
    return DeadlockReport(
        vls,
        n_chan,
        int(codes.size),
        layers is not None,
        layers or vls,
        cycles if layers is None else [],
        note,
    )


def _layer(tables: RoutingTables, vls: int) -> tuple[int | None, str | None]:
    """Split destinations into acyclic layers: move the destinations behind one edge of a cycle to the
    next layer until every layer is acyclic (DFSSSP's cycle breaking, per destination)."""
    subnet = tables.subnet
    n_dest = int(subnet.dest_is_host.sum())
    if n_dest * subnet.n_switches > _LAYERING_LIMIT:
        return None, "fabric too large for VL layering; only the one-VL check was done"
    codes, owners, n_chan = _dependencies(tables, per_destination=True)
    layer = np.zeros(subnet.dest_lids.size, dtype=np.int64)
    for current in range(vls):
        while True:
            mine = layer[owners] == current
            unique = np.unique(codes[mine])
            alive = _acyclic_core(unique, n_chan)
            if not alive.any():
                break
            if current == vls - 1:
                return None, f"still cyclic with {vls} VLs"
            cycle = _find_cycles(unique, n_chan, alive, limit=1)[0]
            edge = cycle[0] * n_chan + cycle[1 % len(cycle)]
            movers = np.unique(owners[mine & (codes == edge)])
            layer[movers] = current + 1
        if not (layer > current).any():
            return current + 1, None
    return vls, None


__all__ = [
    "DeadlockReport",
    "Verification",
    "alternative_dependencies",
    "channel_names",
    "deadlock_check",
    "verify",
]
