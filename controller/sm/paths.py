"""Hop distances and equal-cost next hops, computed for all switch pairs at once.

Breadth-first search runs on all targets simultaneously: the set of targets a switch reaches in h hops is a
bit row, rows of neighbours are OR-ed together (`numpy.packbits`), so one BFS level over a 2,880-switch
fabric is a few dozen vector operations on 1 MB arrays instead of millions of Python steps.

Two families of paths:

* unrestricted shortest paths (`hop_distances`) — minhop and sssp;
* up*/down* paths for an orientation of the links (`UpDown`) — updn and ftree.  A packet may go up any number
  of times and then down, never up again.  With destination-based tables every switch must be able to
  honour that whatever way the packet arrived, so a switch that can reach the destination by going only down
  always does (`down-phase`), and the others go up towards a switch that can; `UpDown.dist` is the resulting
  hop count.  Routes built this way are legal up*/down* routes, hence free of deadlock with one VL.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import I32, INF, U8, Bool, Subnet


def _with_sentinel(nbr: I32) -> npt.NDArray[np.intp]:
    """Neighbour table whose missing entries point at an extra all-zero row (index = number of switches)."""
    n = nbr.shape[0]
    return np.where(nbr >= 0, nbr, n).astype(np.intp)


def _spread(front: U8, cols: npt.NDArray[np.intp]) -> U8:
    """Row s of the result = OR of the rows of `front` named in cols[s, :] (a sentinel row is zero)."""
    padded = np.vstack([front, np.zeros((1, front.shape[1]), dtype=np.uint8)])
    out = np.zeros_like(front)
    for k in range(cols.shape[1]):
        column = cols[:, k]
        if (column < front.shape[0]).any():
            out |= padded[column]
    return out


def _set_level(dist: U8, bits: U8, level: int) -> None:
    n = dist.shape[1]
    hit = np.unpackbits(bits, axis=1, count=n).astype(bool)
    dist[hit] = level


def bfs_levels(cols: npt.NDArray[np.intp], start: U8, n: int) -> U8:
    """Distances (S x S, INF = unreachable) of a BFS where switch s may step to the switches in cols[s]."""
    dist = np.full((cols.shape[0], n), INF, dtype=np.uint8)
    visited = start.copy()
    front = start.copy()
    _set_level(dist, front, 0)
    level = 0
    while front.any():
        level += 1
        if level >= INF:
            raise ValueError("fabric diameter exceeds 254 hops")
        front = _spread(front, cols) & ~visited
        visited |= front
        _set_level(dist, front, level)
    return dist


def identity_bits(n: int) -> U8:
    return np.packbits(np.eye(n, dtype=bool), axis=1)


def hop_distances(subnet: Subnet) -> U8:
    """Unrestricted switch-to-switch hop counts: dist[s, t].  Read-only and computed once per subnet
    (the engine's orientation and the verification both ask; ~2 ms each at k=16)."""
    found = _hops.get(subnet)
    if found is None:
        n = subnet.n_switches
        found = bfs_levels(_with_sentinel(subnet.nbr), identity_bits(n), n)
        found.flags.writeable = False
        _hops[subnet] = found
    return found


_hops: weakref.WeakKeyDictionary[Subnet, U8] = weakref.WeakKeyDictionary()


def multi_source_distances(subnet: Subnet, sources: Bool) -> I32:
    """Hop distance of every switch from the nearest switch in `sources` (-1 if unreachable)."""
    cols = _with_sentinel(subnet.nbr)
    dist = np.full(subnet.n_switches, -1, dtype=np.int32)
    front = sources.copy()
    dist[front] = 0
    level = 0
    while front.any():
        level += 1
        reached = np.append(front, False)[cols].any(axis=1) & (dist < 0)
        dist[reached] = level
        front = reached
    return dist


@dataclass(frozen=True)
class UpDown:
    """Up*/down* distances for one orientation.

    up[s, p] / down[s, p]: port p of switch s leads up / down (links in neither are not used).
    down_dist[s, t]: hops from s to t going only down (INF if t is not below s).
    dist[s, t]: hops of the route s takes (down if it can, else up first); INF if unreachable.
    """

    up: Bool
    down: Bool
    down_dist: U8
    dist: U8

    @property
    def reachable(self) -> bool:
        return bool((self.dist != INF).all())


def updown(subnet: Subnet, up: Bool, down: Bool) -> UpDown:
    n = subnet.n_switches
    nbr = subnet.nbr
    down_cols = _with_sentinel(np.where(down, nbr, -1))
    up_cols = _with_sentinel(np.where(up, nbr, -1))
    down_dist = bfs_levels(down_cols, identity_bits(n), n)
    down_bits = np.packbits(down_dist != INF, axis=1)
    dist = down_dist.copy()
    visited = down_bits.copy()
    # Level h = switches whose pure-down distance is h, plus switches without a down path that reach a
    # level-(h-1) switch by one step up.
    front = np.packbits(down_dist == 0, axis=1)
    level = 0
    max_down = int(down_dist[down_dist != INF].max(initial=0))
    while True:
        level += 1
        lifted = _spread(front, up_cols) & ~visited
        visited |= lifted
        _set_level(dist, lifted, level)
        front = np.packbits(down_dist == level, axis=1) | lifted if level <= max_down else lifted
        if not front.any():
            break
        if level >= INF:
            raise ValueError("fabric diameter exceeds 254 hops")
    return UpDown(up=up, down=down, down_dist=down_dist, dist=dist)


class ShortestCandidates:
    """mask(rows)[b, t, p]: port p of switch rows[b] is on a shortest path to switch t."""

    def __init__(self, subnet: Subnet, dist: U8) -> None:
        self.subnet = subnet
        self.dist = dist
        self.padded = np.vstack([dist, np.full((1, dist.shape[1]), INF, dtype=np.uint8)])

    def __call__(self, rows: npt.NDArray[np.intp], cols: npt.NDArray[np.intp] | None = None) -> Bool:
        """`cols`: toward these switches only (mask[b, j, p] for switch cols[j])."""
        nbr = self.subnet.nbr[rows]  # (B, P)
        padded, dist = (
            (self.padded, self.dist) if cols is None else (self.padded[:, cols], self.dist[:, cols])
        )
        far = padded[np.where(nbr >= 0, nbr, self.dist.shape[0])]  # (B, P, T)
        here = dist[rows][:, None, :]  # (B, 1, T)
        mask = (far.astype(np.int16) == here.astype(np.int16) - 1) & (here != INF) & (here > 0)
        return np.ascontiguousarray(mask.transpose(0, 2, 1))


class UpDownCandidates:
    """mask(rows)[b, t, p]: port p of switch rows[b] is a next hop of its up*/down* route to switch t.

    With several roots some switch pairs have no up*/down* route at all (two roots of a fat-tree: going
    from one to the other means down then up).  Hosts are never behind such pairs once the orientation is
    accepted, but every switch LID still needs an entry; `complete_with` (unrestricted hop distances) fills
    those pairs with shortest-path next hops.  That keeps tables loop-free — a legal route never leads into
    a completed one, and completed ones strictly approach the target — and keeps host traffic, which only
    uses legal routes, deadlock-free.
    """

    def __init__(self, subnet: Subnet, ud: UpDown, complete_with: U8 | None = None) -> None:
        self.subnet = subnet
        self.ud = ud
        n = subnet.n_switches
        inf_row = np.full((1, n), INF, dtype=np.uint8)
        self.down_padded = np.vstack([ud.down_dist, inf_row])
        self.all_padded = np.vstack([ud.dist, inf_row])
        self.shortest = ShortestCandidates(subnet, complete_with) if complete_with is not None else None

    def __call__(self, rows: npt.NDArray[np.intp], cols: npt.NDArray[np.intp] | None = None) -> Bool:
        """`cols`: toward these switches only (mask[b, j, p] for switch cols[j])."""
        ud = self.ud
        n = self.subnet.n_switches
        nbr = self.subnet.nbr[rows]
        idx = np.where(nbr >= 0, nbr, n)
        down_dist, dist, down_padded, all_padded = ud.down_dist, ud.dist, self.down_padded, self.all_padded
        if cols is not None:
            down_dist, dist = down_dist[:, cols], dist[:, cols]
            down_padded, all_padded = down_padded[:, cols], all_padded[:, cols]
        here_down = down_dist[rows][:, None, :]
        here = dist[rows][:, None, :]
        in_down_phase = here_down != INF
        # In the down phase only down ports toward a switch one step closer going down; otherwise only up
        # ports toward a switch one step closer on its own route.
        down_ok = ud.down[rows][:, :, None] & (down_padded[idx] == here_down - 1) & in_down_phase
        down_ok &= here_down > 0
        up_ok = ud.up[rows][:, :, None] & (all_padded[idx] == here - 1) & ~in_down_phase & (here != INF)
        mask = down_ok | up_ok
        if self.shortest is not None:
            missing = here == INF
            if missing.any():
                mask |= missing & self.shortest(rows, cols).transpose(0, 2, 1)
        return np.ascontiguousarray(mask.transpose(0, 2, 1))


def blocks(n: int, width: int, size: int = 1 << 22) -> list[npt.NDArray[np.intp]]:
    """Row blocks of 0..n-1 so that a (block x n x width) array stays around `size` elements."""
    step = max(1, size // max(1, n * width))
    return [np.arange(i, min(n, i + step), dtype=np.intp) for i in range(0, n, step)]


__all__ = [
    "ShortestCandidates",
    "UpDown",
    "UpDownCandidates",
    "bfs_levels",
    "blocks",
    "hop_distances",
    "multi_source_distances",
    "updown",
]
