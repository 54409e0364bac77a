"""Isolation counters of a scenario run: what the partition layer dropped, per partition, off the switches.

The controller's deny flows (priority 120: ingress port + a destination the source may not reach) and guard
flows (118: IPv4 with a forged address; 115: anything else from a host port) drop without actions; their
packet counters are the isolation evidence.  They are read with ``ovs-ofctl dump-flows`` before and after
the traffic, and a deny flow's packets are counted against the partitions of the destination it protected.
The all-pairs reachability check of every run doubles as an isolation check: a denied pair that delivered,
or a permitted pair that did not, is listed.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from controller.sm.isolation import DROP_PRIORITIES
from controller.sm.partitions import Partitions, pkey_str
from emulation.mnfabric import MininetFabric

_FIELD = re.compile(r"(n_packets|priority|in_port|dl_dst)=([0-9a-fA-F:]+)")
#: (switch, in_port, destination MAC or "" for a guard flow) -> packets dropped so far
Drops = dict[tuple[str, int, str], int]


def read_drops(net: MininetFabric, switches: Iterable[str] | None = None) -> Drops:
    """The drop flows' packet counters of `switches` (topology names; default every switch)."""
    drops: Drops = {}
    for switch in switches if switches is not None else [s.name for s in net.fabric.switches]:
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", net.ofctl_target(switch)],
                             capture_output=True, text=True, check=False).stdout  # fmt: skip
        for line in out.splitlines():
            fields = dict(_FIELD.findall(line))
            priority = int(fields.get("priority", "0"))
            if priority not in DROP_PRIORITIES or "in_port" not in fields:
                continue
            key = (switch, int(fields["in_port"]), fields.get("dl_dst", "").lower())
            drops[key] = int(fields.get("n_packets", "0"))
    return drops


def report(
    partitions: Partitions,
    host_of_mac: Mapping[str, str],
    before: Drops,
    after: Drops,
    pairs: Mapping[tuple[str, str], bool],
) -> dict[str, Any]:
    """Drops during the traffic, per partition (by the destination protected) and forged/unknown; and the
    pairs whose reachability contradicts the partitions."""
    per: dict[int, int] = {}
    forged = denied = 0
    for key, total in after.items():
        n = total - before.get(key, 0)
        if n <= 0:
            continue
        if not key[2]:
            forged += n
            continue
        denied += n
        host = host_of_mac.get(key[2])
        for pkey, _ in partitions.keys_of(host) if host is not None else ():
            per[pkey] = per.get(pkey, 0) + n
    names = {p.pkey: p.name for p in partitions.partitions}
    return {
        "dropped_packets": {"denied": denied, "forged_or_unknown": forged},
        "dropped_by_partition": {
            pkey_str(k): {"name": names.get(k, ""), "packets": n} for k, n in sorted(per.items())
        },
        "denied_pairs": sum(1 for s, d in pairs if not partitions.permitted(s, d)),
        "denied_but_delivered": sorted(
            f"{s}->{d}" for (s, d), ok in pairs.items() if ok and not partitions.permitted(s, d)
        ),
        "permitted_but_undelivered": sorted(
            f"{s}->{d}" for (s, d), ok in pairs.items() if not ok and partitions.permitted(s, d)
        ),
    }


__all__ = ["Drops", "read_drops", "report"]
