"""Pieces shared by engines: the equal-cost candidate sets and OpenSM-style local port balancing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from controller.sm.hostorder import host_order
from controller.sm.paths import blocks
from controller.sm.subnet import I64, NO_PORT, U8, Bool, Subnet

MaskFn = Callable[[npt.NDArray[np.intp]], Bool]


def alternatives(subnet: Subnet, mask_of: MaskFn) -> U8:
    """Packed candidate bits alt[s, t, :] for every switch pair, computed a block of rows at a time."""
    n, width = subnet.n_switches, subnet.n_ports
    nbytes = (width + 7) // 8
    alt = np.zeros((n, n, nbytes), dtype=np.uint8)
    for rows in blocks(n, width):
        alt[rows] = np.packbits(mask_of(rows), axis=2)
    return alt


class TargetMasks:
    """Unpacks alt[:, t, :] once per destination switch (destinations are visited grouped by switch)."""

    def __init__(self, subnet: Subnet, alt: U8) -> None:
        self.alt = alt
        self.width = subnet.n_ports
        self._target = -1
        self._mask: Bool = np.zeros((subnet.n_switches, self.width), dtype=bool)

    def __call__(self, target: int) -> Bool:
        if target != self._target:
            self._mask = np.unpackbits(self.alt[:, target, :], axis=1, count=self.width).astype(bool)
            self._target = target
        return self._mask


def port_order(subnet: Subnet, pos: I64) -> npt.NDArray[np.intp]:
    """Per switch, its ports sorted by (position of the switch behind, port number); non-switch ports last."""
    n, width = subnet.n_switches, subnet.n_ports
    far_pos = np.where(subnet.nbr >= 0, np.append(pos, n)[np.where(subnet.nbr >= 0, subnet.nbr, n)], n + 1)
    ports = np.broadcast_to(np.arange(width), (n, width))
    return np.lexsort((ports, far_pos), axis=1).astype(np.intp)


def balance_locally(subnet: Subnet, alt: U8, lft: U8) -> None:
    """OpenSM's minhop port choice: for each destination in turn, every switch takes the candidate port that
    already carries the fewest destinations (lowest port number on ties).  Vectorised over switches.

    The order matters (counts evolve).  OpenSM goes by LID, and its LIDs follow the byte-reversed GUID,
    which on its own fabrics is leaf by leaf; fabriclab's LIDs follow the GUID, which on the same fabrics
    interleaves the pods and left up/down's links 26x the mean on OpenSM's k=16.  So hosts go in CA order
    (leaf by leaf, `hostorder`; on fabriclab's generated fabrics the same as LID order), then switch LIDs
    in LID order.  The masks are cached per destination switch; consecutive hosts share one.
    """
    n, width = subnet.n_switches, subnet.n_ports
    counts = np.zeros((n, width), dtype=np.int32)
    big = np.int32(np.iinfo(np.int32).max)
    rows = np.arange(n)
    masks = TargetMasks(subnet, alt)
    first = np.zeros(subnet.max_lid + 1, dtype=np.int64)
    first[subnet.ep_lids[host_order(subnet).order]] = np.arange(subnet.ep_lids.size)
    order = np.lexsort((subnet.dest_lids, first[subnet.dest_lids], ~subnet.dest_is_host))
    for lid, target in zip(subnet.dest_lids[order].tolist(), subnet.dest_switch[order].tolist(), strict=True):
        mask = masks(target)
        choice = np.where(mask, counts, big).argmin(axis=1)
        routed = mask[rows, choice]
        counts[rows, choice] += routed
        lft[:, lid] = np.where(routed, choice, NO_PORT)


__all__ = ["TargetMasks", "alternatives", "balance_locally", "port_order"]
