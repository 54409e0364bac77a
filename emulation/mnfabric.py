"""A topology realised as a Mininet network on Open vSwitch's userspace datapath.

The same conventions as `emulation.ovs` (and what the controller expects): datapath id = node GUID,
OpenFlow port = topology port (Mininet passes `ofport_request`), OpenFlow 1.3, `fail_mode=secure`, hosts
with the subnet manager's addresses, TX checksum offload off (TCP over the userspace datapath needs it),
IPv6 off, controller `inactivity_probe` 30 s.  Link speeds are scaled into what HTB can shape (`Scale`):
Mininet's TCLink caps shaping at 1 Gb/s, and there is no netem here, so delay and loss are not emulated
(topology files refuse them).  Mininet names are the topology's when they fit Linux's 15-character
interface names, `s<i>`/`h<i>` otherwise.

By default (`shells=False`) the network is built the fast way (`emulation.lightnet`: batched `ip`, one
OVSDB transaction, hosts as named network namespaces without a shell); Mininet's own nodes (a bash per
node, which its CLI needs) only with `shells=True`.  Names are the same either way.

Start and stop only touch this network: `stop()` removes it by name (never `mn -c`, which kills every
process called ping or controller and deletes /tmp/*.log).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Container, Iterable, Mapping
from functools import partial
from typing import Any

from controller.sm.addressing import IPV4_PREFIX_LEN
from emulation import fastports, lightnet, ovsdb
from emulation.headroom import HostNs
from emulation.hostconf import HostConfigError, HostIntf
from emulation.mesh import Endpoint
from emulation.metrics import SwitchDaemon
from emulation.priority import prioritised
from emulation.shards import SHARD_DIR, kill_leftover_daemons
from topologies.model import Fabric, Link, PortRef
from topologies.scale import Scale

LOG = logging.getLogger("fabriclab.emulation")


class EmulationError(RuntimeError):
    pass


def mininet_available() -> str | None:
    """None if Mininet can run here, else why not (its Python package and Debian's `mnexec`)."""
    import importlib.util  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from emulation.ovs import ovs_available  # noqa: PLC0415

    reason = ovs_available()
    if reason is not None:
        return reason
    if shutil.which("mnexec") is None:
        return "mnexec not found (Debian: mininet)"
    if importlib.util.find_spec("mininet") is None:
        return "the mininet Python package is not installed (pip install mininet)"
    return None


def listening(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether something accepts TCP connections at host:port: a bare connect, closed at once.

    This replaces Mininet's `RemoteController.checkListening`, which runs `echo A | telnet -e A IP PORT`
    in a shell and decodes what comes back as UTF-8: an OpenFlow controller greets with a binary HELLO
    (`04 00 00 08` + a transaction id), so whenever that id is not valid UTF-8 the check itself crashes
    (UnicodeDecodeError) — at random, depending on the controller's xid — and leaves its shell behind."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _bridges() -> list[str]:
    argv = ["ovs-vsctl", "--timeout=30", "list-br"]
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split()


def host_shells(names: Iterable[str]) -> dict[int, str]:
    """PID -> node name of Mininet's host shells (`bash ... mininet:NAME`) for exactly these node names."""
    wanted = {f"mininet:{name}" for name in names}
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        last = next((a for a in reversed(argv) if a), b"").decode(errors="replace")
        if last in wanted:
            found[int(entry)] = last.removeprefix("mininet:")
    return found


def _ours(link: str, names: set[str]) -> bool:
    """An interface of these nodes: `NAME-ethN`, or a netdev bridge's own tap device `NAME`."""
    return link in names or ("-eth" in link and link.rsplit("-eth", 1)[0] in names)


def leftovers(names: Iterable[str]) -> list[str]:
    """What exists of a fabric whose nodes had exactly these names: bridges, interfaces `NAME-ethN` (and
    bridges' tap devices `NAME`) in this namespace, host namespaces `NAME`, host shells.  Names of other
    fabrics never match."""
    ours = set(names)
    found = [f"bridge {b}" for b in _bridges() if b in ours]
    found += [f"link {n}" for n in lightnet.root_links() if _ours(n, ours)]
    found += [f"netns {n}" for n in lightnet.namespaces() if n in ours]
    found += [f"host process {pid} ({name})" for pid, name in sorted(host_shells(ours).items())]
    found += [f"shard daemons {n}" for n in sorted(ours) if (SHARD_DIR / n).is_dir()]
    return found


def remove(names: Iterable[str], group: int | None = None) -> None:
    """Remove a fabric by its node names: kill its host shells (by PID; their namespaces go with them),
    delete its veths (by interface `group` too, if given and holding only ours), bridges, bridge taps and
    host namespaces.  Touches nothing named otherwise."""
    ours = set(names)
    for pid in host_shells(ours):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for name in sorted(ours):  # a sharded run's switch daemons (see emulation.shards)
        if (SHARD_DIR / name).is_dir():
            kill_leftover_daemons(name)
    links = [n for n in lightnet.root_links() if _ours(n, ours)]
    lightnet.remove_by_name(ours & set(_bridges()), ours, links, group)


class ControllerTarget:
    """What Mininet's `OVSSwitch.start` needs of a controller — name, protocol, address, port — and
    nothing else: no shell process (Mininet's `RemoteController` is a Node with a bash of its own), no
    telnet probe (see `listening`)."""

    def __init__(self, name: str, ip: str, port: int, protocol: str = "tcp") -> None:
        self.name, self.ip, self.port, self.protocol = name, ip, port, protocol

    def IP(self) -> str:  # noqa: N802 - Mininet's interface
        return self.ip

    def start(self) -> None:
        """Nothing to start: the controller runs on its own."""

    def stop(self, *_: Any, **__: Any) -> None:
        """Nothing to stop."""

    def terminate(self) -> None:
        """No process to end."""


def _fits(name: str, max_port: int) -> bool:
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name)) and len(f"{name}-eth{max_port}") <= 15


