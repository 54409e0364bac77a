"""Following forwarding tables for every (switch, destination) at once.

Verification and quality figures both need to know, for each switch and destination, where the table sends
a packet next, whether it arrives, and in how many hops.  `follow` answers for a block of destinations with
pointer doubling: after ceil(log2(S)) squarings of the "next switch" map every start has reached the
destination, a dead end, or sits in a loop — no per-packet walking, and loops are detected exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import I32, NO_PORT, U8, Subnet

ARRIVED = -1
DEAD = -2


@dataclass(frozen=True)
class Follow:
    """Result for destination columns `cols` (indices into subnet.dest_lids)."""

    cols: npt.NDArray[np.intp]
    #: next_switch[s, c]: switch the entry forwards to; ARRIVED at the destination; DEAD if nowhere.
    next_switch: I32
    #: port[s, c]: the table entry.
    port: U8
    #: outcome[s, c]: ARRIVED, DEAD, or (>= 0) a switch on the loop the packet ends up circling.
    outcome: I32
    #: hops[s, c]: switch-to-switch links travelled before arriving (valid where outcome == ARRIVED).
    hops: I32


def column_blocks(subnet: Subnet, budget: int = 1 << 22) -> Iterator[npt.NDArray[np.intp]]:
    step = max(1, budget // max(1, subnet.n_switches))
    n = subnet.dest_lids.size
    for start in range(0, n, step):
        yield np.arange(start, min(n, start + step), dtype=np.intp)


def follow_hosts(subnet: Subnet, lft: U8) -> Iterator[Follow]:
    """`follow` over the host destinations only, a block of columns at a time."""
    host_cols = np.flatnonzero(subnet.dest_is_host)
    for block in column_blocks(subnet):
        cols = np.intersect1d(block, host_cols)
        if cols.size:
            yield follow(subnet, lft, cols)


def next_hops(subnet: Subnet, lft: U8, cols: npt.NDArray[np.intp]) -> tuple[I32, U8]:
    n = subnet.n_switches
    lids = subnet.dest_lids[cols]
    port = lft[:, lids]  # (S, C)
    valid_port = (port != NO_PORT) & (port < subnet.n_ports)
    safe = np.where(valid_port, port, 0).astype(np.intp)
    rows = np.arange(n)[:, None]
    nxt = np.where(valid_port, subnet.nbr[rows, safe], -1)
    target = subnet.dest_switch[cols][None, :]
    final = (rows == target) & (port == subnet.dest_port[cols][None, :])
    result = np.where(final, ARRIVED, np.where(nxt >= 0, nxt, DEAD)).astype(np.int32)
    return result, port


def follow(subnet: Subnet, lft: U8, cols: npt.NDArray[np.intp]) -> Follow:
    n = subnet.n_switches
    nxt, port = next_hops(subnet, lft, cols)
    # Absorbing states n (arrived) and n+1 (dead) so that the map is total on 0..n+1.
    succ = np.where(nxt == ARRIVED, n, np.where(nxt == DEAD, n + 1, nxt)).astype(np.intp)
    width = succ.shape[1]
    succ = np.vstack([succ, np.full((2, width), n, dtype=np.intp)])
    succ[n + 1] = n + 1
    dist = np.where(succ < n, 1, 0).astype(np.int32)
    dist[n:] = 0
    steps = 1
    while steps <= n + 1:
        dist = dist + np.take_along_axis(dist, succ, axis=0)
        succ = np.take_along_axis(succ, succ, axis=0)
        steps *= 2
    end = succ[:n]
    outcome = np.where(end == n, ARRIVED, np.where(end == n + 1, DEAD, end)).astype(np.int32)
    return Follow(cols=cols, next_switch=nxt, port=port, outcome=outcome, hops=dist[:n])


__all__ = ["ARRIVED", "DEAD", "Follow", "column_blocks", "follow", "follow_hosts", "next_hops"]
