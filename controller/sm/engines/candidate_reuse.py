"""ftree's first pass (every switch's up*/down* candidate ports toward every switch) without redoing the
switches a change did not reach.

A switch's candidates toward switch t are a function of its own ports (neighbours, which lead up or down)
and of the up*/down* and hop distances toward t from it and from its neighbours (column t of the distance
matrices).  After a cable cut or a switch loss few columns change: candidates toward the other switches,
of switches whose ports are unchanged, are taken from the last routing of a fabric with the same switches
(or a superset: a lost switch renumbers the others).  At k=16 the pass is ~15 ms of a ~40 ms routing and
a cut changes 17-25 columns of 320.

A memo, not state: a routing is the same whether or not it found one (tested along walks of cuts, restores
and switch losses); bounded to the last `KEEP` routings.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from controller.sm.orientation import Orientation
from controller.sm.subnet import INF, U8, Bool, Renumbering, Subnet

#: Routings remembered (each ~1 MB at k=16).
KEEP = 2


@dataclass(frozen=True)
class _Pass:
    """One routing's first pass and everything it depended on."""

    index: Mapping[str, int]  # switch name -> row
    nbr: npt.NDArray[np.int32]
    up: Bool
    down: Bool
    distances: tuple[U8, ...]
    alt: U8
    strength: npt.NDArray[np.int16]


_recent: deque[_Pass] = deque(maxlen=KEEP)


class Candidates(Protocol):
    def __call__(self, rows: npt.NDArray[np.intp], cols: npt.NDArray[np.intp] | None = None) -> Bool: ...


def forget() -> None:
    """Drop the memo (tests compare routings with and without it)."""
    _recent.clear()


def first_pass(
    subnet: Subnet,
    o: Orientation,
    candidates: Candidates,
    strong: int,
    block_rows: int,
) -> tuple[U8, npt.NDArray[np.int16]]:
    """(alt: packed candidate ports per switch pair; strength[s, t]: how many candidates switch s has
    toward t while climbing, `strong` where it can go down; a last row of `strong`)."""
    n, width = subnet.n_switches, subnet.n_ports
    hops = o.hops if o.hops is not None else np.zeros((n, n), dtype=np.uint8)
    distances = (o.ud.dist, o.ud.down_dist, hops)
    alt = np.zeros((n, n, (width + 7) // 8), dtype=np.uint8)
    strength = np.full((n + 1, n), strong, dtype=np.int16)
    everything: npt.NDArray[np.intp] = np.arange(n, dtype=np.intp)
    rows = everything  # computed whole: all of them, or those whose own ports changed
    for before in reversed(_recent):
        reuse = _unchanged(subnet, o, distances, before)
        if reuse is not None:
            renumbering, rows, cols = reuse
            alt[:] = renumbering.grid(before.alt)
            strength[:n] = renumbering.grid(before.strength[:-1])  # less its last row ("strong")
            _fill(alt, strength, o, candidates, strong, block_rows, everything, cols)
            break
    _fill(alt, strength, o, candidates, strong, block_rows, rows, None)
    _recent.append(_Pass(subnet.switch_index, subnet.nbr, o.ud.up, o.ud.down, distances, alt, strength))
    return alt, strength


def _fill(
    alt: U8,
    strength: npt.NDArray[np.int16],
    o: Orientation,
    candidates: Candidates,
    strong: int,
    block_rows: int,
    rows: npt.NDArray[np.intp],
    cols: npt.NDArray[np.intp] | None,
) -> None:
    """Candidates of switches `rows` toward `cols` (None: every switch) into `alt` and `strength`."""
    if rows.size == 0 or (cols is not None and cols.size == 0):
        return
    step = block_rows if cols is None else max(1, block_rows * alt.shape[1] // cols.size)
    for start in range(0, rows.size, step):
        block = rows[start : start + step]
        mask = candidates(block, cols)
        climbing = o.ud.down_dist[block] == INF
        if cols is None:
            alt[block] = np.packbits(mask, axis=2)
            strength[block] = np.where(climbing, mask.sum(axis=2), strong)
        else:
            grid = np.ix_(block, cols)
            alt[grid] = np.packbits(mask, axis=2)
            strength[grid] = np.where(climbing[:, cols], mask.sum(axis=2), strong)


def _unchanged(
    subnet: Subnet, o: Orientation, distances: tuple[U8, ...], before: _Pass
) -> tuple[Renumbering, npt.NDArray[np.intp], npt.NDArray[np.intp]] | None:
    """(each switch's row in `before`; the switches whose own ports changed: every candidate is
    computed again; the switches toward which some distance changed: every switch's candidates toward
    them are computed again), or None when `before` cannot say (a switch it did not have, another port
    count).  A candidate of s toward t depends on s's ports and on column t of the distances only."""
    n = subnet.n_switches
    if before.up.shape[1] != o.ud.up.shape[1]:
        return None
    renumbering = subnet.renumbering(before.index)
    if not renumbering.complete:
        return None
    old_of = renumbering.old_of
    new_of = np.full(len(before.index) + 1, -1, dtype=np.int64)  # last: "no neighbour"
    new_of[old_of] = np.arange(n)
    changed = np.zeros(n, dtype=bool)  # columns: a distance toward that switch changed
    for now, then in zip(distances, before.distances, strict=True):
        changed |= (now != renumbering.grid(then)).any(axis=0)
    old_nbr = renumbering.rows(before.nbr)
    moved_nbr = new_of[np.where(old_nbr >= 0, old_nbr, -1)]
    up, down = renumbering.rows(before.up), renumbering.rows(before.down)
    own = (moved_nbr != subnet.nbr) | (up != o.ud.up) | (down != o.ud.down)
    rows = np.flatnonzero(own.any(axis=1)).astype(np.intp)
    return renumbering, rows, np.flatnonzero(changed).astype(np.intp)


__all__ = ["KEEP", "first_pass", "forget"]
