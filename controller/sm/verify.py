"""Verification of computed tables: reachability, loops, hop counts, deadlock freedom.

Run on every table the controller is about to install, not just in tests: a table that fails is never
pushed.  Deadlock freedom is checked on the channel dependency graph (Dally & Seitz): channels are directed
switch-to-switch links; a dependency c1 -> c2 exists when a packet that arrives over c1 leaves over c2.  The
tables are deadlock-free with V virtual lanes if destinations can be split into at most V layers whose
graphs are each acyclic (the layering is DFSSSP's idea, per destination here because the controller maps a
destination, not a path, to a traffic class; see `cdg`).  What matters is the data traffic, so the graph is
built from routes to host LIDs as they are used by traffic from hosts.  Tables that carry their own layers
(`dfsssp`) are checked layer by layer: each layer's graph must be acyclic.

Fast failover and the multipath policies send packets over every equal-cost alternative the engine
recorded (`RoutingTables.alt`), not only the table's port.  With ``alternatives=True`` a second check covers
all of them: the dependency graph of every path a packet can take when any switch may pick any of its
alternatives toward the destination (plus the table's own entries), which must be acyclic on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controller.sm.cdg import (
    acyclic_core,
    block_turns,
    destination_layers,
    find_cycles,
    layer_cycles,
    turn_codes,
)
from controller.sm.paths import hop_distances
from controller.sm.subnet import I64, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.walk import ARRIVED, DEAD, column_blocks, follow


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
    check_turns = deadlock and tables.layers is None
    turns = np.zeros((subnet.n_switches, subnet.n_ports, subnet.n_ports), dtype=bool)
    # only switches with hosts are sources: the figures below look at their rows alone
    rows = np.flatnonzero(hosts > 0)
    row_of = np.full(subnet.n_switches, -1, dtype=np.intp)
    row_of[rows] = np.arange(rows.size)
    for cols in column_blocks(subnet):
        result = follow(subnet, lft, cols)
        dead += int(np.count_nonzero(result.outcome == DEAD))
        loops += int(np.count_nonzero(result.outcome >= 0))
        host_cols = np.flatnonzero(subnet.dest_is_host[cols])
        if not host_cols.size:
            continue
        if check_turns:
            turns |= block_turns(subnet, result)
        outcome = result.outcome[rows][:, host_cols]
        weights = np.repeat(hosts[rows][:, None], host_cols.size, axis=1)
        # a host is not a source toward itself
        targets = subnet.dest_switch[cols][host_cols]
        weights[row_of[targets], np.arange(targets.size)] -= 1
        arrived = outcome == ARRIVED
        unreachable += int(weights[~arrived].sum())
        hops = result.hops[rows][:, host_cols].astype(np.int64) + 2
        best = shortest[rows][:, targets].astype(np.int64) + 2
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
    n_chan = subnet.switch_channels[1]
    if deadlock and tables.layers is not None:
        report = _layered_report(tables)  # layered tables: alternatives are not checked per layer
    elif deadlock:
        codes = turn_codes(subnet, turns)
        report = _deadlock_report(tables, vls, (codes, codes, n_chan))
        if alternatives:
            codes = turn_codes(subnet, turns | alternative_turns(tables))
            alt_report = _deadlock_report(tables, 1, (codes, codes, n_chan))
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
    switch may forward over any of its alternatives toward the destination's switch, sorted."""
    return turn_codes(tables.subnet, alternative_turns(tables))


def alternative_turns(tables: RoutingTables) -> npt.NDArray[np.bool_]:
    """The turns ([middle switch, in port, out port], see `cdg.block_turns`) of every path host traffic
    can take when each switch may forward over any of its alternatives toward the destination's switch.

    All destination switches at once, as arrays [switch, port, destination switch]: which switches host
    traffic toward each destination can reach (grown from the switches with hosts), then, per middle
    switch m, which of its incoming channels meet which of its outgoing ports for some destination — a
    boolean matrix product (incoming x destinations) @ (destinations x out ports) per switch.  A k=16
    reroute's check took 65 ms walking destination switches one by one (and a cache of their bitmaps
    missed on every cut: a cut changes every leaf's alternatives); this takes a few."""
    subnet = tables.subnet
    width = subnet.n_ports
    nbr = subnet.nbr
    is_link = nbr >= 0
    targets = np.unique(subnet.ep_switch).astype(np.intp)
    if targets.size == 0 or not is_link.any():
        return np.zeros((subnet.n_switches, width, width), dtype=bool)
    # allowed[s, p, t]: switch s may forward toward destination switch targets[t] over link port p
    allowed = np.unpackbits(tables.alt[:, targets, :], axis=2, count=width).astype(bool)
    allowed &= is_link[:, None, :]
    allowed[targets, np.arange(targets.size), :] = False  # at its own switch a packet leaves to a host
    allowed = allowed.transpose(0, 2, 1)  # [switch, port, target]
    # the far end of every link port, as (switch, port) into `allowed` (masked where there is no link)
    src_s = np.where(is_link, nbr, 0)
    src_p = np.where(is_link, subnet.nbr_port, 0)
    used = np.repeat(subnet.has_hosts[:, None], targets.size, axis=1)  # [switch, target]
    for _ in range(subnet.n_switches + 1):
        leaving = allowed & used[:, None, :]
        arriving = leaving[src_s, src_p, :] & is_link[:, :, None]  # [m, in port, t]: m entered over it
        grown = used | arriving.any(axis=1)
        if np.array_equal(grown, used):
            break
        used = grown
    # depends[m, in port, out port]: some destination's traffic enters m over `in port` and leaves on
    # `out port` (float32 sums of at most len(targets) ones are exact)
    turns: npt.NDArray[np.bool_] = (
        np.matmul(arriving.astype(np.float32), allowed.transpose(0, 2, 1).astype(np.float32)) > 0
    )
    return turns


def _layered_report(tables: RoutingTables) -> DeadlockReport:
    """The engine's own layers, each checked for cycles."""
    assert tables.layers is not None
    count, total, cycles = layer_cycles(tables, tables.layers)
    names = channel_names(tables.subnet)
    return DeadlockReport(
        count,
        tables.subnet.switch_channels[1],
        total,
        not cycles,
        count,
        [[names[c] for c in cycle] for cycle in cycles],
        "virtual lanes (layers) assigned by the engine, each checked",
    )


def _deadlock_report(tables: RoutingTables, vls: int, dependencies: tuple[I64, I64, int]) -> DeadlockReport:
    subnet = tables.subnet
    codes, _, n_chan = dependencies
    alive = acyclic_core(codes, n_chan)
    if not alive.any():
        return DeadlockReport(vls, n_chan, int(codes.size), True, 1)
    names = channel_names(subnet)
    cycles = [[names[c] for c in cycle] for cycle in find_cycles(codes, n_chan, alive)]
    if vls <= 1:
        return DeadlockReport(vls, n_chan, int(codes.size), False, 1, cycles)
    layers, note = destination_layers(tables, vls)
    return DeadlockReport(
        vls,
        n_chan,
        int(codes.size),
        layers is not None,
        layers or vls,
        cycles if layers is None else [],
        note,
    )


__all__ = [
    "DeadlockReport",
    "Verification",
    "alternative_dependencies",
    "channel_names",
    "verify",
]
