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

import contextlib
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.sm.cdg import (
    acyclic_core,
    block_dependencies,
    destination_layers,
    find_cycles,
    layer_cycles,
    merge,
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
    deps: list[tuple[I64, I64]] = []
    for cols in column_blocks(subnet):
        result = follow(subnet, lft, cols)
        dead += int((result.outcome == DEAD).sum())
        loops += int((result.outcome >= 0).sum())
        host_cols = subnet.dest_is_host[cols]
        if not host_cols.any():
            continue
        if deadlock and tables.layers is None:
            deps.append(block_dependencies(subnet, result, per_destination=False))
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
    if deadlock and tables.layers is not None:
        report = _layered_report(tables)  # layered tables: alternatives are not checked per layer
    elif deadlock:
        merged = merge(deps, False, subnet.switch_channels[1])
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
    switch may forward over any of its alternatives toward the destination's switch, sorted.

    A dependency is a channel in and a port out of the switch that channel enters, so the union over
    destinations is a (channel, port) bitmap: marking it costs a fancy-index store per destination, where
    hashing each destination's codes (np.unique) was 80 % of a k=16 reroute's verification.  Each
    destination switch's bitmap is remembered (`_TargetCache`): after a cable cut most destination
    switches' alternatives are what they were, and their bitmaps are taken, not walked again."""
    subnet = tables.subnet
    chan, n_chan = subnet.switch_channels
    n, width = subnet.n_switches, subnet.n_ports
    nbr = subnet.nbr
    is_link = nbr >= 0
    common = np.packbits(subnet.has_hosts).tobytes() + np.array([n, width], dtype=np.int64).tobytes()
    union = np.zeros((n * width, (width + 7) // 8), dtype=np.uint8)
    for t in np.unique(subnet.ep_switch).tolist():
        allowed = np.unpackbits(tables.alt[:, t, :], axis=1, count=width).astype(bool) & is_link
        allowed[t] = False  # at the destination's switch the packet leaves to a host
        key = hashlib.blake2b(
            common + np.packbits(allowed).tobytes() + np.where(allowed, nbr, -1).astype(np.int32).tobytes(),
            digest_size=16,
        ).digest()
        bitmap = _TARGETS.get(key)
        if bitmap is None:
            bitmap = _target_dependencies(subnet, allowed)
            _TARGETS.put(key, bitmap)
        union |= bitmap
    sp, q = np.nonzero(np.unpackbits(union, axis=1, count=width))
    rows, ports = sp // width, sp % width
    c_in = chan[rows, ports]
    codes = c_in.astype(np.int64) * n_chan + chan[nbr[rows, ports], q]
    return np.sort(codes)


def _target_dependencies(subnet: Subnet, allowed: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint8]:
    """Packed bitmap [upstream switch * width + its port, out port of the switch that port leads to] of
    every dependency host traffic toward one destination switch can create over `allowed`."""
    n, width = subnet.n_switches, subnet.n_ports
    nbr = subnet.nbr
    depends = np.zeros((n * width, width), dtype=bool)
    # switches host traffic toward the destination can reach
    used = subnet.has_hosts.copy()
    while True:
        rows, ports = np.nonzero(allowed & used[:, None])
        grown = used.copy()
        grown[nbr[rows, ports]] = True
        if (grown == used).all():
            break
        used = grown
    if rows.size:
        mid = nbr[rows, ports]
        # every way on from each middle switch
        e_idx, q = np.nonzero(allowed[mid])
        depends[rows[e_idx] * width + ports[e_idx], q] = True
    packed: npt.NDArray[np.uint8] = np.packbits(depends, axis=1)
    return packed


class _TargetCache:
    """Per destination switch dependency bitmaps, by a digest of everything they depend on (the allowed
    ports, where they lead, which switches have hosts); least recently used dropped past `limit_bytes`.
    No lock (the core owns no threads): two verifications at once can at worst miss a hit or drop an
    extra entry, never return a wrong bitmap (a key names its contents)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._items: OrderedDict[bytes, npt.NDArray[np.uint8]] = OrderedDict()
        self._bytes = 0
        #: Lookups answered from the cache (for tests and benchmarks).
        self.hits = 0

    def get(self, key: bytes) -> npt.NDArray[np.uint8] | None:
        value = self._items.get(key)
        if value is not None:
            self.hits += 1
            with contextlib.suppress(KeyError):
                self._items.move_to_end(key)
        return value

    def put(self, key: bytes, value: npt.NDArray[np.uint8]) -> None:
        if key in self._items or value.nbytes > self.limit_bytes:
            return
        self._items[key] = value
        self._bytes += value.nbytes
        while self._bytes > self.limit_bytes and self._items:
            try:
                _, dropped = self._items.popitem(last=False)
            except KeyError:
                break
            self._bytes -= dropped.nbytes


#: k=16: 11.6 KB per destination switch, 1.5 MB per fabric; k=32: 211 KB, 108 MB (more than the limit:
#: there every verification walks again, as without the cache).
_TARGETS = _TargetCache(64 << 20)


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
