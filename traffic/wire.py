"""Bytes on the wire: what a payload costs a link, for both instruments (the emulator's agents put exactly
these frames on its links; the simulator loads its links with exactly these bytes).

* A probe datagram of `size_bytes` of UDP payload: + Ethernet (14), IPv4 (20) and UDP (8) headers.
* An RDMA WRITE of `bytes`: `ceil(bytes / mtu)` packets (a zero-length WRITE is one), each carrying `mtu`
  bytes of payload (the last padded to it, as the emulator's agents send it) + Ethernet, IPv4, UDP, the
  BTH (12) and the ICRC (4) — the frame of an RDMA WRITE MIDDLE.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Ethernet (14) + IPv4 (20) + UDP (8): what a probe datagram adds on the wire.
UDP_OVERHEAD_BYTES = 42
#: Ethernet + IPv4 + UDP + BTH (12) + ICRC (4): what an RDMA WRITE MIDDLE packet adds to its payload.
ROCE_OVERHEAD_BYTES = UDP_OVERHEAD_BYTES + 12 + 4


def udp_frame_bytes(size_bytes: int) -> int:
    return int(size_bytes) + UDP_OVERHEAD_BYTES


def roce_frame_bytes(mtu: int) -> int:
    return int(mtu) + ROCE_OVERHEAD_BYTES


def packets_of(payload_bytes: int, mtu: int) -> int:
    """Packets of one RDMA WRITE (a zero-length WRITE is one packet)."""
    return max(1, -(-int(payload_bytes) // int(mtu)))


def roce_wire_bytes(payload: npt.NDArray[np.float64], mtu: int) -> npt.NDArray[np.float64]:
    """`packets_of(payload, mtu) * roce_frame_bytes(mtu)` for many messages at once."""
    return np.maximum(1.0, np.ceil(payload / mtu)) * roce_frame_bytes(mtu)


__all__ = [
    "ROCE_OVERHEAD_BYTES",
    "UDP_OVERHEAD_BYTES",
    "packets_of",
    "roce_frame_bytes",
    "roce_wire_bytes",
    "udp_frame_bytes",
]
