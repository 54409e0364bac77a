"""Routing quality: how evenly traffic spreads, measured on the tables themselves.

Two figures OpenSM users compare engines by:

* all-to-all: every host sends one flow to every other host; the load of a channel (a direction of a link)
  is the number of flows over it.  Reported per tier (leaf->spine, spine->leaf, ...) and over all
  switch-to-switch channels; max/mean = 1 is perfect balance.  Computed per destination as flows
  accumulating down the routing tree, farthest switches first — no per-flow walking.
* shift permutations: host i sends to host (i + s) mod N for every shift s, hosts in CA order (leaf by leaf,
  as OpenSM's `opensm-ftree-ca-order.dump`; see `hostorder`); the worst shift's maximum flows on one
  channel.  1 means the permutation runs without link contention, the
  property fat-tree routing promises; it is what ring and pairwise collectives look like.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.sm.hostorder import host_order
from controller.sm.paths import multi_source_distances
from controller.sm.subnet import F64, I64, NO_PORT, U8, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.walk import ARRIVED, Follow, follow_hosts


@dataclass(frozen=True)
class TierLoad:
    tier: str
    channels: int
    max: float
    mean: float

    @property
    def max_over_mean(self) -> float:
        return self.max / self.mean if self.mean else 0.0


@dataclass(frozen=True)
class ShiftReport:
    hosts: int
    shifts_evaluated: int
    worst_max_flows: int
    worst_shift: int
    shifts_with_contention: int


@dataclass(frozen=True)
class Quality:
    engine: str
    all_to_all: list[TierLoad]
    switch_links: TierLoad
    shift: ShiftReport | None
    channel_load: F64 = field(repr=False)


def channel_index(subnet: Subnet) -> tuple[npt.NDArray[np.intp], int]:
    """Ids of every switch out-port with a cable (to a switch or a host); the value n means none."""
    used = (subnet.nbr >= 0) | (subnet.host_ep >= 0)
    count = int(used.sum())
    ids = np.full(subnet.nbr.shape, count, dtype=np.intp)
    ids[used] = np.arange(count)
    return ids, count


def switch_levels(subnet: Subnet) -> I64:
    """Level 0 = switches with hosts, 1 = one hop above them, ... (for naming tiers only)."""
    return multi_source_distances(subnet, subnet.has_hosts).astype(np.int64)


def _tier_names(subnet: Subnet) -> tuple[npt.NDArray[np.str_], list[str]]:
    ids, count = channel_index(subnet)
    level = switch_levels(subnet)
    names = np.empty(count, dtype=object)
    rows, ports = np.nonzero(ids < count)
    for s, p in zip(rows.tolist(), ports.tolist(), strict=True):
        far = subnet.nbr[s, p]
        names[ids[s, p]] = f"L{level[s]}->host" if far < 0 else f"L{level[s]}->L{level[far]}"
    order = sorted(set(names.tolist()), key=lambda n: (n.endswith("host"), n))
    return names.astype(str), order


#: Called for each hop of `all_to_all_flows`: (switch rows, destination columns within the block, the flows
#: they hand on, the block's walk).
OnHop = Callable[[npt.NDArray[np.intp], npt.NDArray[np.intp], F64, Follow], None]


def all_to_all_flows(
    subnet: Subnet, lft: U8, on_hop: OnHop | None = None
) -> Iterator[tuple[Follow, F64, I64]]:
    """Every host sending to every other under `lft`, a block of destination columns at a time: (the walk,
    flows[s, c] = flows that reach switch s toward column c — its own hosts' included —, hops[s, c] from s
    to the destination switch, -1 where it does not arrive).  Flows are handed on farthest first, so each
    switch's count is complete before it passes it on; `on_hop` sees every hand-over."""
    sources = subnet.hosts_per_switch.astype(np.float64)
    for result in follow_hosts(subnet, lft):
        width = result.cols.size
        flows = np.repeat(sources[:, None], width, axis=1)
        flows[subnet.dest_switch[result.cols], np.arange(width)] -= (
            1.0  # a destination does not send to itself
        )
        hops = np.where(result.outcome == ARRIVED, result.hops, -1)
        nxt = result.next_switch
        for h in range(int(hops.max(initial=0)), 0, -1):
            rows, c = np.nonzero(hops == h)
            f = flows[rows, c]
            if on_hop is not None:
                on_hop(rows, c, f, result)
            np.add.at(flows, (nxt[rows, c], c), f)
        yield result, flows, hops


