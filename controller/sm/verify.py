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
import numpy.typing as npt

from controller.sm.cdg import (
    acyclic_core,
    block_turn_index,
    destination_layers,
    find_cycles,
    layer_cycles,
    turn_codes,
)
from controller.sm.paths import hop_distances
from controller.sm.subnet import I64, U8, Subnet
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
    #: Per-column figures, for verifying the next tables incrementally (not part of the result's value).
    columns: ColumnFigures | None = field(default=None, compare=False, repr=False)

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


#: Below this share of destination columns to redo, a verification starts from the previous one's
#: per-column figures (`Verification.columns`); above it, walking every column again is as cheap.
INCREMENTAL_MAX_SHARE = 0.4
_NONE = np.int64(-(1 << 40))  # "no pair" in per-column maxima


@dataclass(frozen=True, eq=False)
class ColumnFigures:
    """A verification's figures per destination column (index into `subnet.dest_lids`) and how many
    destinations make each turn, kept with it: tables that differ from these in a few columns (a cable
    cut reroutes ~100 of 1,344 destinations at k=16) are verified by walking those columns only."""

    subnet: Subnet
    lft: U8
    shortest: npt.NDArray[np.integer]
    dead: I64
    loops: I64
    unreachable: I64
    hop_sum: I64
    shortest_sum: I64
    longer: I64
    max_hops: I64
    max_extra: I64
    #: Destinations using each turn [switch, in port, out port] (None: the deadlock check was not asked).
    turn_count: npt.NDArray[np.int32] | None

    @classmethod
    def empty(cls, subnet: Subnet, lft: U8, shortest: npt.NDArray[np.integer], turns: bool) -> ColumnFigures:
        n = int(subnet.dest_lids.size)
        width = subnet.n_ports
        count = np.zeros(subnet.n_switches * width * width, dtype=np.int32) if turns else None

        def zero() -> I64:
            return np.zeros(n, dtype=np.int64)

        return cls(
            subnet, lft, shortest, zero(), zero(), zero(), zero(), zero(), zero(), np.full(n, _NONE),
            np.full(n, _NONE), count,
        )  # fmt: skip

    def fill(self, cols: npt.NDArray[np.intp]) -> None:
        """Walk columns `cols` of this table and write their figures (and add their turns)."""
        subnet = self.subnet
        hosts = subnet.hosts_per_switch
        rows = np.flatnonzero(hosts > 0)  # only switches with hosts are sources
        row_of = np.full(subnet.n_switches, -1, dtype=np.intp)
        row_of[rows] = np.arange(rows.size)
        result = follow(subnet, self.lft, cols)
        if self.turn_count is not None:
            self.turn_count[:] += np.bincount(
                block_turn_index(subnet, result), minlength=self.turn_count.size
            )
        self.dead[cols] = np.count_nonzero(result.outcome == DEAD, axis=0)
        self.loops[cols] = np.count_nonzero(result.outcome >= 0, axis=0)
        host_cols = np.flatnonzero(subnet.dest_is_host[cols])
        if not host_cols.size:
            return
        at = cols[host_cols]
        outcome = result.outcome[rows][:, host_cols]
        weights = np.repeat(hosts[rows][:, None], host_cols.size, axis=1)
        targets = subnet.dest_switch[at]
        weights[row_of[targets], np.arange(targets.size)] -= 1  # a host is not a source toward itself
        arrived = outcome == ARRIVED
        self.unreachable[at] = np.where(arrived, 0, weights).sum(axis=0)
        hops = result.hops[rows][:, host_cols].astype(np.int64) + 2
        best = self.shortest[rows][:, targets].astype(np.int64) + 2
        w = np.where(arrived, weights, 0)
        self.hop_sum[at] = (hops * w).sum(axis=0)
        self.shortest_sum[at] = (best * w).sum(axis=0)
        used = w > 0
        extra = hops - best
        self.max_hops[at] = np.where(used, hops, _NONE).max(axis=0)
        self.max_extra[at] = np.where(used, extra, _NONE).max(axis=0)
        self.longer[at] = np.where(used & (extra > 0), w, 0).sum(axis=0)

    def carry(self, tables: RoutingTables, shortest: npt.NDArray[np.integer]) -> ColumnFigures | None:
        """These figures for `tables`: kept columns carried over, the others walked again — or None when
        nothing carries over (a switch or destination added or moved, hosts lost, another port count, a
        lost switch whose entries did not all arrive, or too many columns to redo).

        Columns walked again: entries changed, an entry into a cable that came or went, a destination whose
        shortest distances changed.  Switches may have been lost (a switch loss renumbers the others): the
        figures then follow the switches by name and the destinations by LID."""
        old, new = self.subnet, tables.subnet
        if self.lft.shape[1] != tables.lft.shape[1] or old.n_ports != new.n_ports:
            return None
        renumbering = new.renumbering(old.switch_index)
        if not renumbering.complete:
            return None
        old_of = renumbering.old_of
        new_of = np.full(old.n_switches, -1, dtype=np.intp)
        new_of[old_of] = np.arange(old_of.size)
        lost = np.flatnonzero(new_of < 0)
        cols = np.searchsorted(old.dest_lids, new.dest_lids)  # each new destination's old column
        if cols.size and int(cols.max()) >= old.dest_lids.size:
            return None
        if (
            not np.array_equal(old.dest_lids[cols], new.dest_lids)
            or not np.array_equal(new_of[old.dest_switch[cols]], new.dest_switch)
            or not np.array_equal(old.dest_port[cols], new.dest_port)
            or not np.array_equal(old.hosts_per_switch[old_of], new.hosts_per_switch)
            or int(old.hosts_per_switch[lost].sum()) != 0
            or (lost.size and (self.dead.any() or self.loops.any()))  # a lost row's outcome counted
        ):
            return None
        lids = new.dest_lids
        before = renumbering.rows(self.lft)
        redo = (tables.lft[:, lids] != before[:, lids]).any(axis=0)
        old_nbr = renumbering.rows(old.nbr)
        moved_nbr = np.where(old_nbr >= 0, new_of[np.maximum(old_nbr, 0)], -1)
        cables = (moved_nbr != new.nbr) | (renumbering.rows(old.nbr_port) != new.nbr_port)
        for s, p in zip(*np.nonzero(cables), strict=True):
            redo |= before[s, lids] == p  # routes into a cable that came or went
        redo |= (shortest != renumbering.grid(self.shortest)).any(axis=0)[new.dest_switch]
        again = np.flatnonzero(redo)
        if again.size > INCREMENTAL_MAX_SHARE * lids.size:
            return None
        count = None
        if self.turn_count is not None:  # take out what the redone and the vanished columns made
            width = old.n_ports
            out = np.union1d(cols[again], np.setdiff1d(np.arange(old.dest_lids.size), cols))
            total = self.turn_count.astype(np.int64)
            if out.size:
                total -= np.bincount(block_turn_index(old, follow(old, self.lft, out)), minlength=total.size)
            grid = total.reshape(old.n_switches, width, width)
            if (grid < 0).any() or grid[lost].any():
                return None  # cannot happen for a consistent pair; walked whole then
            count = np.ascontiguousarray(grid[old_of], dtype=np.int32).reshape(-1)
        figures = ColumnFigures(
            new, tables.lft, shortest, self.dead[cols], self.loops[cols], self.unreachable[cols],
            self.hop_sum[cols], self.shortest_sum[cols], self.longer[cols], self.max_hops[cols],
            self.max_extra[cols], count,
        )  # fmt: skip
        if again.size:
            figures.fill(again)
        return figures


