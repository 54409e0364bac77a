"""A fabric realised on real Open vSwitch without Mininet: bridges, veth cables, host namespaces.

Used by the controller's integration tests and benchmarks (the Mininet realisation comes with the emulation
issue and shares the conventions): every switch is a userspace-datapath bridge (no kernel module here)
speaking OpenFlow 1.3 in `fail_mode=secure` — it forwards only what the controller installed — with the
datapath id the controller expects (the node GUID) and OpenFlow port numbers equal to topology port
numbers (`ofport_request`), so LFT ports need no translation.  Hosts are network namespaces with the
address the subnet manager derives from their LID and TX checksum offload off (the userspace datapath does
not complete partial checksums, so TCP would fail).

Every object is named with a short per-instance tag, and `down()` removes exactly what `up()` created.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from topologies.model import Fabric, PortRef

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"


def _run(
    argv: Sequence[str], stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), input=stdin, check=False, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])} ... failed ({result.returncode}): {result.stderr.strip()[:800]}"
        )
    return result


def ovs_unavailable() -> str | None:
    """Why OVS-based emulation cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, OVS)"
    for tool in ("ovs-vsctl", "ovs-ofctl", "ip", "ethtool"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (Debian: openvswitch-switch iproute2 ethtool)"
    if not os.path.exists(OVS_CTL):
        return f"{OVS_CTL} missing"
    return None


class OvsDaemon:
    """Starts OVS if it is not running and stops it afterwards only if this object started it."""

    def __init__(self) -> None:
        self.started = False

    @staticmethod
    def running() -> bool:
        return _run(["ovs-vsctl", "--timeout=2", "show"], check=False).returncode == 0

    def ensure_running(self) -> None:
        if self.running():
            return
        _run([OVS_CTL, "--system-id=random", "--no-monitor", "start"], check=False)
        for _ in range(50):
            if self.running():
                self.started = True
                return
            time.sleep(0.1)
        raise RuntimeError("Open vSwitch did not start (see /var/log/openvswitch/)")

    def stop_if_started(self) -> None:
        if self.started:
            _run([OVS_CTL, "stop"], check=False)
            self.started = False


class OvsFabric:
    def __init__(
        self,
        fabric: Fabric,
        addresses: Mapping[tuple[str, int], tuple[str, str]],
        controller: str | None = "tcp:127.0.0.1:6653",
        tag: str | None = None,
        inactivity_probe_ms: int = 30000,
        prefix_len: int = 16,
        mtu: int = 1500,
    ) -> None:
        self.fabric = fabric
        self.addresses = addresses
        self.controller = controller
        self.tag = tag or "f" + secrets.token_hex(2)[:3]
        self.inactivity_probe_ms = inactivity_probe_ms
        self.prefix_len = prefix_len
        self.mtu = mtu
        self._switch_index = {s.name: i for i, s in enumerate(fabric.switches)}
        self._host_index = {h.name: i for i, h in enumerate(fabric.hosts)}
        self.bridges: list[str] = []
        self.veths: list[str] = []
        self.namespaces: list[str] = []

    # --- names -------------------------------------------------------------------------------------------

    def bridge_of(self, switch: str) -> str:
        return f"{self.tag}s{self._switch_index[switch]}"

    def namespace_of(self, host: str) -> str:
        return f"{self.tag}-h{self._host_index[host]}"

    def veth_of(self, node: str, port: int) -> str:
        """Root-namespace interface of a switch port (for a host port: the switch-side end)."""
        if node in self._switch_index:
            return f"{self.bridge_of(node)}p{port}"
        peer = self.fabric.peer(node, port)
        assert peer is not None, f"{node}:{port} is not cabled"
        return self.veth_of(peer.node, peer.port)

    @staticmethod
    def host_interface(port: int) -> str:
        return f"eth{port - 1}"

    # --- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> OvsFabric:
        self.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def up(self) -> None:
        try:
            self._build()
        except BaseException:
            self.down()
            raise

    def _build(self) -> None:
        fabric = self.fabric
        ip_cmds: list[str] = []
        root_ends: list[str] = []
        host_ports: list[tuple[str, int, str]] = []  # host, port, temporary name
        for link in fabric.links:
            ends = [link.a, link.b]
            if all(fabric.nodes[e.node].is_switch for e in ends):
                a, b = (self.veth_of(e.node, e.port) for e in ends)
                root_ends.append(b)
            else:
                host_end = next(e for e in ends if fabric.nodes[e.node].is_host)
                switch_end = next(e for e in ends if fabric.nodes[e.node].is_switch)
                a = self.veth_of(switch_end.node, switch_end.port)
                b = f"{self.tag}h{self._host_index[host_end.node]}x{host_end.port}"
                host_ports.append((host_end.node, host_end.port, b))
            ip_cmds.append(f"link add {a} mtu {self.mtu} type veth peer name {b} mtu {self.mtu}")
            self.veths.append(a)
            root_ends.append(a)
        for node in fabric.hosts:
            ns = self.namespace_of(node.name)
            ip_cmds.append(f"netns add {ns}")
            self.namespaces.append(ns)
        for host, _, temp in host_ports:
            ip_cmds.append(f"link set {temp} netns {self.namespace_of(host)}")
        ip_cmds += [f"link set {v} up" for v in root_ends]
        _run(["ip", "-batch", "-"], "\n".join(ip_cmds) + "\n")
        per_host: dict[str, list[str]] = {}
        for host, port, temp in host_ports:
            name = self.host_interface(port)
            mac, ip = self.addresses[(host, port)]
            per_host.setdefault(host, ["link set lo up"]).extend(
                [
                    f"link set {temp} name {name}",
                    f"link set {name} address {mac}",
                    f"addr add {ip}/{self.prefix_len} dev {name}",
                    f"link set {name} up",
                ]
            )
        for host, cmds in per_host.items():
            ns = self.namespace_of(host)
            _run(["ip", "-n", ns, "-batch", "-"], "\n".join(cmds) + "\n")
            ifaces = " ".join(self.host_interface(p) for h, p, _ in host_ports if h == host)
            script = (
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1; "
                f"for i in {ifaces}; do ethtool -K $i tx off >/dev/null 2>&1 || exit 1; done"
            )
            _run(["ip", "netns", "exec", ns, "sh", "-c", script])
        self._create_bridges()

    def _create_bridges(self) -> None:
        args = ["ovs-vsctl", "--timeout=60"]
        for switch in self.fabric.switches:
            br = self.bridge_of(switch.name)
            self.bridges.append(br)
            args += [
                "--", "add-br", br,
                "--", "set", "Bridge", br, "datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
                f"other-config:datapath-id={switch.guid:016x}", "other-config:disable-in-band=true",
            ]  # fmt: skip
            for ref in sorted(r for r in self.fabric.port_map if r.node == switch.name):
                veth = self.veth_of(ref.node, ref.port)
                args += [
                    "--",
                    "add-port",
                    br,
                    veth,
                    "--",
                    "set",
                    "Interface",
                    veth,
                    f"ofport_request={ref.port}",
                ]
        _run(args)
        if self.controller is not None:
            self.set_controller(self.controller)

    def set_controller(self, target: str | None) -> None:
        """Point every bridge at `target` (None: remove controllers).  Note: OVS flushes a bridge's flows
        when its controller list goes from empty to set."""
        args = ["ovs-vsctl", "--timeout=60"]
        for br in self.bridges:
            if target is None:
                args += ["--", "del-controller", br]
            else:
                ctl = f"@c{len(args)}"
                args += [
                    "--", f"--id={ctl}", "create", "Controller", f"target=\"{target}\"",
                    f"inactivity_probe={self.inactivity_probe_ms}", "max_backoff=1000",
                    "--", "set", "Bridge", br, f"controller=[{ctl}]",
                ]  # fmt: skip
        _run(args)

    def down(self) -> None:
        """Remove what up() created (idempotent); nothing else is touched."""
        if self.bridges:
            args = ["ovs-vsctl", "--timeout=60"]
            for br in self.bridges:
                args += ["--", "--if-exists", "del-br", br]
            _run(args, check=False)
            self.bridges = []
        if self.veths:
            _run(["ip", "-force", "-batch", "-"], "".join(f"link del {v}\n" for v in self.veths), check=False)
            self.veths = []
        if self.namespaces:
            _run(
                ["ip", "-force", "-batch", "-"],
                "".join(f"netns del {n}\n" for n in self.namespaces),
                check=False,
            )
            self.namespaces = []

    # --- faults and traffic ------------------------------------------------------------------------------

    def set_link(self, node: str, port: int, up: bool) -> str:
        """Administratively down/up one end of a cable: the far end loses carrier like a pulled cable."""
        veth = self.veth_of(node, port)
        _run(["ip", "link", "set", veth, "up" if up else "down"])
        return veth

    def link_state(self, node: str, port: int) -> str:
        veth = self.veth_of(node, port)
        return _run(["ovs-vsctl", "get", "Interface", veth, "link_state"]).stdout.strip()

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(["ip", "netns", "exec", self.namespace_of(host), *argv], **kwargs)

    def run(self, host: str, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.namespace_of(host), *argv],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def dump_flows(self, switch: str) -> list[str]:
        out = _run(
            ["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", self.bridge_of(switch)]
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip() and "OFPST_FLOW" not in line]

    def ping_all(
        self, pairs: Iterable[tuple[str, str]], timeout_s: float = 2.0, count: int = 1, per_host: int = 16
    ) -> dict[tuple[str, str], bool]:
        """Ping many pairs at once: one shell per source host, `per_host` of its pings at a time."""
        by_src: dict[str, list[str]] = {}
        ip_of: dict[str, str] = {}
        for (host, _), (_, ip) in sorted(self.addresses.items(), reverse=True):
            ip_of[host] = ip  # lowest port wins
        wanted = list(pairs)
        for src, dst in wanted:
            by_src.setdefault(src, []).append(dst)
        procs = {}
        for src, dsts in by_src.items():
            chunks = [dsts[i : i + per_host] for i in range(0, len(dsts), per_host)]
            script = "; ".join(
                "for p in "
                + " ".join(f"{d}={ip_of[d]}" for d in chunk)
                + f"; do (ping -n -q -c {count} -i 0.2 -W {timeout_s:g} ${{p#*=}} >/dev/null 2>&1 "
                "&& echo ok ${p%%=*} || echo fail ${p%%=*}) & done; wait"
                for chunk in chunks
            )
            procs[src] = self.popen(src, ["sh", "-c", script], stdout=subprocess.PIPE, text=True)
        result: dict[tuple[str, str], bool] = {}
        for src, proc in procs.items():
            out, _ = proc.communicate(timeout=(timeout_s + count) * (len(by_src[src]) // per_host + 1) + 60)
            for line in out.split("\n"):
                if line:
                    status, dst = line.split()
                    result[(src, dst)] = status == "ok"
        return {pair: result.get(pair, False) for pair in wanted}


def leftovers(tag: str) -> list[str]:
    """Bridges, interfaces and namespaces carrying `tag` (for cleanup checks)."""
    found: list[str] = []
    bridges = _run(["ovs-vsctl", "--timeout=5", "list-br"], check=False).stdout.split()
    found += [f"bridge {b}" for b in bridges if b.startswith(tag)]
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    found += [
        f"link {line.split(':')[1].strip().split('@')[0]}" for line in links.splitlines() if f" {tag}" in line
    ]
    netns = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    found += [f"netns {n.split()[0]}" for n in netns if n.startswith(tag)]
    return found


def port_refs(fabric: Fabric, switch: str) -> list[PortRef]:
    return sorted(r for r in fabric.port_map if r.node == switch)


__all__ = ["OvsDaemon", "OvsFabric", "leftovers", "ovs_unavailable", "port_refs"]
