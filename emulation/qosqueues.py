"""QoS on the emulated fabric: every switch port's egress gets the policy's queues (`controller.sm.qos`).

Why this design (measured on this machine's userspace-datapath OVS, see docs/qos.md):

* OVS's own QoS does not work here: `linux-htb` with OpenFlow `set_queue` creates the classes but every
  packet lands in queue 0; `egress-policer` is ignored; ingress policing fails.
* HTB classes with DSCP filters *directly* on a switch port's veth classify correctly, but when a class's
  queue is full its drop is returned to OVS's `sendmmsg()` and OVS throws away the rest of that send batch,
  packets of the *other* classes included: the losing class takes the winners down with it.
* So the queues live on an **IFB device per switch port**: the veth's egress (`clsact`) redirects every IP
  packet to its IFB (`mirred egress redirect`), whose HTB tree shapes the link and arbitrates the classes,
  then hands packets back to the veth.  The redirect "steals" the packet, so OVS's send always succeeds and
  a drop in a full class queue touches that class only.  Non-IP frames (ARP, the controller's LLDP) carry no
  DSCP and go straight out of the veth.

The tree on each IFB (`R` = the link's scaled rate)::

    1:    htb, default -> the DEFAULT level's queue
    1:1   rate R ceil R                                  (the link)
    1:1q  queue q: strict VLs prio 0, rate R; weighted VLs prio 1, rate R * share, ceil R
          (HTB lends unused rate in proportion to rate: backlogged weighted queues split the link by weight)
    1:1q's SLs with a rate limit get leaves of their own (ceil = the limit), the rest of the VL one leaf

Classification is DSCP -> SL (u32 on the IP TOS byte: one filter per SL block `dscp >> 2`, exact filters
first for `dscp_to_sl` overrides) -> that SL's leaf.  The veth's own HTB (the plain link shaping of
`MininetFabric._shape`) is removed on these ports: the IFB shapes the link instead.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controller.sm.qos import QosPolicy, QueuePlan, dscp_to_sl, queue_plan

#: HTB's priority for strict (vlarb_high) and weighted (vlarb_low) queues: lower is served first.
STRICT_PRIO, WEIGHTED_PRIO = 0, 1
MTU_BYTES = 1514
CLASS_BURST_BYTES = 2 * MTU_BYTES


def ifb_name(intf: str) -> str:
    """The IFB of a switch interface: `{intf}q` (so `emulation.mnfabric.leftovers`/`remove` find it by the
    same node-name rule as the interface itself)."""
    name = f"{intf}q"
    if len(name) > 15:
        raise ValueError(f"{name}: longer than a Linux interface name may be (15 characters)")
    return name


def leaf_of(plan: QueuePlan, sl: int, default_sl: int = 0) -> int:
    """HTB minor id of the leaf an SL's packets go to (an SL on a VL without weight: the DEFAULT level's)."""
    for q in plan.queues:
        if sl in q.sls:
            limited = dict(q.rate_limits_gbps)
            if sl in limited:
                return 0x100 + sl
            return 0x50 + q.queue if limited else 0x10 + q.queue
    if sl == default_sl:
        return 0x10 + plan.default_queue
    return leaf_of(plan, default_sl, default_sl)


def _hex(minor: int) -> str:
    return f"{minor:x}"


@dataclass(frozen=True)
class PortShape:
    intf: str
    rate_mbps: float
    #: scaled Mb/s per Gb/s of the fabric (rate limits are scaled like links)
    mbps_per_gbps: float


def tc_lines(
    policy: QosPolicy, port: PortShape, buffer_packets: int, burst: str
) -> tuple[list[str], list[str]]:
    """(`ip -batch` lines, `tc -batch` lines) that give one switch port the policy's queues."""
    plan = queue_plan(policy)
    default_sl = policy.level("DEFAULT").sl
    dev, ifb = port.intf, ifb_name(port.intf)
    rate = port.rate_mbps
    # no IPv6 on the IFB: its own router solicitations would be dropped by it and counted as drops
    ip = [f"link add {ifb} type ifb", f"link set {ifb} addrgenmode none", f"link set {ifb} up"]
    tc = [
        f"qdisc del dev {dev} root",
        f"qdisc add dev {dev} clsact",
        f"filter add dev {dev} egress protocol ip prio 1 u32 match u32 0 0 "
        f"action mirred egress redirect dev {ifb}",
        f"qdisc add dev {ifb} root handle 1: htb default {_hex(leaf_of(plan, default_sl, default_sl))}",
        f"class add dev {ifb} parent 1: classid 1:1 htb rate {rate:.3f}mbit ceil {rate:.3f}mbit "
        f"burst {burst}",
    ]
    leaves: list[int] = []
    # Classes: a bucket of two packets (HTB lends the link in quantum-sized turns; a big bucket would let a
    # class run ahead of its weight after every pause), quanta in proportion to the weights (deficit round
    # robin between backlogged classes), one MTU for the smallest.
    small = f"burst {CLASS_BURST_BYTES}b cburst {CLASS_BURST_BYTES}b"
    lowest = min((q.weight for q in plan.queues if not q.strict and q.weight > 0), default=1)
    for q in plan.queues:
        if q.strict:
            share = 1.0 if plan.high_limit == 255 else max(plan.high_limit, 1) / 255
            q_rate, prio = rate * share, STRICT_PRIO
        else:
            q_rate, prio = rate * q.share, WEIGHTED_PRIO
        q_rate = max(q_rate, 0.01)
        minor = 0x10 + q.queue
        quantum = MTU_BYTES if q.strict else max(MTU_BYTES, round(MTU_BYTES * q.weight / lowest))
        tc.append(
            f"class add dev {ifb} parent 1:1 classid 1:{_hex(minor)} htb rate {q_rate:.3f}mbit "
            f"ceil {rate:.3f}mbit {small} prio {prio} quantum {quantum}"
        )
        limits = dict(q.rate_limits_gbps)
        if not limits:
            leaves.append(minor)
            continue
        for sl, cap_gbps in sorted(limits.items()):
            cap = min(rate, cap_gbps * port.mbps_per_gbps)
            tc.append(
                f"class add dev {ifb} parent 1:{_hex(minor)} classid 1:{_hex(0x100 + sl)} htb "
                f"rate {min(cap, q_rate):.3f}mbit ceil {cap:.3f}mbit {small} prio {prio} quantum {quantum}"
            )
            leaves.append(0x100 + sl)
        if any(sl not in limits for sl in q.sls):
            rest = 0x50 + q.queue
            tc.append(
                f"class add dev {ifb} parent 1:{_hex(minor)} classid 1:{_hex(rest)} htb "
                f"rate {q_rate:.3f}mbit ceil {rate:.3f}mbit {small} prio {prio} quantum {quantum}"
            )
            leaves.append(rest)
    for minor in leaves:
        tc.append(f"qdisc add dev {ifb} parent 1:{_hex(minor)} pfifo limit {buffer_packets}")
    table = dscp_to_sl(policy)
    for dscp, sl in policy.dscp_overrides:
        tc.append(
            f"filter add dev {ifb} parent 1: protocol ip prio 1 u32 match ip dsfield {dscp << 2:#04x} 0xfc "
            f"flowid 1:{_hex(leaf_of(plan, sl, default_sl))}"
        )
    for sl in range(16):
        block = range(sl << 2, (sl << 2) + 4)
        if all(table[d] == sl for d in block) or not policy.dscp_overrides:
            tc.append(
                f"filter add dev {ifb} parent 1: protocol ip prio 2 u32 match ip dsfield {sl << 4:#04x} 0xf0 "
                f"flowid 1:{_hex(leaf_of(plan, sl, default_sl))}"
            )
        else:  # a block split by overrides: the rest of it one by one
            for d in block:
                if d not in dict(policy.dscp_overrides):
                    tc.append(
                        f"filter add dev {ifb} parent 1: protocol ip prio 2 u32 "
                        f"match ip dsfield {d << 2:#04x} "
                        f"0xfc flowid 1:{_hex(leaf_of(plan, table[d], default_sl))}"
                    )
    return ip, tc


