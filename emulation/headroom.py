"""Does the emulator, not the modelled fabric, drop or delay packets?  Counters before and after a run.

On two cores a userspace OVS fabric loses packets from CPU starvation long before its modelled (HTB-shaped)
links fill: ovs-vswitchd forwards every packet of every bridge on its main thread, reading each switch port
from an AF_PACKET socket; when it falls behind, the kernel drops at that socket.  Receivers in the hosts
can fall behind too.  None of that is the fabric being modelled, so every scenario run reads, before and
after its traffic:

* **emulator drops** (the emulator lying): drops of OVS's packet sockets on the fabric's ports (`ss -0 -m`,
  `skmem d`), veth drops (`/sys/class/net/*/statistics`, `/proc/net/dev` in the hosts), UDP receive-buffer
  overflows in the hosts (`/proc/net/snmp` `RcvbufErrors`) and packet-socket drops in the hosts (RoCE
  receivers);
* **modelled congestion**: drops of the HTB qdiscs that shape the links (`tc -s qdisc`) — a link that is
  full, as the experiment intends;
* **fault drops**: any of the above on interfaces of links that a fault cut during the run (a downed cable
  drops what is sent into it; that is the experiment too).

`assess` compares them with what was offered (and with the fabric's calibrated clean capacity, if known):
the run is `emulator_overloaded` when the emulator dropped more than `CLEAN_LOSS` of the offered packets, or
delayed probes beyond `DELAY_BOUND_MS` at their 99th percentile while no modelled link was congested.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: The loss a run may have and still count as clean (the calibration's criterion as well).
CLEAN_LOSS = 0.001
#: One-way probe delay (99th percentile) beyond which an uncongested run is delayed by the emulator, not
#: by its links: a scaled link serialises a 512-byte packet in tens of microseconds per hop.
DELAY_BOUND_MS = 20.0

_SKMEM_DROPS = re.compile(r"skmem:\([^)]*\bd(\d+)")
_SECTION = "@@fabriclab@@"


@dataclass(frozen=True)
class HostNs:
    """A host's network namespace (a path such as /proc/PID/ns/net or /run/netns/NAME)."""

    name: str
    netns: str


@dataclass
class Counters:
    """Drop counters of one fabric at one moment, per interface where they are per interface."""

    #: interface -> drops of the packet socket(s) bound to it (root namespace: OVS's receive sockets)
    socket_drops: dict[str, int] = field(default_factory=dict)
    #: interface -> rx_dropped + tx_dropped (veths, both namespaces)
    interface_drops: dict[str, int] = field(default_factory=dict)
    #: interface -> HTB qdisc drops (modelled congestion)
    shaped_drops: dict[str, int] = field(default_factory=dict)
    #: host -> UDP RcvbufErrors in its namespace
    udp_rcvbuf_errors: dict[str, int] = field(default_factory=dict)
    #: host -> drops of packet sockets inside the host (RoCE receivers)
    host_socket_drops: dict[str, int] = field(default_factory=dict)


def _socket_drops(ss_output: str) -> dict[str, int]:
    drops: dict[str, int] = {}
    for line in ss_output.splitlines():
        match = _SKMEM_DROPS.search(line)
        local = next((part for part in line.split() if part.startswith("*:")), None)
        if match and local:
            name = local[2:]
            drops[name] = drops.get(name, 0) + int(match[1])
    return drops


_XSK_DROPS = re.compile(r"xsk_queue_\d+_rx_dropped")


