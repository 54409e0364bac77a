"""A fabric realised on real Open vSwitch without Mininet: bridges, veth cables and host namespaces.

Every switch becomes a bridge on OVS's userspace datapath (`datapath_type=netdev`: there is no kernel
module here) speaking OpenFlow 1.3 in `fail_mode=secure`, so it forwards only what a controller installed
and never falls back to learning-switch behaviour (which would loop on a fat-tree).  The bridge's datapath
id is the node GUID, the id the controller looks switches up by, and every port is added with
`ofport_request` equal to its topology port number, so OpenFlow port numbers are topology port numbers and
forwarding tables need no translation.  Hosts are network namespaces with interfaces `eth{port-1}`.

Speed matters (a k=8 fat-tree has 80 bridges, 128 hosts, 384 cables), so a build is a handful of processes:
one `ip -batch` creates every namespace and veth, a few configure the hosts in parallel, and one `ovs-vsctl`
transaction creates every bridge, port and controller record.

Every object is named `{tag}...` with a short per-instance tag and index-based suffixes (Linux interface
names are limited to 15 characters, topology names are not); `down()` removes exactly what `up()` created,
and `up()` refuses to start if any name it would use already exists, so it never deletes what is not its own.

Beware the kernel's ARP table: it is shared by all namespaces, and beyond net.ipv4.neigh.default.gc_thresh3
(1024) learned entries new ones are refused ("neighbor table overflow"), so all-pairs traffic among more
than ~22 hosts fails for want of ARP.  `static_arp=True` installs permanent entries, which do not count.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import re
import secrets
import shutil
import string
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from controller.sm.addressing import IPV4_PREFIX_LEN
from emulation.priority import prioritise_ovs, prioritised
from topologies.model import Fabric

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
TOOLS = ("ovs-vsctl", "ovs-ofctl", "ip", "ethtool", "ping", "sysctl")
IFNAMSIZ = 15  # longest Linux interface name
HOST_CONFIG_PROCESSES = 4  # parallel `ip -batch` processes configuring host namespaces


_Done = subprocess.CompletedProcess[str]


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> _Done:
    result = subprocess.run(list(argv), input=stdin, check=False, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({result.returncode}): {result.stderr[:999]}")
    return result


def ovs_available() -> str | None:
    """None if OVS emulation can run here (root, OVS and iproute2 tools present), else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, Open vSwitch)"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian: openvswitch-switch iproute2 ethtool iputils-ping procps)"
    if not os.path.exists(OVS_CTL):
        return f"{OVS_CTL} missing (Debian: openvswitch-switch)"
    return None


def ovs_running() -> bool:
    return _run(["ovs-vsctl", "--timeout=2", "show"], check=False).returncode == 0


class OvsDaemon:
    """Starts Open vSwitch if need be; stops it only if this object started it (never someone else's)."""

    def __init__(self) -> None:
        self.started = False

    def ensure_running(self, timeout_s: float = 20.0) -> bool:
        """Make sure ovsdb-server and ovs-vswitchd answer, at the priority ovs-ctl means them to have
        (`emulation.priority`); True if this call had to start them."""
        if ovs_running():
            prioritise_ovs()
            return False
        _run([OVS_CTL, "--system-id=random", "start"], check=False)
        deadline = time.monotonic() + timeout_s
        while not ovs_running():
            if time.monotonic() > deadline:
                raise RuntimeError("Open vSwitch did not start (see /var/log/openvswitch/)")
            time.sleep(0.1)
        prioritise_ovs()
        self.started = True
        return True

    def stop_if_started(self) -> None:
        if self.started:
            _run([OVS_CTL, "stop"], check=False)
            self.started = False


