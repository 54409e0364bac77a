"""sssp's balancing loop over compact candidate blocks, for fabrics too wide for the plain-Python form.

The loop over destinations is sequential (each sees the loads of those before), so what a destination
costs is a count of array operations, not arithmetic: on a damaged k=16 fat-tree (320 switches, 1,344
destinations, up to 3 rounds) the earlier form spent ~170 us per destination on ~110 small operations —
gathering each level's rows out of (switch x port) tables, masking non-candidates to infinity, writing
the table column, and re-gathering the chosen ports to push flows and again to rip them up.

Here everything that depends only on the destination switch is prepared once per routing, for all
destination switches in one pass of array operations (`Plans`): per distance level, a (switches x
candidates) block of channel ids and of positions in a small per-target cost array, candidates in
preference order and padded with a slot whose cost is infinite.  A destination then takes about five
operations per level (gather loads, add the nearer switches' path costs, argmin, pick the chosen cost out
of the block — `min` along rows costs several times more), three to resolve its choices, one per level to
carry flows and one to charge them; its charges are kept so that ripping it up is one operation, and the
table is written once at the end.

Same inputs, same tables as the earlier per-level loop (kept verbatim in `tests/test_sssp_vector.py`):
costs are the same float operations (load x weight + path cost; the multiplication is skipped only when
every weight is exactly 1.0, which leaves every product unchanged), candidates keep preference order so
`argmin` breaks ties the same way, padding costs infinity, and flows are whole numbers, so loads do not
depend on the order of addition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import U8

#: Positions in a plan's cost/flow arrays: the destination switch itself, then the padding slot.
_TARGET, _PAD, _FIRST = 0, 1, 2


def _starts(counts: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """Exclusive prefix sums: where each of consecutive runs of these lengths starts."""
    out = np.zeros(counts.size, dtype=np.intp)
    np.cumsum(counts[:-1], out=out[1:])
    return out


@dataclass(frozen=True)
class Level:
    """One distance level of one destination switch: rows `start:stop` of its plan (nearest first).

    `channel[r, j]` / `weight[r, j]` / `near[r, j]`: the j-th candidate (preference order) of the level's
    r-th switch — its channel, its cost per flow, and the position of the switch it leads to in the plan's
    cost array (`_PAD` for padding).  `weight` is None when every weight is exactly 1.0.  `single`: every
    switch of the level has one candidate (its choice is always 0).  `row_base[r]` = r x width, to pick
    the chosen cost out of the flat block; `cost` / `choice` / `index`: views of the plan's scratch space."""

    start: int
    stop: int
    channel: npt.NDArray[np.intp]
    weight: npt.NDArray[np.float64] | None
    near: npt.NDArray[np.intp]
    single: bool
    row_base: npt.NDArray[np.intp]
    cost: npt.NDArray[np.float64]
    choice: npt.NDArray[np.intp]
    index: npt.NDArray[np.intp]


@dataclass(frozen=True)
class Plan:
    """Everything about one destination switch that does not depend on loads.

    `switches`: the switches that route towards it (0 < distance < 255), nearest first; `levels`: their
    distance levels, nearest first; `first[r]`: where row r's candidates start in the flat `channel`
    and `near` arrays (row-major over the levels' blocks); `host_sources` / `switch_sources`:
    flows each row's switch sends to a host / switch destination, behind the two leading slots.
    `path_cost` (by position: the destination switch, padding, then the rows) and `choice` are scratch
    space for one destination at a time (see `Level`)."""

    switches: npt.NDArray[np.intp]
    levels: tuple[Level, ...]
    first: npt.NDArray[np.intp]
    channel: npt.NDArray[np.intp]
    near: npt.NDArray[np.intp]
    host_sources: npt.NDArray[np.float64]
    switch_sources: npt.NDArray[np.float64]
    path_cost: npt.NDArray[np.float64]
    choice: npt.NDArray[np.intp]


#: Plans are built for as many destination switches at once as keep the (switch x target x port)
#: temporaries near this many cells.
CHUNK_CELLS = 1 << 18

#: Bits set per byte value (the candidate count of packed candidate bits).
_POPCOUNT = np.array([bin(v).count("1") for v in range(256)], dtype=np.uint8)


