"""The `adaptive` policy's controller step, as `controller.sm.policies` defines it.

Packets of an adaptive flow are sprayed over the equal-cost ports the controller currently *allows* for
their destination; every `interval_ms` the controller reads the link counters of the last interval
(utilisation = bytes / (capacity x interval)) and, per (switch, destination switch):

* a port that is not allowed comes back when its link is below `threshold - hysteresis` *and* would stay
  at or below `threshold` after taking an even share of what the allowed ports now carry (a port that was
  dropped is idle, so its own utilisation alone says nothing: readmitting it on that would flap);
* an allowed port whose link is above `threshold` stops being allowed if another allowed (or readmitted)
  port is below `threshold - hysteresis` to take its share — otherwise there is nowhere better and it stays;
* at least one port always stays allowed.

The band between `threshold - hysteresis` and `threshold` is where nothing changes.  Allowed sets start as
all alternatives (nothing measured yet: plain spraying).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from flowsim.network import F64, Routing

U8 = npt.NDArray[np.uint8]
#: Target switches handled per vectorised block (bounds the switches x targets x ports boolean array).
BLOCK_ELEMENTS = 1 << 23


def next_allowed(routing: Routing, allowed: U8, util: F64, threshold: float, hysteresis: float) -> U8:
    """The allowed-port bit sets after one interval with link utilisation `util` (full-fabric link ids)."""
    subnet = routing.subnet
    n_sw, n_ports = subnet.n_switches, subnet.n_ports
    linked = routing.link_of >= 0
    port_util = np.where(linked, util[np.maximum(routing.link_of, 0)], np.inf)  # (S, P)
    cap = np.where(linked, routing.network.cap_gbps[np.maximum(routing.link_of, 0)], 1.0)
    load = np.where(linked, port_util * cap, 0.0)
    hot = port_util > threshold
    cool = port_util < threshold - hysteresis
    out = allowed.copy()
    step = max(1, BLOCK_ELEMENTS // max(1, n_sw * n_ports))
    for lo in range(0, n_sw, step):
        cols = slice(lo, min(n_sw, lo + step))
        alt = np.unpackbits(routing.tables.alt[:, cols], axis=2, count=n_ports).astype(bool)  # (S, T, P)
        now = np.unpackbits(allowed[:, cols], axis=2, count=n_ports).astype(bool) & alt
        moving = np.where(now, load[:, None, :], 0.0).sum(axis=2, keepdims=True)  # (S, T, 1)
        k = now.sum(axis=2, keepdims=True)
        estimate = port_util[:, None, :] + moving / (k + 1) / cap[:, None, :]
        readmit = alt & ~now & cool[:, None, :] & (estimate <= threshold)
        has_cool = ((now | readmit) & cool[:, None, :]).any(axis=2, keepdims=True)
        new = (now & ~(hot[:, None, :] & has_cool)) | readmit
        empty = ~new.any(axis=2, keepdims=True)
        new = np.where(empty, now, new)
        new = np.where(~new.any(axis=2, keepdims=True), alt, new)
        out[:, cols] = np.packbits(new, axis=2)[:, :, : allowed.shape[2]]
    return out


__all__ = ["next_allowed"]