def verify(
    tables: RoutingTables,
    vls: int = 1,
    deadlock: bool = True,
    alternatives: bool = False,
    previous: Verification | None = None,
) -> Verification:
    """`alternatives`: also check deadlock freedom over every equal-cost alternative (see module doc).
    `previous`: the verification before a reroute (the same destinations; switches may have been lost):
    only the columns that may differ are walked again (`ColumnFigures.carry`); the result is the same."""
    subnet = tables.subnet
    lft = tables.lft
    n_hosts = int(subnet.ep_lids.size)
    shortest = hop_distances(subnet)
    check_turns = deadlock and tables.layers is None
    columns = None
    before = previous.columns if previous is not None else None
    if before is not None and (before.turn_count is not None) == check_turns:
        columns = before.carry(tables, shortest)
    if columns is None:
        columns = ColumnFigures.empty(subnet, lft, shortest, check_turns)
        for cols in column_blocks(subnet):
            columns.fill(cols)
    unreachable = int(columns.unreachable.sum())
    hop_sum, shortest_sum = float(columns.hop_sum.sum()), float(columns.shortest_sum.sum())
    routed_pairs = n_hosts * (n_hosts - 1) - unreachable
    report = alt_report = None
    n_chan = subnet.switch_channels[1]
    if deadlock and tables.layers is not None:
        report = _layered_report(tables)  # layered tables: alternatives are not checked per layer
    elif deadlock:
        assert columns.turn_count is not None
        turns = (columns.turn_count > 0).reshape(subnet.n_switches, subnet.n_ports, subnet.n_ports)
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
        dead_entries=int(columns.dead.sum()),
        loop_entries=int(columns.loops.sum()),
        mean_hops=hop_sum / routed_pairs if routed_pairs else 0.0,
        mean_shortest_hops=shortest_sum / routed_pairs if routed_pairs else 0.0,
        max_hops=max(0, int(columns.max_hops.max(initial=0))),
        max_extra_hops=max(0, int(columns.max_extra.max(initial=0))),
        pairs_longer_than_shortest=int(columns.longer.sum()),
        deadlock=report,
        deadlock_alternatives=alt_report,
        columns=columns,
    )