def cells(alt: U8, destinations: int) -> int:
    """What this form keeps, in array cells: every (switch, destination switch, candidate) triple, and per
    destination one charge per switch.  `SsspEngine` uses it only while this is small.  Counted a block of
    rows at a time, so that asking on a large fabric costs no second copy of `alt`."""
    n = int(alt.shape[0])
    step = max(1, CHUNK_CELLS // max(1, alt[:1].size))
    triples = sum(int(_POPCOUNT[alt[lo : lo + step]].sum(dtype=np.int64)) for lo in range(0, n, step))
    return triples + destinations * n


class Plans:
    """`plans[t]`: the `Plan` of destination switch t, for all destination switches, built a block of
    them at a time (`CHUNK_CELLS`) in one pass of array operations."""

    def __init__(
        self,
        dist: U8,
        alt: U8,
        n_ports: int,
        preference: npt.NDArray[np.intp],
        channel: npt.NDArray[np.intp],
        weight: npt.NDArray[np.float64],
        next_switch: npt.NDArray[np.intp],
        host_sources: npt.NDArray[np.float64],
        n_channels: int,
    ) -> None:
        """`alt[s, t]`: packed bits of switch s's shortest-path ports towards switch t; `preference[s]`:
        switch s's ports in tie-breaking order; `channel`, `weight`, `next_switch`: per (switch, port), with
        `n_channels` the channel id of ports without one."""
        self.dist, self.alt, self.n_ports = dist, alt, n_ports
        self.preference, self.channel, self.next_switch = preference, channel, next_switch
        self.weight = weight
        self.host_sources = host_sources
        self.n_channels = n_channels
        # Exact: load x 1.0 is load, so the multiplication can go when every weight is 1.0.
        self.unweighted = bool((weight == 1.0).all())
        #: The port each channel leaves by (to write the tables from the channels chosen).
        self.port_of = np.zeros(n_channels + 1, dtype=np.uint8)
        on, by = np.nonzero(channel < n_channels)
        self.port_of[channel[on, by]] = by
        n = dist.shape[0]
        step = max(1, CHUNK_CELLS // max(1, n * n_ports))
        self.plans: list[Plan] = []
        for lo in range(0, n, step):
            self.plans.extend(self.build(np.arange(lo, min(n, lo + step), dtype=np.intp)))

    def __getitem__(self, target: int) -> Plan:
        return self.plans[target]

    def build(self, targets: npt.NDArray[np.intp]) -> list[Plan]:
        """The plans of these destination switches (rows of all of them at once, then sliced)."""
        n = self.dist.shape[0]
        c = targets.size
        # Rows: per target, the switches that route to it by (distance, index) — `_Levels`' order.
        dist = np.ascontiguousarray(self.dist[:, targets].T)
        order = np.argsort(dist, axis=1, kind="stable")
        ordered = np.take_along_axis(dist, order, axis=1)
        k_idx, col = np.nonzero((ordered > 0) & (ordered < 255))
        rows = order[k_idx, col].astype(np.intp)
        depth = ordered[k_idx, col]
        n_rows = np.bincount(k_idx, minlength=c)
        row_start = _starts(n_rows)
        # Candidates in preference order: each switch's bits permuted once, then (switch, target, rank).
        p = self.n_ports
        bits = np.unpackbits(self.alt[:, targets, :], axis=2, count=p).view(bool)
        if 8 * c >= n:  # a few targets: one gather; many: one column permutation per switch is cheaper
            for s, columns in enumerate(self.preference):
                bits[s] = bits[s][:, columns]
        else:
            bits = np.take_along_axis(bits, self.preference[:, None, :], axis=2)
        s_idx, t_idx, j_idx = np.nonzero(bits)  # by switch, target, then preference
        row_of = np.full((c, n), -1, dtype=np.intp)
        row_of[k_idx, rows] = np.arange(rows.size)
        pair = t_idx * n + s_idx
        r_idx = row_of.reshape(-1).take(pair)  # only rows have candidates (0 < distance < 255)
        counts = np.bincount(r_idx, minlength=rows.size)
        new_pair = np.ones(pair.size, dtype=bool)
        new_pair[1:] = pair[1:] != pair[:-1]
        pair_start = np.flatnonzero(new_pair)
        rank = np.arange(pair.size) - np.repeat(pair_start, np.diff(np.append(pair_start, pair.size)))
        # Levels: runs of one target and one distance; every row of a level is padded to its widest.
        new = np.ones(rows.size, dtype=bool)
        new[1:] = (k_idx[1:] != k_idx[:-1]) | (depth[1:] != depth[:-1])
        level_start = np.flatnonzero(new)
        level_width = np.maximum.reduceat(counts, level_start) if rows.size else counts
        row_width = np.repeat(level_width, np.diff(np.append(level_start, rows.size)))
        first = _starts(row_width)
        total = int(row_width.sum())
        # Position of every switch in each target's cost array: the target, padding, then its rows.
        position = row_of - row_start[:, None] + _FIRST
        position[row_of < 0] = _PAD
        position[np.arange(c), targets] = _TARGET
        at = first.take(r_idx) + rank
        ports = self.preference.reshape(-1).take(s_idx * p + j_idx)
        port_index = s_idx * p + ports
        # Padding: the unused channel, towards the slot whose path cost is infinite.
        flat_channel = np.full(total, self.n_channels, dtype=np.intp)
        flat_channel[at] = self.channel.reshape(-1).take(port_index)
        flat_near = np.full(total, _PAD, dtype=np.intp)
        flat_near[at] = position.reshape(-1).take(t_idx * n + self.next_switch.reshape(-1).take(port_index))
        flat_weight = np.ones(0 if self.unweighted else total, dtype=np.float64)
        if not self.unweighted:
            flat_weight[at] = self.weight.reshape(-1).take(port_index)
        host_sources = self.host_sources[rows]
        slot_start = np.append(first, total)[np.append(row_start, rows.size)].tolist()
        level_bounds = np.append(level_start, rows.size)
        levels_of = [*_starts(np.bincount(k_idx[level_start], minlength=c)).tolist(), level_start.size]
        built = []
        for k in range(c):
            r0, r1 = int(row_start[k]), int(row_start[k]) + int(n_rows[k])
            s0 = slot_start[k]
            path_cost = np.full(r1 - r0 + _FIRST, np.inf)
            path_cost[_TARGET] = 0.0
            choice = np.zeros(r1 - r0, dtype=np.intp)
            levels = []
            for lv in range(levels_of[k], levels_of[k + 1]):
                lo, hi, m = int(level_bounds[lv]), int(level_bounds[lv + 1]), int(level_width[lv])
                a = int(first[lo]) - s0
                b, g, lo, hi = a + (hi - lo) * m, hi - lo, lo - r0, hi - r0
                levels.append(
                    Level(
                        lo,
                        hi,
                        flat_channel[s0 + a : s0 + b].reshape(g, m),
                        None if self.unweighted else flat_weight[s0 + a : s0 + b].reshape(g, m),
                        flat_near[s0 + a : s0 + b].reshape(g, m),
                        m == 1,
                        np.arange(g, dtype=np.intp) * m,
                        path_cost[_FIRST + lo : _FIRST + hi],
                        choice[lo:hi],
                        np.zeros(g, dtype=np.intp),
                    )
                )
            s1 = slot_start[k + 1]
            built.append(
                Plan(
                    rows[r0:r1],
                    tuple(levels),
                    first[r0:r1] - s0,
                    flat_channel[s0:s1],
                    flat_near[s0:s1],
                    np.concatenate(([0.0, 0.0], host_sources[r0:r1])),
                    np.concatenate(([0.0, 0.0], np.ones(r1 - r0))),
                    path_cost,
                    choice,
                )
            )
        return built


def balance(
    plans: Plans,
    order: Sequence[int],
    dest_lids: Sequence[int],
    dest_switch: Sequence[int],
    dest_is_host: Sequence[bool],
    n_channels: int,
    rounds: int,
    imbalance: Callable[[npt.NDArray[np.float64]], float],
    balanced: float,
    lft: npt.NDArray[np.uint8],
) -> None:
    """sssp's rounds (see `SsspEngine`) writing each destination's chosen ports into `lft`."""
    load = np.zeros(n_channels + 1, dtype=np.float64)
    host_load = np.zeros_like(load)  # the part of `load` that host traffic puts there
    #: Per destination: the channels its rows chose and the flows charged on them.
    charged: dict[int, tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]] = {}
    previous = np.inf
    for _ in range(rounds):
        for i in order:
            plan = plans[dest_switch[i]]
            host = dest_is_host[i]
            old = charged.get(i)
            if old is not None:  # rip up, reroute against all the others
                used, flows = old
                load[used] -= flows
                if host:
                    host_load[used] -= flows
            # Nearest first: the cheapest shortest path from each switch, as a sum of link loads.
            levels, path_cost = plan.levels, plan.path_cost
            last = len(levels) - 1
            for k, level in enumerate(levels):
                if level.single:  # one candidate per switch: its cost is the path cost
                    if k < last:
                        cost = level.cost
                        load.take(level.channel[:, 0], out=cost)
                        if level.weight is not None:
                            cost *= level.weight[:, 0]
                        cost += path_cost.take(level.near[:, 0])
                    continue
                cost = load.take(level.channel)
                if level.weight is not None:
                    cost *= level.weight
                cost += path_cost.take(level.near)
                cost.argmin(axis=1, out=level.choice)
                if k < last:  # nothing is nearer the farthest level's switches
                    np.add(level.row_base, level.choice, out=level.index)
                    cost.reshape(-1).take(level.index, out=level.cost)
            picked = plan.first + plan.choice
            used = plan.channel.take(picked)
            toward = plan.near.take(picked)
            # Farthest first: carry the flows along the chosen tree (the nearest level's go to the
            # destination switch itself, which charges nothing), then charge the links they use.
            carried = (plan.host_sources if host else plan.switch_sources).copy()
            for level in levels[:0:-1]:
                carried += np.bincount(
                    toward[level.start : level.stop],
                    weights=carried[_FIRST + level.start : _FIRST + level.stop],
                    minlength=carried.size,
                )
            flows = carried[_FIRST:]
            load[used] += flows
            if host:
                host_load[used] += flows
            charged[i] = (used, flows)
        worst = imbalance(host_load[:n_channels])
        if worst <= balanced or worst >= previous - 1e-9:
            break
        previous = worst
    for i, (used, _) in charged.items():
        lft[plans[dest_switch[i]].switches, dest_lids[i]] = plans.port_of.take(used)


__all__ = ["Level", "Plan", "Plans", "balance", "cells"]