def xsk_drops(db: str | None) -> dict[str, int]:
    """Interface -> frames its AF_XDP sockets dropped for a full ring, as the ovs-vswitchd behind `db`
    (None: the system's) counts them (custom statistics `xsk_queue_<n>_rx_dropped`); {} if it does not
    answer."""
    argv = ["ovs-vsctl", "--timeout=10", *([f"--db=unix:{db}"] if db else []), "--format=json",
            "--columns=name,statistics", "list", "Interface"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    try:
        rows = json.loads(done.stdout)["data"]
    except (json.JSONDecodeError, KeyError):
        return {}
    drops: dict[str, int] = {}
    for name, (_, stats) in rows:
        total = sum(int(v) for k, v in stats if _XSK_DROPS.fullmatch(k))
        if total:
            drops[name] = total
    return drops


def _qdisc_drops(tc_json: str, devices: set[str] | None) -> dict[str, int]:
    try:
        qdiscs = json.loads(tc_json or "[]")
    except json.JSONDecodeError:
        return {}
    drops: dict[str, int] = {}
    for q in qdiscs:
        dev = q.get("dev", "")
        if q.get("kind") == "htb" and (devices is None or dev in devices):
            drops[dev] = drops.get(dev, 0) + int(q.get("drops", 0))
    return drops


def _dev_drops(proc_net_dev: str) -> dict[str, int]:
    drops: dict[str, int] = {}
    for line in proc_net_dev.splitlines()[2:]:
        name, _, numbers = line.partition(":")
        cols = numbers.split()
        if len(cols) >= 12 and name.strip() != "lo":
            # transmit drops only: a host's rx_dropped also counts frames no protocol wanted (the
            # controller's LLDP probes reach every host port), which are no loss of the emulator's
            drops[name.strip()] = int(cols[11])
    return drops


def _udp_rcvbuf_errors(snmp: str) -> int:
    rows = [line.split() for line in snmp.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2:
        return 0
    return int(dict(zip(rows[0][1:], rows[1][1:], strict=False)).get("RcvbufErrors", 0))


def _read_host(host: HostNs) -> tuple[str, str]:
    script = (
        f"cat /proc/net/snmp; echo {_SECTION}; cat /proc/net/dev; echo {_SECTION}; "
        f"ss -0 -m -n -H; echo {_SECTION}; tc -s -j qdisc show"
    )
    done = subprocess.run(
        ["nsenter", f"--net={host.netns}", "sh", "-c", script],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    return host.name, done.stdout


def snapshot(
    switch_interfaces: Iterable[str],
    hosts: Sequence[HostNs],
    switch_ns: Sequence[HostNs] = (),
    xsk_dbs: Sequence[str | None] = (),
) -> Counters:
    """Read every counter of a fabric: its switch ports (root namespace, and the shard namespaces
    `switch_ns` of a sharded fabric) and its hosts' namespaces.  `xsk_dbs`: the OVSDB sockets (None: the
    system's) of ovs-vswitchd instances whose ports are AF_XDP sockets (`emulation.fastports`)."""
    ours = set(switch_interfaces)
    counters = Counters()
    with ThreadPoolExecutor(8) as pool:
        for _, out in pool.map(_read_host, switch_ns):
            parts = out.split(_SECTION + "\n")
            if len(parts) < 4:
                continue
            _, dev, ss_shard, tc_shard = parts[:4]
            counters.socket_drops.update({k: v for k, v in _socket_drops(ss_shard).items() if k in ours})
            counters.interface_drops.update({k: v for k, v in _dev_drops(dev).items() if k in ours})
            counters.shaped_drops.update(_qdisc_drops(tc_shard, ours))
    if not switch_ns:  # every switch port in this namespace
        ss = subprocess.run(
            ["ss", "-0", "-m", "-n", "-H"], capture_output=True, text=True, check=False
        ).stdout
        counters.socket_drops = {k: v for k, v in _socket_drops(ss).items() if k in ours}
        for name in ours:
            stats = Path("/sys/class/net") / name / "statistics"
            try:
                counters.interface_drops[name] = int((stats / "tx_dropped").read_text())  # see _dev_drops
            except OSError:
                continue  # gone (a run that tore down early): no counter, not a drop
        tc = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True, check=False)
        counters.shaped_drops = _qdisc_drops(tc.stdout, ours)
    for db in xsk_dbs:  # an AF_XDP port's socket is OVS's receive socket too: its ring drops are the same
        for name, drops in xsk_drops(db).items():
            if name in ours:
                counters.socket_drops[name] = counters.socket_drops.get(name, 0) + drops
    with ThreadPoolExecutor(8) as pool:
        for name, out in pool.map(_read_host, hosts):
            parts = out.split(_SECTION + "\n")
            if len(parts) < 4:
                continue
            snmp, dev, ss_host, tc_host = parts[:4]
            counters.udp_rcvbuf_errors[name] = _udp_rcvbuf_errors(snmp)
            counters.host_socket_drops[name] = sum(_socket_drops(ss_host).values())
            for intf, drops in _dev_drops(dev).items():
                counters.interface_drops[f"{name}/{intf}"] = drops
            for intf, drops in _qdisc_drops(tc_host, None).items():
                counters.shaped_drops[f"{name}/{intf}"] = drops
    return counters


class Counted(Protocol):
    """A fabric whose counters `snapshot_of` reads (a `MininetFabric`, a sharded one, a machine's part)."""

    def switch_interfaces(self) -> list[str]: ...

    def headroom_hosts(self) -> list[HostNs]: ...

    def switch_namespaces(self) -> list[HostNs]: ...

    def xsk_dbs(self) -> list[str | None]: ...


def snapshot_of(net: Counted) -> Counters:
    """`snapshot` of every counter of `net`."""
    return snapshot(net.switch_interfaces(), net.headroom_hosts(), net.switch_namespaces(), net.xsk_dbs())


def _delta(before: Mapping[str, int], after: Mapping[str, int], keys: Iterable[str]) -> int:
    return sum(max(0, after.get(k, 0) - before.get(k, 0)) for k in keys)


def capacity_ratio(offered_pps: Mapping[str, float], capacity: Mapping[str, Any]) -> float:
    """How many times the calibrated clean capacity a load asks for (> 1: more than this machine carries).
    The calibration has every host send at once; fewer senders can each go faster, up to the total."""
    total_cap = max(float(capacity["total_pps"]), 1e-9)
    senders = max(1.0, float(offered_pps.get("senders", capacity.get("senders", 1))))
    per_host_cap = max(float(capacity["per_host_pps"]), total_cap / senders, 1e-9)
    return max(offered_pps.get("total", 0.0) / total_cap, offered_pps.get("per_host", 0.0) / per_host_cap)


def assess(
    before: Counters,
    after: Counters,
    offered_packets: int,
    faulted_interfaces: Iterable[str] = (),
    latency_p99_ms: float | None = None,
    offered_pps: Mapping[str, float] | None = None,
    capacity: Mapping[str, Any] | None = None,
    *,
    received_packets: int | None = None,
    fault_window_losses: int = 0,
    tx_buffer_peak: float | None = None,
    delay_bound_ms: float = DELAY_BOUND_MS,
    senders_late_ms: Mapping[str, tuple[float, float]] | None = None,
    partition_drops: int = 0,
) -> dict[str, Any]:
    """The headroom verdict of one run (see the module docstring).  `faulted_interfaces` are interfaces
    (switch ports as named in the root namespace, host ports as `host/intf`) of links cut by faults;
    `offered_pps` is the load asked for (`per_host` peak and `total`), compared with `capacity` (a
    calibration, see `emulation.calibrate`).

    With `received_packets`, packets are also conserved: what was sent and neither arrived nor was dropped
    by a shaped (modelled) link, a cut cable (`fault_window_losses`: lost right after a fault) or a counted
    emulator drop was lost inside the emulator all the same ("unaccounted": OVS drops some packets under
    CPU starvation without any counter saying so).  `tx_buffer_peak` is `TxBufferSampler`'s reading.
    `delay_bound_ms`: the probe delay the modelled links themselves may cause (`modelled_delay_bound_ms`;
    slow scaled links serialise a packet in milliseconds per hop), beyond which it is the emulator's.
    `senders_late_ms`: per flow, (how far its sender fell behind its schedule, `sender_late_bound_ms`): a
    stalled sender sends its backlog at once, and a burst that fills a modelled buffer by itself drops
    packets the scenario never offered that way.  `partition_drops`: packets the partition layer's deny and
    guard flows dropped (`emulation.isolation`) — the experiment's own, like a cut cable's."""
    faulted = set(faulted_interfaces)

    def split(b: Mapping[str, int], a: Mapping[str, int]) -> tuple[int, int]:
        keys = set(a) | set(b)
        return _delta(b, a, keys - faulted), _delta(b, a, keys & faulted)

    sockets, sockets_faulted = split(before.socket_drops, after.socket_drops)
    interfaces, interfaces_faulted = split(before.interface_drops, after.interface_drops)
    shaped, shaped_faulted = split(before.shaped_drops, after.shaped_drops)
    rcvbuf = _delta(before.udp_rcvbuf_errors, after.udp_rcvbuf_errors, after.udp_rcvbuf_errors)
    host_sockets = _delta(before.host_socket_drops, after.host_socket_drops, after.host_socket_drops)
    by_cause = {
        "ovs_port_socket_overflow": sockets,
        "veth_drops": interfaces,
        "host_udp_rcvbuf_overflow": rcvbuf,
        "host_packet_socket_overflow": host_sockets,
    }
    if received_packets is not None:
        lost = max(0, offered_packets - received_packets)
        faults = sockets_faulted + interfaces_faulted + shaped_faulted + fault_window_losses
        explained = shaped + faults + partition_drops
        by_cause["unaccounted"] = max(0, lost - explained - sum(by_cause.values()))
    emulator = sum(by_cause.values())
    share = emulator / offered_packets if offered_packets else 0.0
    reasons = []
    if emulator > CLEAN_LOSS * offered_packets:
        reasons.append(
            f"the emulator dropped {emulator} of {offered_packets} packets ({100 * share:.2f} %; "
            f"clean is <= {100 * CLEAN_LOSS:g} %)"
        )
    congested = shaped > 0
    if latency_p99_ms is not None and latency_p99_ms > delay_bound_ms and not congested:
        reasons.append(
            f"probes were delayed {latency_p99_ms:.1f} ms at p99 on uncongested links "
            f"(bound {delay_bound_ms:g} ms)"
        )
    late = {name: (ms, bound) for name, (ms, bound) in (senders_late_ms or {}).items() if ms > bound}
    if late:
        name, (late_ms, bound) = max(late.items(), key=lambda item: item[1][0] / item[1][1])
        reasons.append(
            f"{len(late)} sender(s) fell behind their schedule ({name}: {late_ms:.0f} ms, bound "
            f"{bound:.0f} ms: its backlog, sent at once, can fill a modelled buffer)"
        )
    result: dict[str, Any] = {
        "emulator_overloaded": bool(reasons),
        "why": "; ".join(reasons) or None,
        "offered_packets": offered_packets,
        "emulator_drops": emulator,
        "emulator_drop_pct": round(100 * share, 4),
        "emulator_drops_by_cause": by_cause,
        "modelled_congestion_drops": shaped,
        "fault_drops": sockets_faulted + interfaces_faulted + shaped_faulted,
        "partition_drops": partition_drops,
        "probe_latency_p99_ms": latency_p99_ms,
    }
    if senders_late_ms:
        result["senders_late_max_ms"] = max(late_ms for late_ms, _ in senders_late_ms.values())
    if received_packets is not None:
        result["received_packets"] = received_packets
        result["lost_in_fault_windows"] = fault_window_losses
    if tx_buffer_peak is not None:
        # OVS sends every port's packets through one packet socket whose send buffer the packets queued in
        # shaped links hold: full, OVS drops on every port without counting it
        result["ovs_tx_buffer_peak"] = tx_buffer_peak
    if offered_pps is not None:
        result["offered_pps"] = dict(offered_pps)
    if capacity is not None:
        result["capacity_pps"] = {"per_host": capacity["per_host_pps"], "total": capacity["total_pps"]}
        if offered_pps is not None and float(capacity["total_pps"]) > 0:  # a zero calibration sizes nothing
            result["offered_vs_capacity"] = round(capacity_ratio(offered_pps, capacity), 3)
    return result


def modelled_delay_bound_ms(
    link_mbps: float | None, packet_bytes: int, hops: int, buffer_packets: int | None
) -> float:
    """The one-way delay a path of `hops` shaped links may add without any congestion drop: each hop
    serialises the packet and may hold a full buffer ahead of it (`buffer_packets`; without a configured
    buffer, 100 packets are assumed), plus `DELAY_BOUND_MS` for the emulator's own work.  Unshaped links
    (`link_mbps` None) add nothing."""
    if link_mbps is None or link_mbps <= 0:
        return DELAY_BOUND_MS
    serialise_ms = (packet_bytes + 42) * 8 / (link_mbps * 1e3)  # UDP/IP/Ethernet headers
    return DELAY_BOUND_MS + hops * serialise_ms * (1 + (buffer_packets or 100))


def sender_late_bound_ms(rate_pps: float, buffer_packets: int | None) -> float:
    """How far a sender at `rate_pps` may fall behind its schedule: the backlog it then sends at once must
    fit a modelled buffer of `buffer_packets` on its own (without a configured buffer, 100 packets are
    assumed, as for delays), and never less than `DELAY_BOUND_MS`."""
    if rate_pps <= 0:
        return float("inf")
    return max(DELAY_BOUND_MS, 1000.0 * (buffer_packets or 100) / rate_pps)


class TxBufferSampler:
    """The fullest OVS's shared transmit socket got (used / size of its send buffer), sampled every
    `interval_s` while the traffic runs: the unbound packet socket (`ss -0`: `[0]:*`) through which
    ovs-vswitchd's userspace datapath sends to every port.  Near 1.0 it refuses packets for all ports."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name="txbuf", daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            out = subprocess.run(["ss", "-0", "-m", "-n", "-H"], capture_output=True, text=True, check=False)
            self.peak = max(self.peak, tx_buffer_fill(out.stdout))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(2)
        return round(self.peak, 3)


def tx_buffer_fill(ss_output: str) -> float:
    """Used / size of the send buffer of OVS's unbound packet socket in `ss -0 -m` output (0 if absent)."""
    fill = 0.0
    for line in ss_output.splitlines():
        if "[0]:*" not in line or "skmem:(" not in line:
            continue
        memory = {}
        for item in line.split("skmem:(", 1)[1].split(")")[0].split(","):
            name = item.rstrip("0123456789")
            memory[name] = item[len(name) :]
        used, size = memory.get("t", ""), memory.get("tb", "")
        if used.isdigit() and size.isdigit() and int(size):
            fill = max(fill, int(used) / int(size))
    return fill


__all__ = [
    "CLEAN_LOSS",
    "DELAY_BOUND_MS",
    "Counters",
    "HostNs",
    "TxBufferSampler",
    "assess",
    "capacity_ratio",
    "modelled_delay_bound_ms",
    "snapshot",
    "snapshot_of",
    "tx_buffer_fill",
]