def apply(
    ports: Iterable[PortShape],
    policy: QosPolicy,
    buffer_packets: int,
    burst: str,
    netns_of: Callable[[str], str | None] = lambda intf: None,
) -> list[str]:
    """Configure the ports, each in its namespace (`netns_of`: a sharded fabric's ports are in the shards'
    namespaces; None: this one), two batch commands per namespace; returns the IFB devices created (each
    beside its port)."""
    ip: dict[str | None, list[str]] = {}
    tc: dict[str | None, list[str]] = {}
    ifbs = []
    for port in ports:
        port_ip, port_tc = tc_lines(policy, port, buffer_packets, burst)
        ns = netns_of(port.intf)
        ip.setdefault(ns, []).extend(port_ip)
        tc.setdefault(ns, []).extend(port_tc)
        ifbs.append(ifb_name(port.intf))
    for ns, ip_lines in ip.items():
        where = ["-n", ns] if ns else []
        batches = ((["ip", *where, "-batch", "-"], ip_lines), (["tc", *where, "-batch", "-"], tc[ns]))
        for argv, lines in batches:
            done = subprocess.run(
                argv, input="\n".join(lines) + "\n", capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                remove(ifbs, netns_of)
                raise RuntimeError(f"{argv[0]} -batch failed: {done.stderr.strip()[-400:]}")
    return ifbs


def remove(ifbs: Iterable[str], netns_of: Callable[[str], str | None] = lambda intf: None) -> None:
    """Delete the IFBs (`netns_of` takes the port's interface name: an IFB is `{intf}q`)."""
    by_ns: dict[str | None, str] = {}
    for name in ifbs:
        ns = netns_of(name[:-1])
        by_ns[ns] = by_ns.get(ns, "") + f"link del {name}\n"
    for ns, lines in by_ns.items():
        subprocess.run(
            ["ip", *(["-n", ns] if ns else []), "-force", "-batch", "-"],
            input=lines, capture_output=True, text=True, check=False,
        )  # fmt: skip


_CLASS = re.compile(r"^class htb \d+:([0-9a-f]+) ", re.M)
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")
_BACKLOG = re.compile(r"backlog \S+ (\d+)p")


def parse_class_stats(text: str) -> dict[int, dict[str, int]]:
    """`tc -s class show` text (this iproute2 has no JSON for classes) -> minor id -> counters."""
    stats: dict[int, dict[str, int]] = {}
    for part in text.split("\nclass "):
        block = part if part.startswith("class ") else "class " + part
        head, sent, backlog = _CLASS.search(block), _SENT.search(block), _BACKLOG.search(block)
        if head is None or sent is None:
            continue
        stats[int(head[1], 16)] = {
            "bytes": int(sent[1]),
            "packets": int(sent[2]),
            "drops": int(sent[3]),
            "overlimits": int(sent[4]),
            "backlog_packets": int(backlog[1]) if backlog else 0,
        }
    return stats


def queue_counters(
    intfs: Iterable[str], plan: QueuePlan, netns_of: Callable[[str], str | None] = lambda intf: None
) -> dict[str, dict[str, dict[str, int]]]:
    """interface -> queue (and rate-limited SL leaf, `q3/sl3`) -> sent bytes/packets, drops, overlimits,
    backlog: `tc -s class show` of each port's IFB (in the port's namespace)."""
    names = {0x10 + q.queue: f"q{q.queue}" for q in plan.queues}
    for q in plan.queues:
        names |= {0x100 + sl: f"q{q.queue}/sl{sl}" for sl, _ in q.rate_limits_gbps}
        names |= {0x50 + q.queue: f"q{q.queue}/rest"}
    result: dict[str, dict[str, dict[str, int]]] = {}
    for intf in intfs:
        ns = netns_of(intf)
        out = subprocess.run(
            ["tc", *(["-n", ns] if ns else []), "-s", "class", "show", "dev", ifb_name(intf)],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        port: dict[str, dict[str, int]] = {}
        for minor, stats in parse_class_stats(out).items():
            if minor in names:
                port[names[minor]] = stats
        result[intf] = port
    return result


__all__ = [
    "PortShape",
    "apply",
    "ifb_name",
    "leaf_of",
    "parse_class_stats",
    "queue_counters",
    "remove",
    "tc_lines",
]
