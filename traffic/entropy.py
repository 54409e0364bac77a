"""UDP source ports as entropy: what the fabric's equal-cost choices see of a RoCEv2 flow.

RoCEv2 puts a flow's entropy in the UDP source port (the destination port is always 4791).  Linux derives it
from the queue pairs: a 20-bit flow label from the product of the local and remote QP numbers, folded into
the 14 low bits of a port in 0xC000..0xFFFF (`flow_sport`) — a fixed port per QP, so per-flow hashing keeps
a QP on one path and two QPs can collide.  A sender that sprays instead gives every packet another port
(`spray_sport`): i × an odd constant, mod 2^14, is a permutation whose low 4, 8 and 12 bits run through
every value in 16, 256 and 4096 packets — so the fabric's slot tables, which read 4-bit windows of the port
at successive switch levels (`controller.sm.policies`), split sprayed traffic exactly evenly at every level
and change their choice on every packet.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import numpy.typing as npt

ROCE_SPORT_BASE = 0xC000
_ENTROPY_MASK = 0x3FFF
#: An odd multiplier (so i -> i * K mod 2^14 is a bijection) whose upper nibbles change on every step.
_SPRAY_STEP = 0x2C9B


def flow_sport(local_qpn: int, remote_qpn: int) -> int:
    """The source port Linux gives a RoCEv2 RC connection: flow label from the QP numbers, folded to 14 bits
    (IBTA annex A17 leaves the choice to the sender; this is rdma_calc_flow_label +
    rdma_flow_label_to_udp_sport in the kernel's ib_verbs.h, recomputed here)."""
    label = (local_qpn & 0xFFFFFF) * (remote_qpn & 0xFFFFFF)
    label ^= label >> 20
    label ^= label >> 40
    label &= 0xFFFFF
    folded = (label & _ENTROPY_MASK) ^ (label >> 14)
    return ROCE_SPORT_BASE | (folded & _ENTROPY_MASK)


def spray_sport(packet: int, offset: int = 0) -> int:
    """The source port of a sprayed flow's `packet`-th packet (`offset` decorrelates flows)."""
    return ROCE_SPORT_BASE | ((packet + offset) * _SPRAY_STEP & _ENTROPY_MASK)


def seeded_sports(seed: str, count: int) -> list[int]:
    """`count` per-flow source ports in RoCE's range, from a seed: the same run gets the same ports (and so
    the same hash placement) whatever the kernel would have picked."""
    rng = random.Random(f"sports:{seed}")
    return [ROCE_SPORT_BASE | rng.getrandbits(14) for _ in range(count)]


#: QPs 0 and 1 are InfiniBand's management QPs; data QPs start here.
QP_BASE = 0x100
#: QP numbers are 24 bits.
QP_SPACE = 1 << 24


def pair_qp(offset: Any, i: Any, j: Any, n: int) -> Any:
    """The QP of ranks i -> j (positions in the rank list) of an n-rank collective whose QPs start at
    `offset`: one QP per ordered pair, dense, so a 4,096-rank all-to-all still fits 24 bits (ints or numpy
    arrays)."""
    index = i * (n - 1) + (j - (j > i))
    return (QP_BASE + offset + index) % QP_SPACE


def flow_sports(qps: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    """`flow_sport(qp, qp)` for many QPs at once (both ends of a QP use the same number here)."""
    q = qps.astype(np.uint64) & np.uint64(0xFFFFFF)
    label = q * q
    label ^= label >> np.uint64(20)
    label ^= label >> np.uint64(40)
    label &= np.uint64(0xFFFFF)
    folded = (label & np.uint64(_ENTROPY_MASK)) ^ (label >> np.uint64(14))
    return (np.uint64(ROCE_SPORT_BASE) | (folded & np.uint64(_ENTROPY_MASK))).astype(np.int32)


def seeded_sport_array(seed: int, count: int) -> npt.NDArray[np.int32]:
    """`count` random RoCE source ports (numpy, seeded): flows whose QPs nobody named."""
    rng = np.random.default_rng(seed)
    return (ROCE_SPORT_BASE | rng.integers(0, 1 << 14, count)).astype(np.int32)


__all__ = [
    "QP_BASE",
    "QP_SPACE",
    "ROCE_SPORT_BASE",
    "flow_sport",
    "flow_sports",
    "pair_qp",
    "seeded_sport_array",
    "seeded_sports",
    "spray_sport",
]
