"""What a switch port is to ovs-vswitchd: a packet socket (`system`) or an AF_XDP socket (`afxdp`).

Why: the userspace datapath reads a `system` port through an AF_PACKET socket, a system call and a copy
per packet; an `afxdp-nonpmd` port reads and writes rings shared with the kernel (generic XDP on the veth,
polled by ovs-vswitchd's main thread, so no core is spent busy-polling).  On this 2-core machine the k=4
fabric on one shard with patch cables carries 3,000 clean pkt/s per host with packet sockets and
12,500 with AF_XDP host ports (docs/emulation.md).  The price: an AF_XDP port's frames skip the
interface's qdiscs, so the links cannot be shaped (HTB) and carry no QoS queues — `auto` uses AF_XDP only
on unshaped fabrics, and only where this Open vSwitch offers the port type; anything else is a packet
socket, as before.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

#: `--ports` choices.
PORTS = ("auto", "system", "afxdp")
#: The Interface type and options of an AF_XDP port: polled by the main thread, generic (copy) XDP mode —
#: veths have native XDP too, which measured no faster here (12,500 pkt/s per host either way).
AFXDP_TYPE = "afxdp-nonpmd"
AFXDP_OPTIONS: Mapping[str, str] = {"xdp-mode": "generic"}


def check(ports: str, shaped: bool, qos: bool) -> None:
    """ValueError naming what is wrong with `ports` for this fabric (an unknown kind, or AF_XDP asked for
    on shaped links or with QoS queues)."""
    if ports not in PORTS:
        raise ValueError(f"{ports!r}: expected one of {', '.join(PORTS)}")
    if ports == "afxdp" and (shaped or qos):
        raise ValueError(
            "AF_XDP ports bypass the qdiscs that shape links and hold QoS queues: drop --scale/--qos, "
            "or use --ports system"
        )


def choose(ports: str, shaped: bool, qos: bool, offered: frozenset[str]) -> tuple[str, str | None]:
    """(`system` or `afxdp`, why `auto` fell back to `system` — None if it did not, or was not asked).
    An explicit `afxdp` this Open vSwitch does not offer is a ValueError, not a quiet fallback."""
    check(ports, shaped, qos)
    if ports == "system":
        return "system", None
    if AFXDP_TYPE not in offered:
        if ports == "afxdp":
            raise ValueError(f"this Open vSwitch offers no {AFXDP_TYPE} ports (built without AF_XDP)")
        return "system", f"this Open vSwitch offers no {AFXDP_TYPE} ports"
    if shaped or qos:
        return "system", "links are shaped (AF_XDP frames would skip the shaping qdiscs)"
    return "afxdp", None


def offered_types(db: str | None = None) -> frozenset[str]:
    """The Interface types the ovs-vswitchd behind `db` (the system's if None) offers; empty if it does not
    answer (then `auto` stays with packet sockets)."""
    argv = ["ovs-vsctl", "--timeout=10", *([f"--db=unix:{db}"] if db else []), "get", "Open_vSwitch", ".",
            "iface_types"]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(t.strip().strip('"') for t in out.strip().strip("[]").split(",") if t.strip())


def interfaces(names: list[str]) -> dict[str, tuple[str, Mapping[str, str]]]:
    """`ovsdb.BridgeSpec.fast_ports` for these interfaces."""
    return {name: (AFXDP_TYPE, AFXDP_OPTIONS) for name in names}


class PortChoice:
    """`ports` for one fabric: checked when made, decided per ovs-vswitchd as its bridges are written."""

    def __init__(self, ports: str, shaped: bool, qos: bool) -> None:
        check(ports, shaped, qos)
        self.ports, self.shaped, self.qos = ports, shaped, qos
        #: what the ports became, and why `auto` kept packet sockets (None: it did not)
        self.kind, self.note = "system", None if ports == "system" else "not built yet"
        self._offered: dict[str | None, frozenset[str]] = {}

    def fast_ports(self, names: list[str], db: str | None) -> dict[str, tuple[str, Mapping[str, str]]]:
        """`ovsdb.BridgeSpec.fast_ports` for these ports of the ovs-vswitchd behind `db` (the system's if
        None); ValueError if AF_XDP was asked for and that Open vSwitch does not offer it."""
        if self.ports == "system":
            return {}
        if db not in self._offered:  # one question per ovs-vswitchd, not one per bridge
            self._offered[db] = offered_types(db)
        self.kind, self.note = choose(self.ports, self.shaped, self.qos, self._offered[db])
        return interfaces(names) if self.kind == "afxdp" else {}

    def describe(self) -> str:
        """What the switch ports became, and why if `auto` kept packet sockets."""
        if self.kind == "afxdp":
            return f"AF_XDP ({AFXDP_TYPE}, xdp-mode {AFXDP_OPTIONS['xdp-mode']})"
        return "packet sockets" + (f" ({self.note})" if self.note else "")


__all__ = [
    "AFXDP_OPTIONS",
    "AFXDP_TYPE",
    "PORTS",
    "PortChoice",
    "check",
    "choose",
    "interfaces",
    "offered_types",
]