class MininetFabric:
    def __init__(
        self,
        fabric: Fabric,
        addresses: Mapping[tuple[str, int], tuple[str, str]],
        controller: str = "tcp:127.0.0.1:6653",
        scale: Scale | None = None,
        mtu: int = 1500,
        prefix_len: int = IPV4_PREFIX_LEN,
        inactivity_probe_ms: int = 30000,
        name_prefix: str = "",
        buffer_packets: int | None = None,
        burst_bytes: int | None = None,
        shells: bool = False,
        qos: Any = None,
        ports: str = "system",
    ) -> None:
        """`name_prefix` gives every Mininet node (so every bridge and interface) a short name of its own,
        `{prefix}s{i}`/`{prefix}h{i}`, so that two fabrics of the same topology can share a network namespace
        and an OVS (a scenario run beside `emulate up`); otherwise topology names are used where they fit.
        `buffer_packets` bounds each shaped switch port's queue (a switch's buffer; default: the interface's
        1000 packets, seconds of queueing at emulated speeds); `burst_bytes` what each shaped link may send
        above its rate after a pause (HTB's bucket; default 64 KB, a whole second of a 500 kb/s link).
        `shells`: build with Mininet's nodes (a bash per node; needed by its CLI) instead of `lightnet`.
        `ports`: what a switch port is to ovs-vswitchd (`emulation.fastports`: `system`, `afxdp`, or `auto`,
        decided at build time; `port_choice.kind` and `.describe()` say what it became and why)."""
        self.shells = shells
        #: Interface group of this fabric's veths (lightnet): teardown deletes them in one call.
        self.group = (1 << 16) + secrets.randbelow(1 << 30)
        self._hosts: dict[str, lightnet.LightHost] = {}
        self.buffer_packets = buffer_packets
        self.burst_bytes = burst_bytes
        #: a `controller.sm.qos.QosPolicy` realised on every switch port (`emulation.qosqueues`); needs scale
        self.qos = qos
        self.qos_devices: list[str] = []
        if qos is not None and scale is None:
            raise EmulationError("QoS needs shaped links: give a scale")
        try:
            self.port_choice = fastports.PortChoice(ports, shaped=scale is not None, qos=qos is not None)
        except ValueError as exc:
            raise EmulationError(f"ports: {exc}") from None
        if ports == "afxdp" and shells:
            raise EmulationError("ports: AF_XDP ports are built without Mininet's shells (no --cli)")
        self.fabric = fabric
        self.addresses = addresses
        self.controller = controller
        self.scale = scale
        self.mtu = mtu
        self.prefix_len = prefix_len
        self.inactivity_probe_ms = inactivity_probe_ms
        self.net: Any = None
        self.names: dict[str, str] = {}
        for kind, nodes in (("s", fabric.switches), ("h", fabric.hosts)):
            for i, node in enumerate(nodes):
                keep = not name_prefix and _fits(node.name, node.ports)
                self.names[node.name] = node.name if keep else f"{name_prefix}{kind}{i}"
                if not _fits(self.names[node.name], node.ports):
                    raise EmulationError(
                        f"name prefix {name_prefix!r}: {self.names[node.name]}-eth{node.ports} is longer "
                        "than a Linux interface name may be (15 characters)"
                    )
        if len(set(self.names.values())) != len(self.names):
            raise EmulationError("node names collide after shortening for Linux interface names")
        if scale is not None:
            try:
                scale.check(fabric)
            except ValueError as exc:
                raise EmulationError(str(exc)) from None
        self.timings: dict[str, float] = {}

    # --- names -------------------------------------------------------------------------------------------

    def node(self, name: str) -> Any:
        """The Mininet node, or (built without shells) a host's `LightHost`."""
        if not self.shells:
            return self._hosts[self.names[name]]
        return self.net.get(self.names[name])

    def netns(self, host: str) -> str:
        """Path of a host's network namespace."""
        node = self.node(host)
        return str(node.netns) if not self.shells else f"/proc/{node.pid}/ns/net"

    def intf_name(self, node: str, port: int) -> str:
        """Interface of a topology port (hosts: port p is eth{p-1}, as on a server)."""
        mn_port = port - 1 if self.fabric.nodes[node].is_host else port
        return f"{self.names[node]}-eth{mn_port}"

    def switch_intf(self, node: str, port: int) -> str:
        """The switch-side interface of a port's cable (what a link fault acts on)."""
        if self.fabric.nodes[node].is_switch:
            return self.intf_name(node, port)
        peer = self.fabric.peer(node, port)
        if peer is None:
            raise KeyError(f"{node}:{port} is not cabled")
        return self.intf_name(peer.node, peer.port)

    def fast_ports(self, names: list[str], db: str | None) -> dict[str, Any]:
        """`BridgeSpec.fast_ports` for these switch ports of the ovs-vswitchd behind `db`."""
        try:
            return self.port_choice.fast_ports(names, db)
        except ValueError as exc:
            raise EmulationError(f"ports: {exc}") from None

    def xsk_dbs(self) -> list[str | None]:
        """The OVSDB sockets of the ovs-vswitchd instances with AF_XDP ports (None: the system's)."""
        return [None] if self.port_choice.kind == "afxdp" else []

    def switch_interfaces(self) -> list[str]:
        """Every switch port's interface (all in this network namespace)."""
        nodes = self.fabric.nodes
        ports = [self.intf_name(r.node, r.port) for r in self.fabric.port_map if nodes[r.node].is_switch]
        return sorted(ports + self.qos_devices)  # QoS: the IFBs' queues are the shaped (modelled) links

    def headroom_hosts(self) -> list[HostNs]:
        return [HostNs(h.name, self.netns(h.name)) for h in self.fabric.hosts]

    def cable_interfaces(self, node: str, port: int) -> list[str]:
        """Both ends of a port's cable as `emulation.headroom` names them (switch ports by interface name,
        host ports as `host/interface`)."""
        peer = self.fabric.peer(node, port)
        ends = [(node, port)] + ([(peer.node, peer.port)] if peer else [])
        return [
            self.intf_name(n, p) if self.fabric.nodes[n].is_switch else f"{n}/{self.intf_name(n, p)}"
            for n, p in ends
        ]

    # --- lifecycle ---------------------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        return list(self.names.values())

    def start(self) -> None:
        if not self.shells:
            self._start_light()
            return
        from mininet.link import Link  # noqa: PLC0415 - Mininet only where emulation runs
        from mininet.log import setLogLevel  # noqa: PLC0415
        from mininet.net import Mininet  # noqa: PLC0415
        from mininet.node import OVSSwitch  # noqa: PLC0415

        setLogLevel("warning")
        start = time.perf_counter()
        proto, host, port = self.controller.split(":")
        if proto != "tcp":
            raise EmulationError(f"controller {self.controller!r}: only tcp:HOST:PORT is supported")
        switch_cls = partial(OVSSwitch, datapath="user", protocols="OpenFlow13", failMode="secure")
        net = Mininet(switch=switch_cls, controller=None, link=Link, build=False, autoSetMacs=False)
        self.net = net
        if not listening(host, int(port)):
            LOG.warning("nothing accepts connections at %s yet; switches keep trying", self.controller)
        net.controllers.append(ControllerTarget("c0", host, int(port)))
        for node in self.fabric.switches:
            net.addSwitch(self.names[node.name], dpid=f"{node.guid:016x}")
        for node in self.fabric.hosts:
            net.addHost(self.names[node.name], ip=None)
        for link in self.fabric.links:
            a, b = sorted((link.a, link.b), key=lambda e: self.fabric.nodes[e.node].is_switch)  # host first
            params: dict[str, Any] = {}
            ends = []
            for end in (a, b):
                is_host = self.fabric.nodes[end.node].is_host
                ends.append((self.names[end.node], end.port - 1 if is_host else end.port))
            address = self.addresses.get((a.node, a.port)) if self.fabric.nodes[a.node].is_host else None
            if address is not None:
                params["params1"] = {"ip": f"{address[1]}/{self.prefix_len}"}
                params["addr1"] = address[0]
            net.addLink(ends[0][0], ends[1][0], port1=ends[0][1], port2=ends[1][1], **params)
        try:
            net.build()
            self.timings["mininet_build_s"] = time.perf_counter() - start
            net.start()
            self._configure()
            self._shape_links()
        except BaseException:
            self.stop()
            raise
        self.timings["mininet_start_s"] = time.perf_counter() - start

    def _start_light(self) -> None:
        """Build with `emulation.lightnet` (see the module docstring); on any failure or signal, remove
        whatever of our names exists and re-raise."""
        start = time.perf_counter()
        proto, host, port = self.controller.split(":")
        if proto != "tcp":
            raise EmulationError(f"controller {self.controller!r}: only tcp:HOST:PORT is supported")
        fabric = self.fabric
        self.net = self  # "started": stop() removes by name from here on
        hosts = [self.names[h.name] for h in fabric.hosts]
        self._hosts = {name: lightnet.LightHost(name) for name in hosts}
        cables = []
        setup: list[HostIntf] = []
        for link in fabric.links:
            a, b = sorted((link.a, link.b), key=lambda e: fabric.nodes[e.node].is_host)  # switch end first
            if fabric.nodes[b.node].is_host:
                intf, name = self.intf_name(b.node, b.port), self.names[b.node]
                address = self.addresses.get((b.node, b.port))
                cables.append(lightnet.Cable(self.intf_name(a.node, a.port), intf, name,
                                             address[0] if address else None))  # fmt: skip
                setup.append(HostIntf(lightnet.netns_of(name), intf, address[1] if address else None,
                                      self.prefix_len))  # fmt: skip
            else:
                cables.append(lightnet.Cable(self.intf_name(a.node, a.port), self.intf_name(b.node, b.port)))
        ports: dict[str, list[tuple[str, int]]] = {s.name: [] for s in fabric.switches}
        for ref in fabric.port_map:
            if fabric.nodes[ref.node].is_switch:
                ports[ref.node].append((self.intf_name(ref.node, ref.port), ref.port))
        target = f"tcp:{host}:{port}"
        bridges = [
            ovsdb.BridgeSpec(self.names[s.name], s.guid, sorted(ports[s.name], key=lambda p: p[1]), target,
                             self.inactivity_probe_ms, {"dp-desc": self.names[s.name]},
                             fast_ports=self.fast_ports([p for p, _ in ports[s.name]], None))
            for s in fabric.switches
        ]  # fmt: skip
        if not listening(host, int(port)):
            LOG.warning("nothing accepts connections at %s yet; switches keep trying", self.controller)

        def step(name: str) -> None:
            self.timings[name] = time.perf_counter() - start

        try:
            lightnet.build(hosts, cables, bridges, self.group, setup, self.mtu, step)
            self.timings["mininet_build_s"] = time.perf_counter() - start
            self._shape_links()
        except HostConfigError as exc:
            self.stop()
            raise EmulationError(str(exc)) from None
        except BaseException:
            self.stop()
            raise
        self.timings["mininet_start_s"] = time.perf_counter() - start

    def _shape_links(self) -> None:
        """Links shaped to the scale, then the QoS policy's queues on the switch ports (both need a scale)."""
        if self.scale is not None:
            self._shape(self.scale)
            if self.qos is not None:
                self._apply_qos(self.scale)

    def _configure(self) -> None:
        """Every interface: no IPv6 (else the kernel's router solicitations, MLD reports and DAD probes reach
        the switches as traffic; netlink rather than sysctl, which is read-only in a container); hosts: TX
        checksum offload off, MTU; switches: controller inactivity probe."""
        no_ipv6 = "ip link set {0} addrgenmode none; ip -6 addr flush dev {0}"
        for node in self.fabric.hosts:
            host = self.node(node.name)
            script = ["true"]
            for intf in host.intfList():
                if intf.name != "lo":
                    script.append(no_ipv6.format(intf.name))
                    script.append(f"ethtool -K {intf.name} tx off >/dev/null")
                    if self.mtu != 1500:
                        script.append(f"ip link set {intf.name} mtu {self.mtu}")
            host.cmd("; ".join(script))
        root = [
            line
            for node in self.fabric.switches
            for intf in self.node(node.name).intfList()
            if intf.name != "lo"
            for line in (f"link set {intf.name} addrgenmode none", f"addr flush dev {intf.name}")
        ]
        subprocess.run(["ip", "-6", "-batch", "-"], input="\n".join(root) + "\n", check=True,
                       capture_output=True, text=True)  # fmt: skip
        args = ["ovs-vsctl", "--timeout=60"]
        for node in self.fabric.switches:
            name = self.names[node.name]
            args += ["--", "set", "Controller", name, f"inactivity_probe={self.inactivity_probe_ms}"]
            if self.mtu != 1500:
                for intf in self.node(node.name).intfList():
                    if intf.name != "lo":
                        subprocess.run(["ip", "link", "set", intf.name, "mtu", str(self.mtu)], check=False)
        subprocess.run(args, check=True, capture_output=True, text=True)

    def _shape(self, scale: Scale) -> None:
        """HTB on both ends of every cable at the scaled speed, in one `tc -batch` for the root namespace
        and one command line per host: Mininet's TCLink runs several tc processes per interface and
        re-applies them after OVS starts (~60 s for a k=8 fat-tree; this takes a few seconds)."""
        root: dict[str, list[str]] = {}  # switch-side interface -> its tc lines
        per_host: dict[str, list[str]] = {}
        burst = f"{self.burst_bytes}b" if self.burst_bytes is not None else "64k"
        for link in self.fabric.links:
            rate = f"{scale.mbps(link.bw_gbps):.3f}mbit"
            for end in self._ends_here(link):
                dev = self.intf_name(end.node, end.port)
                lines = [
                    f"qdisc replace dev {dev} root handle 5: htb default 1",
                    f"class replace dev {dev} parent 5: classid 5:1 htb rate {rate} burst {burst}",
                ]
                switch_side = not self.fabric.nodes[end.node].is_host
                if self.buffer_packets is not None and switch_side:
                    lines.append(
                        f"qdisc replace dev {dev} parent 5:1 handle 10: pfifo limit {self.buffer_packets}"
                    )
                if self.fabric.nodes[end.node].is_host:
                    per_host.setdefault(end.node, []).extend(lines)
                else:
                    root.setdefault(dev, []).extend(lines)
        self._switch_tc(root)
        if not self.shells:
            try:
                scripts = {self.names[h]: [f"tc {line}" for line in lines] for h, lines in per_host.items()}
                lightnet.run_in_hosts(scripts)
            except RuntimeError as exc:
                raise EmulationError(f"shaping hosts failed: {exc}") from None
            return
        for host, lines in per_host.items():
            out = self.node(host).cmd("; ".join(f"tc {line}" for line in lines) + "; echo rc=$?")
            if "rc=0" not in out:
                raise EmulationError(f"shaping {host} failed: {out.strip()[-300:]}")

    def _ends_here(self, link: Link) -> tuple[PortRef, ...]:
        """The ends of a cable this process shapes: both (one machine's part: those on it)."""
        return (link.a, link.b)

    def _switch_tc(self, lines: Mapping[str, list[str]]) -> None:
        """tc lines for switch-side interfaces (all in this namespace here; a sharded fabric's are not)."""
        script = [line for dev_lines in lines.values() for line in dev_lines]
        if script:
            subprocess.run(["tc", "-batch", "-"], input="\n".join(script) + "\n", check=True,
                           capture_output=True, text=True)  # fmt: skip

    def switch_namespaces(self) -> list[HostNs]:
        """Namespaces holding switch ports other than this one (none: every switch port is here)."""
        return []

    def switch_daemons(self) -> list[SwitchDaemon]:
        """The ovs-vswitchd holding the switches: the system's."""
        return [SwitchDaemon()]

    def switch_port_netns(self, intf: str) -> str | None:
        """The network namespace a switch port's interface is in (None: this process's)."""
        return None

    def ofctl_target(self, switch: str) -> str:
        """What `ovs-ofctl` is given to reach a switch (topology name): its bridge, on the system OVS."""
        return self.names[switch]

    def _apply_qos(self, scale: Scale) -> None:
        """The QoS policy's queues on every switch port's egress (`emulation.qosqueues` has the design)."""
        from emulation import qosqueues as emu_qos  # noqa: PLC0415

        ports = []
        for link in self.fabric.links:
            for end in self._ends_here(link):
                if self.fabric.nodes[end.node].is_switch:
                    intf = self.intf_name(end.node, end.port)
                    ports.append(emu_qos.PortShape(intf, scale.mbps(link.bw_gbps), scale.mbps(1.0)))
        burst = f"{self.burst_bytes}b" if self.burst_bytes is not None else "64k"
        try:
            self.qos_devices = emu_qos.apply(
                ports, self.qos, self.buffer_packets or 1000, burst, self.switch_port_netns
            )
        except (RuntimeError, ValueError) as exc:
            raise EmulationError(f"QoS: {exc}") from None

    def qos_counters(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per switch port (`node:port`), per queue: what its QoS queues sent and dropped."""
        from controller.sm.qos import queue_plan  # noqa: PLC0415
        from emulation import qosqueues as emu_qos  # noqa: PLC0415

        if self.qos is None:
            return {}
        by_intf = {
            self.intf_name(r.node, r.port): f"{r.node}:{r.port}"
            for r in self.fabric.port_map
            if self.fabric.nodes[r.node].is_switch
        }
        counters = emu_qos.queue_counters(sorted(by_intf), queue_plan(self.qos), self.switch_port_netns)
        return {by_intf[intf]: queues for intf, queues in counters.items()}

    def stop(self) -> None:
        """Mininet's own teardown, then a check by name: whatever is still there — because that teardown
        failed or was interrupted, or a start was cut short — is removed (`remove`), so a failed run never
        leaves bridges, interfaces or host shells for the next one to trip over."""
        if self.net is None:
            return
        net, self.net = self.net, None
        names = list(self.names.values())
        if self.qos_devices:
            from emulation import qosqueues as emu_qos  # noqa: PLC0415

            emu_qos.remove(self.qos_devices, self.switch_port_netns)
            self.qos_devices = []
        if not self.shells:  # nothing of Mininet's: remove by name at once
            remove(names, self.group)
            return
        try:
            net.stop()
        except Exception as exc:
            LOG.warning("Mininet's teardown failed (%s); removing what is left by name", exc)
        finally:
            if leftovers(names):
                remove(names)

    # --- faults and probes -------------------------------------------------------------------------------

    def set_link(self, node: str, port: int, up: bool) -> str:
        """Cut or restore a cable by downing its switch-side interface: the far end loses carrier."""
        intf = self.switch_intf(node, port)
        subprocess.run(["ip", "link", "set", "dev", intf, "up" if up else "down"], check=True)
        return intf

    def set_switch(self, name: str, up: bool) -> list[str]:
        """A switch "power cut": every cable of the switch loses carrier (the bridge and its flows stay,
        as a rebooting switch's configuration would)."""
        if not self.fabric.nodes[name].is_switch:
            raise KeyError(f"{name} is not a switch")
        ports = sorted(ref.port for ref in self.fabric.port_map if ref.node == name)
        return [self.set_link(name, port, up) for port in ports]

    def endpoints(self, hosts: Container[str] | None = None) -> list[Endpoint]:
        """Every host port (or only those of `hosts`) with its namespace, interface and MAC."""
        from controller.sm.addressing import parse_mac  # noqa: PLC0415

        return [Endpoint(host, self.netns(host), self.intf_name(host, port), parse_mac(mac))
                for (host, port), (mac, _) in sorted(self.addresses.items())
                if hosts is None or host in hosts]  # fmt: skip

    def popen(self, host: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc: subprocess.Popen[Any] = self.node(host).popen(prioritised(argv), **kwargs)
        return proc


__all__ = [
    "ControllerTarget",
    "EmulationError",
    "MininetFabric",
    "Scale",
    "host_shells",
    "leftovers",
    "listening",
    "mininet_available",
    "remove",
]