def all_to_all_load(tables: RoutingTables) -> F64:
    """Flows per switch out-port channel (see `channel_index`) when every host sends to every other."""
    subnet = tables.subnet
    ids, count = channel_index(subnet)
    load = np.zeros(count + 1, dtype=np.float64)

    def hand_on(rows: npt.NDArray[np.intp], c: npt.NDArray[np.intp], f: F64, result: Follow) -> None:
        np.add.at(load, ids[rows, result.port.astype(np.intp)[rows, c]], f)

    for result, flows, _ in all_to_all_flows(subnet, tables.lft, hand_on):
        # last hop: the destination switch hands all collected flows to the host
        c = np.arange(result.cols.size)
        targets = subnet.dest_switch[result.cols]
        final_port = result.port.astype(np.intp)[targets, c]
        ok = (final_port != NO_PORT) & (final_port > 0)
        np.add.at(load, ids[targets[ok], final_port[ok]], flows[targets[ok], c[ok]])
    return load[:count]


def shift_report(
    tables: RoutingTables,
    max_shifts: int | None = None,
    batch: int = 0,
    order: npt.NDArray[np.int64] | None = None,
) -> ShiftReport:
    """Worst shift permutation over switch-to-switch channels.  With `max_shifts`, a deterministic spread of
    shifts (every (N-1)/max_shifts-th) is evaluated instead of all N-1.  Hosts are taken in CA order
    (`hostorder.host_order`) unless `order` (endpoint indices) says otherwise — e.g. the order of another
    SM's `opensm-ftree-ca-order.dump` when judging its tables."""
    subnet = tables.subnet
    n = int(subnet.ep_lids.size)
    if order is None:
        order = (tables.ca_order or host_order(subnet)).order
    elif sorted(order.tolist()) != list(range(n)):
        raise ValueError("order must list every host endpoint exactly once")
    if n < 2:
        return ShiftReport(n, 0, 0, 0, 0)
    shifts = np.arange(1, n, dtype=np.int64)
    if max_shifts is not None and shifts.size > max_shifts:
        shifts = np.unique(np.linspace(1, n - 1, max_shifts).round().astype(np.int64))
    chan, n_chan = subnet.switch_channels
    width = tables.lft.shape[1]
    flat_lft = tables.lft.reshape(-1)
    nbr_flat = subnet.nbr.reshape(-1)
    chan_flat = chan.reshape(-1)
    ports = subnet.n_ports
    src_switch = subnet.ep_switch[order].astype(np.int64)
    dst_lid = subnet.ep_lids[order].astype(np.int64)
    step = batch or max(1, (1 << 22) // n)
    worst, worst_shift, contended = 0, 0, 0
    max_hops = subnet.n_switches
    for start in range(0, shifts.size, step):
        chunk = shifts[start : start + step]
        k = chunk.size
        src = np.tile(np.arange(n, dtype=np.int64), k)
        dst = (src + np.repeat(chunk, n)) % n
        cur = src_switch[src]
        lid = dst_lid[dst]
        offset = np.repeat(np.arange(k, dtype=np.int64) * (n_chan + 1), n)
        counts = np.zeros(k * (n_chan + 1), dtype=np.int64)
        active = np.ones(cur.size, dtype=bool)
        for _ in range(max_hops):
            idx = np.flatnonzero(active)
            if idx.size == 0:
                break
            port = flat_lft[cur[idx] * width + lid[idx]].astype(np.int64)
            valid = (port != NO_PORT) & (port < ports)
            cell = cur[idx] * ports + np.where(valid, port, 0)
            nxt = np.where(valid, nbr_flat[cell], -1)
            moving = nxt >= 0
            counts += np.bincount(offset[idx[moving]] + chan_flat[cell[moving]], minlength=counts.size)
            cur[idx[moving]] = nxt[moving]
            active[idx[~moving]] = False
        per_shift = counts.reshape(k, n_chan + 1)[:, :n_chan].max(axis=1, initial=0)
        i = int(per_shift.argmax())
        if per_shift[i] > worst:
            worst, worst_shift = int(per_shift[i]), int(chunk[i])
        contended += int((per_shift > 1).sum())
    return ShiftReport(n, int(shifts.size), worst, worst_shift, contended)


def quality(
    tables: RoutingTables,
    shifts: bool = True,
    max_shifts: int | None = None,
    ca_order: npt.NDArray[np.int64] | None = None,
) -> Quality:
    subnet = tables.subnet
    load = all_to_all_load(tables)
    names, order = _tier_names(subnet)
    tiers = []
    for tier in order:
        values = load[names == tier]
        tiers.append(TierLoad(tier, int(values.size), float(values.max()), float(values.mean())))
    switch_mask = ~np.char.endswith(names, "host")
    sw = load[switch_mask]
    switch_links = TierLoad(
        "switch links", int(sw.size), float(sw.max(initial=0.0)), float(sw.mean()) if sw.size else 0.0
    )
    report = shift_report(tables, max_shifts, order=ca_order) if shifts else None
    return Quality(tables.engine, tiers, switch_links, report, load)


__all__ = [
    "Quality",
    "ShiftReport",
    "TierLoad",
    "all_to_all_load",
    "channel_index",
    "quality",
    "shift_report",
]