def alternative_dependencies(tables: RoutingTables) -> I64:
    """Channel dependency codes (c_in * n_channels + c_out) of every path host traffic can take when each
    switch may forward over any of its alternatives toward the destination's switch, sorted."""
    return turn_codes(tables.subnet, alternative_turns(tables))


def alternative_turns(tables: RoutingTables) -> npt.NDArray[np.bool_]:
    """The turns ([middle switch, in port, out port], see `cdg.block_turns`) of every path host traffic
    can take when each switch may forward over any of its alternatives toward the destination's switch.

    All destination switches at once, as bitsets of destination switches per [switch, port]: which
    switches host traffic toward each destination can reach (grown from the switches with hosts), then,
    per middle switch m, which of its incoming channels meet which of its outgoing ports for some
    destination (a non-empty AND of the two bitsets).  A k=16 reroute's check took 65 ms walking
    destination switches one by one (and a cache of their bitmaps missed on every cut: a cut changes every
    leaf's alternatives), 6 ms as boolean [switch, port, destination] arrays and a matrix product per
    switch, ~2 ms packed."""
    subnet = tables.subnet
    width = subnet.n_ports
    nbr = subnet.nbr
    is_link = nbr >= 0
    targets = np.unique(subnet.ep_switch).astype(np.intp)
    if targets.size == 0 or not is_link.any():
        return np.zeros((subnet.n_switches, width, width), dtype=bool)
    # allowed[s, p, w]: bit t of word w set where switch s may forward toward destination switch
    # targets[64 w + t] over link port p — destinations packed 64 to a word, so that growing the reach and
    # meeting in ports with out ports are a few thousand word operations instead of boolean cubes
    bits = np.unpackbits(tables.alt[:, targets, :], axis=2, count=width).astype(bool)
    bits &= is_link[:, None, :]
    bits[targets, np.arange(targets.size), :] = False  # at its own switch a packet leaves to a host
    allowed = _pack_targets(bits)
    # the far end of every link port, as (switch, port) into `allowed` (masked where there is no link)
    src_s = np.where(is_link, nbr, 0)
    src_p = np.where(is_link, subnet.nbr_port, 0)
    link_words = np.where(is_link, ~np.uint64(0), np.uint64(0))[:, :, None]
    everyone = np.full(allowed.shape[2], ~np.uint64(0))
    used = np.where(subnet.has_hosts[:, None], everyone[None, :], np.uint64(0))  # [switch, word]
    for _ in range(subnet.n_switches + 1):
        leaving = allowed & used[:, None, :]
        arriving = leaving[src_s, src_p, :] & link_words  # [m, in port, word]: m entered over it
        grown = used | np.bitwise_or.reduce(arriving, axis=1)
        if np.array_equal(grown, used):
            break
        used = grown
    # turns[m, in port, out port]: some destination's traffic enters m over `in port` and leaves on `out port`
    # (word by word: `any` over a uint64 axis converts every element first)
    met = arriving[:, :, None, 0] & allowed[:, None, :, 0]
    for w in range(1, allowed.shape[2]):
        met |= arriving[:, :, None, w] & allowed[:, None, :, w]
    turns: npt.NDArray[np.bool_] = met != 0
    return turns


def _pack_targets(bits: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
    """[switch, target, port] booleans -> [switch, port, word] with target t as bit t % 64 of word t // 64."""
    n, n_targets, width = bits.shape
    words = (n_targets + 63) // 64
    padded = np.zeros((n, width, words * 64), dtype=bool)
    padded[:, :, :n_targets] = bits.transpose(0, 2, 1)
    packed = np.packbits(padded, axis=2, bitorder="little")
    return np.ascontiguousarray(packed).view(np.uint64)


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
