"""A fabric realised on several shards (`emulation.shards`): same names, tables and faults as
`MininetFabric`'s shell-less build, but each shard's switches on an ovs-vswitchd of their own.

The build, in order (each step one batch; a signal at any moment stops it and `stop` removes by name):
shard namespaces and daemons; host namespaces and every veth, each end born in its namespace (host,
shard, or the other shard for a crossing veth), the controller veths and — for VXLAN crossings — the
underlay; per shard, its interfaces up and its VXLAN devices; per shard, one OVSDB transaction with its
bridges (the shards' ovs-vswitchd apply theirs in parallel while the hosts are configured); then, every
cable being up, one more per shard giving the bridges their controller.

A cable between two switches of the same shard is, unless links are shaped, a pair of OVS patch ports
(`cables`): a packet then crosses every bridge of its shard in one datapath pass, instead of a send and a
receive on packet sockets per bridge, and each shard's ovs-vswitchd has fewer devices to poll each time it
wakes (k=16 on 8 shards: 352 instead of 640; idle CPU 19 % instead of 33 %, all pairs p50 94 s instead of
108 s, docs/emulation.md).  A patch cable has no device, so it cannot carry an HTB qdisc or lose its
carrier: a fault removes both patch ports (the controller sees the ports deleted, which it treats as a
cut, and OVS's fast-failover groups see their watched port gone), and restoring adds them back with the
same OpenFlow port numbers.  Cables between shards and to hosts stay veths (or VXLAN).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Collection, Container, Mapping
from typing import Any

from emulation import lightnet, ovsdb
from emulation.headroom import HostNs
from emulation.hostconf import HostConfigError, HostIntf, configure_hosts
from emulation.mesh import Endpoint
from emulation.metrics import SwitchDaemon
from emulation.mnfabric import LOG, EmulationError, MininetFabric, listening
from emulation.shards import (
    CROSSINGS,
    VXLAN_PORT,
    ControlHub,
    ShardDaemons,
    ShardError,
    free_control_octet,
    ip_batch,
    plan,
    underlay_lines,
    uses_patch,
    vxlan_line,
)
from topologies.model import Fabric, Link, PortRef

#: One machine's part: the socket in each shard's run directory its bridges dial (`emulation.shardhost`).
RELAY_SOCKET = "controller.sock"


def veth_ports(ports: list[tuple[str, int]], not_veths: Container[str]) -> list[str]:
    """The switch ports that are veths: not patch ports, not VXLAN tunnels (AF_XDP serves veths here)."""
    return [intf for intf, _ in ports if intf not in not_veths]


class ShardedFabric(MininetFabric):
    def __init__(
        self,
        fabric: Fabric,
        addresses: Mapping[tuple[str, int], tuple[str, str]],
        shards: int,
        crossing: str = "veth",
        cables: str = "auto",
        *,
        local: Collection[int] | None = None,
        underlay: Mapping[int, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """`shards` ovs-vswitchd instances; `crossing`: what a cable between two shards is — `veth`
        (one machine) or `vxlan` (a tunnel over an underlay, as between machines); `cables`: what a cable
        between two switches of one shard is — `patch` (OVS patch ports), `veth`, or `auto` (patch unless
        links are shaped).  Needs a name prefix (every name is the run's); Mininet's shells are not
        supported on shards.  QoS queues sit on the switch ports in their shards' namespaces.

        `local` / `underlay`: one machine's part of a fabric spread over several (`emulation.shardhost`):
        only the shards in `local` are built here, with their hosts; a cable to a shard elsewhere is a
        VXLAN device between the two machines' underlay addresses (`underlay`: shard -> IP), made in this
        machine's namespace (its socket stays there) and moved into the shard's.  Each shard's bridges
        dial a relay's unix socket in its run directory (`controller_of`: a shard's namespace has no
        route out); `controller` then only says `unix:`."""
        if kwargs.get("shells"):
            raise EmulationError("a sharded fabric is built without Mininet's shells (no --cli)")
        if not kwargs.get("name_prefix"):
            raise EmulationError("a sharded fabric needs a name prefix")
        if crossing not in CROSSINGS:
            raise EmulationError(f"crossing {crossing!r}: expected one of {', '.join(CROSSINGS)}")
        super().__init__(fabric, addresses, **kwargs)
        try:
            self.plan = plan(fabric, shards)
        except ValueError as exc:
            raise EmulationError(f"shards: {exc}") from None
        self.crossing = crossing
        self.partial = local is not None
        self.local = frozenset(range(shards) if local is None else local)
        self.underlay = dict(underlay or {})
        if self.partial:
            if crossing != "vxlan":
                raise EmulationError("a fabric spread over machines crosses between them with vxlan")
            if not self.local <= set(range(shards)):
                raise EmulationError(f"local shards {sorted(self.local)}: only 0..{shards - 1} exist")
            missing = [i for i in range(shards) if i not in self.underlay]
            if missing:
                raise EmulationError(f"no underlay address for shards {missing}")
        try:
            patch = uses_patch(cables, shaped=kwargs.get("scale") is not None)
        except ValueError as exc:
            raise EmulationError(f"cables: {exc}") from None
        #: Each end of a patch cable -> the other end (topology names and ports); empty with veth cables.
        self.patched: dict[tuple[str, int], tuple[str, int]] = {}
        if patch:
            for link in fabric.links:
                a, b = (link.a.node, link.a.port), (link.b.node, link.b.port)
                both_switches = fabric.nodes[a[0]].is_switch and fabric.nodes[b[0]].is_switch
                if both_switches and self.plan.shard_of[a[0]] == self.plan.shard_of[b[0]]:
                    self.patched[a], self.patched[b] = b, a
        prefix = kwargs["name_prefix"]
        self.shard_names = [f"{prefix}x{i}" for i in range(shards)]
        self.hub_name, self.underlay_name = f"{prefix}xc", f"{prefix}xu"
        self.daemons = [ShardDaemons(ns) for ns in self.shard_names]
        self.hub: ControlHub | None = None
        #: switch port interface -> its switch (topology name)
        self._port_owner = {
            self.intf_name(r.node, r.port): r.node for r in fabric.port_map if fabric.nodes[r.node].is_switch
        }

    # --- names -------------------------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        if self.partial:
            return [*(self.names[h] for h in self.local_hosts()), *self.local_shard_names()]
        extra = [*self.shard_names, self.hub_name] + (
            [self.underlay_name] if self.crossing == "vxlan" else []
        )
        return [*self.names.values(), *extra]

    def local_hosts(self) -> list[str]:
        """The hosts built here (topology names): all of them, or one machine's part."""
        return [h.name for h in self.fabric.hosts if self.plan.shard_of[h.name] in self.local]

    def local_shard_names(self) -> list[str]:
        return [ns for i, ns in enumerate(self.shard_names) if i in self.local]

    def controller_of(self, shard: int) -> str:
        """The controller target of a shard's bridges: the run's, or for one machine's part the relay's
        socket in the shard's run directory (ovs-vswitchd dials unix sockets only there)."""
        if self.partial:
            return f"unix:{self.daemons[shard].dir / RELAY_SOCKET}"
        return self.controller

    def _local_daemons(self) -> list[ShardDaemons]:
        return [d for i, d in enumerate(self.daemons) if i in self.local]

    def headroom_hosts(self) -> list[HostNs]:
        return [HostNs(self.names[h], lightnet.netns_of(self.names[h])) for h in self.local_hosts()]

    def endpoints(self, hosts: Container[str] | None = None) -> list[Endpoint]:
        """The hosts built here (or those of `hosts` among them)."""
        ours = [h for h in self.local_hosts() if hosts is None or h in hosts]
        return super().endpoints(set(ours))

    def shard_ns(self, node: str) -> str:
        """The shard namespace holding a switch (topology name)."""
        return self.shard_names[self.plan.shard_of[node]]

    def switch_namespaces(self) -> list[HostNs]:
        return [HostNs(ns, lightnet.netns_of(ns)) for ns in self.local_shard_names()]

    def switch_daemons(self) -> list[SwitchDaemon]:
        return [SwitchDaemon(d.netns, d.dir / "ovs-vswitchd.pid", str(d.dir / "ovs-vswitchd.ctl"))
                for d in self._local_daemons()]  # fmt: skip

    def xsk_dbs(self) -> list[str | None]:
        return [d.db for d in self._local_daemons()] if self.port_choice.kind == "afxdp" else []

    def switch_port_netns(self, intf: str) -> str | None:
        """A switch port lives in its switch's shard namespace."""
        return self.shard_ns(self._port_owner[intf])

    def ofctl_target(self, switch: str) -> str:
        """The bridge's management socket in its shard's run directory (each shard has its own daemon)."""
        daemon = self.daemons[self.plan.shard_of[switch]]
        return f"unix:{daemon.dir / (self.names[switch] + '.mgmt')}"

    def describe(self) -> str:
        """One line for the user: shards, switches and cables in each, crossing cables."""
        counts = [sum(1 for s in self.fabric.switches if self.plan.shard_of[s.name] == i)
                  for i in range(self.plan.count)]  # fmt: skip
        crossing = len(self.plan.crossing(self.fabric))
        where = ", ".join(f"{ns}: {n} switches" for ns, n in zip(self.shard_names, counts, strict=True))
        count, patched = self.plan.count, len(self.patched) // 2
        inside = f"; {patched} cables inside shards as patch ports" if patched else ""
        return (f"shards: {count} ovs-vswitchd ({where}); {crossing} cables cross shards as "
                f"{self.crossing}{inside}")  # fmt: skip

    def vswitchd_pids(self) -> list[int]:
        return [pid for d in self._local_daemons() if (pid := d.vswitchd_pid) is not None]

    # --- lifecycle ---------------------------------------------------------------------------------------

    def prepare_control(self) -> str:
        """Bring up the control hub and return the address the controller must listen on (before it
        starts: it binds there)."""
        if self.hub is None:
            self.net = self  # from here on stop() removes by name
            self.hub = ControlHub(self.hub_name, free_control_octet())
            self.hub.up()
        return self.hub.controller_ip

    def _start_light(self) -> None:
        start = time.perf_counter()
        proto, *where = self.controller.split(":")
        if self.partial:
            if proto != "unix":
                raise EmulationError(
                    f"controller {self.controller!r}: one machine's part dials a unix: relay"
                )
        elif proto != "tcp":
            raise EmulationError(f"controller {self.controller!r}: only tcp:HOST:PORT is supported")
        elif self.hub is None or where[0] != self.hub.controller_ip:
            raise EmulationError("a sharded fabric's controller listens on prepare_control()'s address")

        def step(name: str) -> None:
            self.timings[name] = time.perf_counter() - start

        self.net = self
        try:
            ip_batch([f"netns add {ns}" for ns in self.local_shard_names()])
            for ns in self.local_shard_names():
                ip_batch(["link set lo up"], ns)
            for daemon in self._local_daemons():
                daemon.start()
            step("daemons_s")
            setup = self._links()
            step("links_s")
            if proto == "tcp" and not listening(where[0], int(where[1])):
                LOG.warning("nothing accepts connections at %s yet; switches keep trying", self.controller)
            self._bridges_and_hosts(setup, step)
            self.timings["mininet_build_s"] = time.perf_counter() - start
            self._shape_links()
        except (ShardError, HostConfigError) as exc:
            self.stop()
            raise EmulationError(str(exc)) from None
        except BaseException:
            self.stop()
            raise
        self.timings["mininet_start_s"] = time.perf_counter() - start

    def _links(self) -> list[HostIntf]:
        """Every namespace and cable; returns each host's configuration lines."""
        fabric, mtu = self.fabric, self.mtu
        hosts = [self.names[h] for h in self.local_hosts()]
        self._hosts = {name: lightnet.LightHost(name) for name in hosts}
        root = [f"netns add {h}" for h in hosts]
        per_ns: dict[str, list[str]] = {ns: [] for ns in self.local_shard_names()}
        if self.hub is not None:
            root += self.hub.root_lines(self.shard_names)
            per_ns = {ns: self.hub.shard_lines(i) for i, ns in enumerate(self.shard_names)}
        if self.crossing == "vxlan" and not self.partial:
            under_root, under_ns = underlay_lines(self.underlay_name, self.shard_names)
            root += under_root
            for ns, lines in under_ns.items():
                per_ns.setdefault(ns, []).extend(lines)
        setup: list[HostIntf] = []
        up: dict[str, list[str]] = {ns: [] for ns in self.local_shard_names()}
        for vni, link in enumerate(fabric.links, 1):
            a, b = sorted((link.a, link.b), key=lambda e: fabric.nodes[e.node].is_host)  # switch end first
            if (a.node, a.port) in self.patched:
                continue  # two patch ports, written with the bridges
            here = [
                e
                for e in (a, b)
                if fabric.nodes[e.node].is_switch and self.plan.shard_of[e.node] in self.local
            ]
            if not here:
                continue  # another machine's cable
            if self.partial and len(here) == 1 and fabric.nodes[b.node].is_switch:  # to another machine
                end, other = (a, b) if here[0] is a else (b, a)
                intf, ns = self.intf_name(end.node, end.port), self.shard_ns(end.node)
                mine, theirs = self.plan.shard_of[end.node], self.plan.shard_of[other.node]
                root += [f"link add {intf} mtu {mtu} type vxlan id {vni} local {self.underlay[mine]} "
                         f"remote {self.underlay[theirs]} dstport {VXLAN_PORT} nolearning",
                         f"link set {intf} netns {ns}"]  # fmt: skip
                up[ns].append(intf)
                continue
            a_intf, a_ns = self.intf_name(a.node, a.port), self.shard_ns(a.node)
            up[a_ns].append(a_intf)
            if fabric.nodes[b.node].is_host:
                intf, name = self.intf_name(b.node, b.port), self.names[b.node]
                address = self.addresses.get((b.node, b.port))
                mac = f" address {address[0]}" if address else ""
                root.append(f"link add {a_intf} netns {a_ns} mtu {mtu} type veth peer name {intf} "
                            f"mtu {mtu} netns {name}{mac}")  # fmt: skip
                setup.append(HostIntf(lightnet.netns_of(name), intf, address[1] if address else None,
                                      self.prefix_len))  # fmt: skip
                continue
            b_intf, b_ns = self.intf_name(b.node, b.port), self.shard_ns(b.node)
            up[b_ns].append(b_intf)
            if a_ns == b_ns or self.crossing == "veth" or self.partial:  # partial: both shards here
                root.append(f"link add {a_intf} netns {a_ns} mtu {mtu} type veth peer name {b_intf} "
                            f"netns {b_ns} mtu {mtu}")  # fmt: skip
            else:
                sa, sb = self.plan.shard_of[a.node], self.plan.shard_of[b.node]
                per_ns[a_ns].append(vxlan_line(a_intf, vni, sa, sb, f"{a_ns}u", mtu))
                per_ns[b_ns].append(vxlan_line(b_intf, vni, sb, sa, f"{b_ns}u", mtu))
        ip_batch(root)
        for ns, lines in per_ns.items():
            ends = [f"link set {n} addrgenmode none\nlink set {n} up" for n in up.get(ns, [])]
            if lines or ends:
                ip_batch(lines + ends, ns)
        return setup

    def _bridges_and_hosts(self, setup: list[HostIntf], step: Any) -> None:
        """One OVSDB transaction per shard; the hosts are configured while the shards apply them; then the
        controllers (a switch connecting with host ports still down costs the controller two routings)."""
        fabric = self.fabric
        ports: dict[str, list[tuple[str, int]]] = {s.name: [] for s in fabric.switches}
        for ref in fabric.port_map:
            if fabric.nodes[ref.node].is_switch:
                ports[ref.node].append((self.intf_name(ref.node, ref.port), ref.port))
        patches: dict[str, dict[str, str]] = {s.name: {} for s in fabric.switches}
        for (node, port), peer in self.patched.items():
            patches[node][self.intf_name(node, port)] = self.intf_name(*peer)
        tunnels = {
            self.intf_name(end.node, end.port)
            for link in fabric.links
            for end in (link.a, link.b)
            if self.crossing == "vxlan" and self._crosses(link)
        }
        conns: list[ovsdb.Ovsdb] = []
        specs: list[list[ovsdb.BridgeSpec]] = []
        try:
            for i, daemon in enumerate(self.daemons):
                if i not in self.local:
                    continue
                bridges = [
                    ovsdb.BridgeSpec(self.names[s.name], s.guid, sorted(ports[s.name], key=lambda p: p[1]),
                                     self.controller_of(i), self.inactivity_probe_ms,
                                     {"dp-desc": self.names[s.name]}, patches[s.name],
                                     self.fast_ports(veth_ports(ports[s.name], {*patches[s.name], *tunnels}),
                                                     daemon.db))
                    for s in fabric.switches if self.plan.shard_of[s.name] == i
                ]  # fmt: skip
                conn = ovsdb.Ovsdb(daemon.db)
                conns.append(conn)
                conn.transact(ovsdb.bridge_operations(bridges, controllers=False))
                specs.append(bridges)
            step("bridges_committed_s")
            configure_hosts(setup)
            step("hosts_s")
            for conn, bridges in zip(conns, specs, strict=True):  # every cable up: now dial the controller
                conn.transact(ovsdb.controller_operations(bridges))
            deadline = time.monotonic() + 300
            for daemon, conn in zip(self._local_daemons(), conns, strict=True):
                while not conn.applied():
                    daemon.check()
                    if time.monotonic() > deadline:
                        raise EmulationError(f"shard {daemon.netns}: configuration not applied in 300 s")
                    time.sleep(0.05)
            step("bridges_s")
        finally:
            for conn in conns:
                conn.close()

    def _ends_here(self, link: Link) -> tuple[PortRef, ...]:
        """One machine's part shapes the ends of a cable it holds: a host's, or a switch's in one of its
        shards (a cable to another machine is shaped at both ends, each by its own machine)."""
        return tuple(e for e in (link.a, link.b) if self.plan.shard_of[e.node] in self.local)

    def _crosses(self, link: Link) -> bool:
        """A cable between switches of two shards."""
        nodes, shard = self.fabric.nodes, self.plan.shard_of
        a, b = link.a.node, link.b.node
        return nodes[a].is_switch and nodes[b].is_switch and shard[a] != shard[b]

    def _switch_tc(self, lines: Mapping[str, list[str]]) -> None:
        by_ns: dict[str, list[str]] = {}
        owner = {self.intf_name(r.node, r.port): r.node for r in self.fabric.port_map}
        for dev, dev_lines in lines.items():
            by_ns.setdefault(self.shard_ns(owner[dev]), []).extend(dev_lines)
        for ns, script in by_ns.items():
            subprocess.run(["tc", "-n", ns, "-batch", "-"], input="\n".join(script) + "\n", check=True,
                           capture_output=True, text=True)  # fmt: skip

    def stop(self) -> None:
        """Daemons killed, then every namespace of the run deleted (their veths, VXLAN devices and taps go
        with them) and the control hub; whatever stage the build reached."""
        if self.net is None:
            return
        self.net = None
        self.qos_devices = []  # IFBs are in the shards' namespaces, deleted with them below
        for daemon in self._local_daemons():
            daemon.kill()
        for daemon in self._local_daemons():
            daemon.stop()
        present = set(lightnet.namespaces())
        names = (self.node_names if self.partial  # another machine's namespaces are not ours to delete
                 else [*self.names.values(), *self.shard_names, self.underlay_name])  # fmt: skip
        lines = [f"netns del {n}" for n in names if n in present]
        if self.hub_name in lightnet.root_links():
            lines.append(f"link del {self.hub_name}")
        with contextlib.suppress(ShardError):
            ip_batch(lines, force=True)
        self.hub = None

    # --- faults ------------------------------------------------------------------------------------------

    def set_link(self, node: str, port: int, up: bool) -> str:
        """Cut or restore a cable.  A veth end going down takes the carrier of the other end with it; a
        tunnel has no carrier, so a crossing VXLAN cable is cut at both ends, as a cut fibre is seen."""
        peer = self.fabric.peer(node, port)
        if peer is None:
            raise KeyError(f"{node}:{port} is not cabled")
        if (node, port) in self.patched:
            return self._set_patch(node, port, up)
        ends = [(node, port), (peer.node, peer.port)]
        switch_ends = [(n, p) for n, p in ends if self.fabric.nodes[n].is_switch]
        tunnel = self.crossing == "vxlan" and len({self.shard_ns(n) for n, _ in switch_ends}) == 2
        state = "up" if up else "down"
        ends = switch_ends if tunnel else switch_ends[:1]
        if self.partial:  # the other machine sets its own end (`emulation.cluster`)
            ends = [(n, p) for n, p in ends if self.plan.shard_of[n] in self.local]
        for n, p in ends:
            subprocess.run(["ip", "-n", self.shard_ns(n), "link", "set", "dev", self.intf_name(n, p), state],
                           check=True)  # fmt: skip
        return self.intf_name(*(ends or switch_ends)[0])

    def _set_patch(self, node: str, port: int, up: bool) -> str:
        """Cut a patch cable by removing both its patch ports, restore it by adding them back (same
        OpenFlow port numbers), in one transaction that returns once the shard's ovs-vswitchd applied it."""
        ends = [(node, port), self.patched[(node, port)]]
        daemon = self.daemons[self.plan.shard_of[node]]
        argv = ["ovs-vsctl", f"--db=unix:{daemon.db}", "--timeout=30"]
        for (n, p), (peer_n, peer_p) in zip(ends, reversed(ends), strict=True):
            bridge, intf = self.names[n], self.intf_name(n, p)
            if up:
                peer = self.intf_name(peer_n, peer_p)
                argv += ["--", "--may-exist", "add-port", bridge, intf, "--", "set", "Interface", intf,
                         "type=patch", f"options:peer={peer}", f"ofport_request={p}"]  # fmt: skip
            else:
                argv += ["--", "--if-exists", "del-port", bridge, intf]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise EmulationError(f"patch cable {node}:{port}: {done.stderr.strip()[-300:]}")
        return self.intf_name(node, port)


__all__ = ["ShardedFabric"]