def _name_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(interface and bridge names, namespace names) of `tag`; exact: tag "ab" never matches "ab1s0"."""
    t = re.escape(tag)
    return re.compile(rf"{t}s\d+(p\d+)?"), re.compile(rf"{t}h\d+")


def _root_links(group: int | None = None) -> list[str]:
    out = _run(["ip", "-o", "link", "show", *(["group", str(group)] if group else [])], check=False).stdout
    return [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line]


def leftovers(tag: str) -> list[str]:
    """Bridges, root-namespace interfaces and namespaces named as an `OvsFabric` with `tag` names them."""
    links, namespaces = _name_patterns(tag)
    found: list[str] = []
    if ovs_running():
        bridges = _run(["ovs-vsctl", "--timeout=5", "list-br"], check=False).stdout.split()
        found += [f"bridge {b}" for b in bridges if links.fullmatch(b)]
    found += [f"link {name}" for name in _root_links() if links.fullmatch(name)]
    found += [f"netns {name}" for name in _namespaces() if namespaces.fullmatch(name)]
    return found


class OvsFabric:
    """A `Fabric` on Open vSwitch; use as a context manager (`with OvsFabric(...) as net:`) or up()/down().

    `addresses` maps (host, port) to (MAC, IPv4); host ports without an entry get an interface but no
    address.  `controller` is an OVS target such as "tcp:127.0.0.1:6653" (None: no controller; in
    `fail_mode=secure` the bridges then drop everything until flows are added by hand).  `tag` defaults to
    three random characters.  `static_arp` gives every host permanent ARP entries for all addresses on its
    subnets, so hosts never ARP (the controller's ARP answering is then not exercised) and large fabrics
    escape the kernel's ARP table limit.
    """

    def __init__(
        self,
        fabric: Fabric,
        addresses: Mapping[tuple[str, int], tuple[str, str]],
        controller: str | None = "tcp:127.0.0.1:6653",
        tag: str | None = None,
        inactivity_probe_ms: int = 30000,
        mtu: int = 1500,
        prefix_len: int = IPV4_PREFIX_LEN,
        static_arp: bool = False,
    ) -> None:
        self.fabric, self.addresses, self.controller = fabric, addresses, controller
        alnum = string.ascii_lowercase + string.digits  # a letter first, then two more: 46656 tags
        self.tag = tag or "".join(map(secrets.choice, (string.ascii_lowercase, alnum, alnum)))
        self.inactivity_probe_ms, self.mtu, self.prefix_len = inactivity_probe_ms, mtu, prefix_len
        self.static_arp = static_arp
        if not re.fullmatch(r"[a-z][a-z0-9]*", self.tag):
            raise ValueError(f"tag {self.tag!r}: lowercase letters and digits, starting with a letter")
        self._switch_index = {node.name: i for i, node in enumerate(fabric.switches)}
        self._host_index = {node.name: i for i, node in enumerate(fabric.hosts)}
        for link in fabric.links:
            if fabric.nodes[link.a.node].is_host and fabric.nodes[link.b.node].is_host:
                raise ValueError(f"link {link}: host-to-host cables are not supported")
        longest = max((self._port_name(s.name, s.ports) for s in fabric.switches), key=len, default="")
        if len(longest) > IFNAMSIZ:
            raise ValueError(f"tag {self.tag!r} too long: interface {longest} exceeds {IFNAMSIZ} characters")
        self._group = (1 << 16) + secrets.randbelow(1 << 30)  # interface group of our veths, see down()
        # What up() created (or is creating): the only things down() removes.
        self._bridges: list[str] = []
        self._veths: list[str] = []  # one root-namespace end per pair; deleting it deletes the pair
        self._namespaces: list[str] = []

    def _port_name(self, switch: str, port: int) -> str:
        return f"{self.tag}s{self._switch_index[switch]}p{port}"

    def bridge_of(self, switch: str) -> str:
        return f"{self.tag}s{self._switch_index[switch]}"

    def namespace_of(self, host: str) -> str:
        return f"{self.tag}h{self._host_index[host]}"

    def veth_of(self, node: str, port: int) -> str:
        """Root-namespace interface of a port: the port itself on a switch, the switch-side end for a host
        port (the only end OVS sees and `set_link` acts on)."""
        if node in self._switch_index:
            return self._port_name(node, port)
        peer = self.fabric.peer(node, port)
        if peer is None:
            raise KeyError(f"{node}:{port} is not cabled")
        return self._port_name(peer.node, peer.port)

    def host_interface(self, host: str, port: int) -> str:
        """Interface name of a host port inside its namespace."""
        if host not in self._host_index:
            raise KeyError(f"{host} is not a host")
        return f"eth{port - 1}"

    @property
    def bridges(self) -> list[str]:
        return [self.bridge_of(s.name) for s in self.fabric.switches]

    def address_of(self, host: str) -> str:
        """IPv4 address of a host's lowest-numbered addressed port."""
        ports = sorted(p for h, p in self.addresses if h == host)
        if not ports:
            raise KeyError(f"{host} has no address")
        return self.addresses[(host, ports[0])][1]

    # --- lifecycle --------------------------------------------------------------------------------------

    def __enter__(self) -> OvsFabric:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Build everything; on failure remove what was created and re-raise."""
        if self._bridges or self._veths or self._namespaces:
            raise RuntimeError(f"OvsFabric {self.tag} is already up")
        if not ovs_running():
            raise RuntimeError("Open vSwitch is not running (see OvsDaemon.ensure_running)")
        taken = leftovers(self.tag)
        if taken:
            raise RuntimeError(f"tag {self.tag} already in use: {', '.join(taken[:5])}")
        try:
            self._build()
            self._wait_ports_live()
        except BaseException:
            with contextlib.suppress(RuntimeError):  # the build error matters more
                self.down()
            raise

    def _build(self) -> None:
        fabric, mtu = self.fabric, self.mtu
        dev = f"mtu {mtu} group {self._group}"
        root_ends: list[str] = []
        host_ports: dict[str, list[int]] = {h.name: [] for h in fabric.hosts}
        self._namespaces = [self.namespace_of(h.name) for h in fabric.hosts]
        cmds = [f"netns add {ns}" for ns in self._namespaces]
        for link in fabric.links:
            a, b = sorted((link.a, link.b), key=lambda e: fabric.nodes[e.node].is_host)  # switch end first
            root = self._port_name(a.node, a.port)
            self._veths.append(root)
            root_ends.append(root)
            if fabric.nodes[b.node].is_switch:
                far = self._port_name(b.node, b.port)
                root_ends.append(far)
                cmds.append(f"link add {root} {dev} type veth peer name {far} {dev}")
                continue
            # The host end is born inside its namespace with its final name and MAC: no rename, no move.
            host_ports[b.node].append(b.port)
            mac = self.addresses.get((b.node, b.port), (None, None))[0]
            peer = f"name {self.host_interface(b.node, b.port)} mtu {mtu} netns {self.namespace_of(b.node)}"
            cmds.append(f"link add {root} {dev} type veth peer {peer}" + (f" address {mac}" if mac else ""))
        _run(["ip", "-batch", "-"], "\n".join(cmds) + "\n")
        # No IPv6 on root ends: with a link-local address the kernel sends router solicitations and MLD
        # reports from one end of a switch-to-switch pair, which reach the other end's bridge as traffic.
        # `addrgenmode none` before the link comes up (netlink, so it also works where /proc/sys is
        # read-only, as in a container) means no address is ever made, so nothing is ever sent.
        _run(
            ["ip", "-batch", "-"],
            "".join(f"link set {name} addrgenmode none\nlink set {name} up\n" for name in root_ends),
        )
        # Hosts and bridges are independent: configure namespaces while ovs-vswitchd adds the ports.
        host_cmds = [self._host_config(host, ports) for host, ports in host_ports.items()]
        parts = [host_cmds[i::HOST_CONFIG_PROCESSES] for i in range(HOST_CONFIG_PROCESSES) if host_cmds[i:]]
        with ThreadPoolExecutor(HOST_CONFIG_PROCESSES + 1) as pool:
            futures: list[Future[Any]] = [pool.submit(_run, ["ip", "-batch", "-"], "".join(c)) for c in parts]
            self._bridges = self.bridges
            futures.append(pool.submit(self._create_bridges))
            for future in futures:
                future.result()

    def _wait_ports_live(self, timeout_s: float = 30.0) -> None:
        """Return once OVS reports every port's link up.  ovs-vswitchd learns carrier from netlink a moment
        after the port is added; traffic sent before that is dropped, which made first pings flaky."""
        ours = {self.veth_of(ref.node, ref.port) for ref in self.fabric.port_map}  # every switch port
        argv = "ovs-vsctl --timeout=30 --format=csv --no-headings --columns=name,link_state list Interface"
        deadline = time.monotonic() + timeout_s
        while True:
            out = _run(argv.split()).stdout
            rows = (line.partition(",") for line in out.splitlines())
            waiting = ours - {name.strip('"') for name, _, state in rows if state.strip('"') == "up"}
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ports not up after {timeout_s} s: {', '.join(sorted(waiting)[:5])}")
            time.sleep(0.05)

    def _host_config(self, host: str, ports: Sequence[int]) -> str:
        """One `ip -batch` line configuring a host inside its namespace.

        IPv6 gets no address (`addrgenmode none` before the link is up), so router solicitations, MLD
        reports and DAD probes never reach the switches as unexpected packets.
        TX checksum offload is turned off because veth hands packets over with the
        checksum only partially computed; the kernel datapath would complete it, but OVS's userspace datapath
        reads packets from an AF_PACKET socket and forwards them as they are, so receivers in other
        namespaces drop every TCP segment (even the SYN) and UDP datagram as corrupt.  ICMP checksums are
        always computed in software, which is why ping works without this and TCP does not.
        """
        script = ["ip link set lo up"]
        for port in sorted(ports):
            name = self.host_interface(host, port)
            script.append(f"ethtool -K {name} tx off >/dev/null")
            own = self.addresses.get((host, port))
            if own is not None:
                script.append(f"ip addr add {own[1]}/{self.prefix_len} dev {name}")
            script.append(f"ip link set {name} addrgenmode none")
            script.append(f"ip link set {name} up")
            if self.static_arp and own is not None:
                subnet = ipaddress.ip_interface(f"{own[1]}/{self.prefix_len}").network
                neigh = "".join(
                    f"neigh replace {ip} lladdr {mac} dev {name} nud permanent\\n"
                    for (other, _), (mac, ip) in self.addresses.items()
                    if other != host and ipaddress.ip_address(ip) in subnet
                )
                script.append(f"printf '{neigh}' | ip -batch -")  # one argument: fine up to ~2000 hosts
        return f'netns exec {self.namespace_of(host)} sh -ec "{"; ".join(script)}"\n'

    def _controller_args(self, bridge: str, target: str, index: int) -> list[str]:
        ref = f"@c{index}"
        return [
            "--", f"--id={ref}", "create", "Controller", f'target="{target}"',
            f"inactivity_probe={self.inactivity_probe_ms}", "max_backoff=1000",
            "--", "set", "Bridge", bridge, f"controller=[{ref}]",
        ]  # fmt: skip

    def _create_bridges(self) -> None:
        """One ovsdb transaction for all bridges, ports and controllers (2 s, not minutes, for k=8).

        `ofport_request` makes OpenFlow port numbers equal topology port numbers; without it OVS numbers
        ports in the order it happens to add them.  In-band control is disabled: it would install hidden
        flows for reaching the controller through the fabric itself, which is not how it is reached here.
        """
        args = ["ovs-vsctl", "--timeout=120"]
        for index, switch in enumerate(self.fabric.switches):
            br = self.bridge_of(switch.name)
            args += [
                "--", "add-br", br,
                "--", "set", "Bridge", br, "datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
                f"other-config:datapath-id={switch.guid:016x}", "other-config:disable-in-band=true",
            ]  # fmt: skip
            for port in sorted(r.port for r in self.fabric.port_map if r.node == switch.name):
                name = self._port_name(switch.name, port)
                args += ["--", "add-port", br, name, "--", "set", "Interface", name, f"ofport_request={port}"]
            if self.controller is not None:
                args += self._controller_args(br, self.controller, index)
        _run(args)

    def down(self) -> None:
        """Remove the bridges, veths and namespaces this instance created; idempotent, touches nothing else.

        Veths are deleted explicitly (namespace deletion completes asynchronously) and by interface group,
        if it holds only our names: one by one, each waits for an RCU grace period (~20 ms, 7.5 s at k=8);
        a group goes in one batch (0.15 s).  The rest is ovs-vswitchd removing ports and bridges, ~10 and
        ~40 ms each, one after the other (10 s at k=8)."""
        errors: list[str] = []
        bridges, veths, namespaces = self._bridges, self._veths, self._namespaces
        self._bridges, self._veths, self._namespaces = [], [], []
        if bridges and ovs_running():
            args = ["ovs-vsctl", "--timeout=120"]
            for br in bridges:
                args += ["--", "--if-exists", "del-br", br]
            result = _run(args, check=False)
            if result.returncode != 0:
                errors.append(f"ovs-vsctl del-br: {result.stderr.strip()[:300]}")
        in_group = _root_links(self._group) if veths else []
        if in_group and all(_name_patterns(self.tag)[0].fullmatch(name) for name in in_group):
            _run(["ip", "link", "del", "group", str(self._group)], check=False)
        present, present_ns = set(_root_links()), set(_namespaces())
        cmds = [f"link del {v}\n" for v in veths if v in present]
        cmds += [f"netns del {ns}\n" for ns in namespaces if ns in present_ns]
        if cmds:
            result = _run(["ip", "-force", "-batch", "-"], "".join(cmds), check=False)
            if result.returncode != 0:
                errors.append(f"ip: {result.stderr.strip()[:300]}")
        if errors:
            raise RuntimeError(f"OvsFabric {self.tag} teardown incomplete: {'; '.join(errors)}")

    # --- operation --------------------------------------------------------------------------------------

    def set_link(self, node: str, port: int, up: bool) -> None:
        """Administratively down (or up) the root-namespace end of a port's cable.

        The far end then loses carrier as if the cable were pulled; for a host port the switch-side end is
        the one set, so the host keeps its interface up but without carrier, and OVS sees the port down."""
        _run(["ip", "link", "set", "dev", self.veth_of(node, port), "up" if up else "down"])

    def restart_bridge(self, switch: str) -> None:
        """A switch rebooted with an empty configuration, as `ovs-vsctl del-br` + `add-br` would leave it:
        the bridge is deleted, then created again with the same datapath id, ports (same OpenFlow numbers)
        and controller, but no flows and no groups.  Two transactions: in one, ovs-vswitchd would see the
        same bridge name before and after and keep the bridge (and its flows) as it was."""
        index = next(i for i, s in enumerate(self.fabric.switches) if s.name == switch)
        node = self.fabric.switches[index]
        br = self.bridge_of(switch)
        _run(["ovs-vsctl", "--timeout=60", "--if-exists", "del-br", br])
        args = ["ovs-vsctl", "--timeout=60", "--", "add-br", br,
                "--", "set", "Bridge", br, "datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
                f"other-config:datapath-id={node.guid:016x}",
                "other-config:disable-in-band=true"]  # fmt: skip
        for port in sorted(r.port for r in self.fabric.port_map if r.node == switch):
            name = self._port_name(switch, port)
            args += ["--", "add-port", br, name, "--", "set", "Interface", name, f"ofport_request={port}"]
        if self.controller is not None:
            args += self._controller_args(br, self.controller, index)
        _run(args)

    def set_controller(self, target: str | None) -> None:
        """Point every bridge at `target` in one transaction (None: remove all controllers).  OVS drops
        unreferenced Controller records itself."""
        args = ["ovs-vsctl", "--timeout=120"]
        for index, br in enumerate(self.bridges):
            args += self._controller_args(br, target, index) if target else ["--", "del-controller", br]
        _run(args)
        self.controller = target

    def dump_flows(self, switch: str, stats: bool = False) -> list[str]:
        """The switch's OpenFlow 1.3 flows, one per line; without counters unless `stats`, so that
        snapshots compare equal."""
        argv = ["ovs-ofctl", "-O", "OpenFlow13", *([] if stats else ["--no-stats"]), "dump-flows"]
        out = _run([*argv, self.bridge_of(switch)]).stdout
        return [line.strip() for line in out.splitlines() if line.strip() and "OFPST_FLOW" not in line]

    def _exec(self, host: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace_of(host), *argv]

    def run(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run` inside the host's namespace (check defaults to False)."""
        check = bool(kwargs.pop("check", False))
        return subprocess.run(self._exec(host, argv), check=check, **kwargs)

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """`subprocess.Popen` inside the host's namespace."""
        return subprocess.Popen(self._exec(host, prioritised(argv)), **kwargs)

    def ping_all(
        self, pairs: Iterable[tuple[str, str]], timeout_s: float = 2.0, parallel: int = 64
    ) -> dict[tuple[str, str], bool]:
        """Ping each (src, dst) pair, at most `parallel` pings in flight; True where an echo was answered.

        Each ping probes every 0.2 s until the first reply or `timeout_s` (rounded up to whole seconds for
        `ping -w`), so one lost probe does not fail a pair.  One shell per source host (a namespace entered
        once, not per ping) runs its pings in background batches; several shells run at once."""
        wanted = list(dict.fromkeys(pairs))
        by_src: dict[str, list[str]] = {}
        for src, dst in wanted:
            by_src.setdefault(src, []).append(dst)
        batch = max(1, min(parallel, 16))
        deadline = max(1, math.ceil(timeout_s))

        def ping_from(src: str, dsts: list[str]) -> dict[tuple[str, str], bool]:
            script = (
                f"i=0; for ip in {' '.join(self.address_of(d) for d in dsts)}; do "
                f"(ping -n -q -c 1 -i 0.2 -w {deadline} $ip >/dev/null 2>&1 && echo ok $i || echo fail $i) & "
                f"i=$((i+1)); [ $((i % {batch})) -eq 0 ] && wait; done; wait"
            )
            limit = (len(dsts) // batch + 1) * (deadline + 2) + 30
            out = self.run(src, ["sh", "-c", script], capture_output=True, text=True, timeout=limit).stdout
            answered = {line.split()[1] for line in out.splitlines() if line.startswith("ok ")}
            return {(src, d): str(i) in answered for i, d in enumerate(dsts)}

        result: dict[tuple[str, str], bool] = {}
        with ThreadPoolExecutor(max(1, parallel // batch)) as pool:
            for part in pool.map(lambda item: ping_from(*item), by_src.items()):
                result.update(part)
        return {pair: result[pair] for pair in wanted}


__all__ = ["OVS_CTL", "OvsDaemon", "OvsFabric", "leftovers", "ovs_available", "ovs_running"]
