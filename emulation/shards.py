"""Shards: a fabric's switches split over several ovs-vswitchd instances, one network namespace each.

One userspace ovs-vswitchd stops scaling at a k=16 fat-tree: every bridge shares its one `ovs-netdev`
datapath, each reconfiguration walks every port (5,440 ports took 62 s to apply, k=8's 720 took 4 s), and
its main thread polls every port while serving every OpenFlow connection.  A shard is an `ovsdb-server` and
an `ovs-vswitchd` of its own (own database, run directory and sockets) running in a network namespace
`{prefix}x{i}`, holding some of the switches; the team's system OVS is never touched.  Cables inside a
shard are veths; cables between shards are veths between the two namespaces (`crossing="veth"`, one
machine) or VXLAN devices over an underlay network (`crossing="vxlan"`, what two machines need: here the
underlay is a Linux bridge in a namespace `{prefix}xu` standing in for the wire between them).  Either way
the switch port is an ordinary netdev with the topology's name and OpenFlow port number, so the
controller's tables, the shaping and the fault injection need no change.

Every shard's bridges dial the one controller through a veth to the root namespace: the controller listens
on a link-local address held by a dummy interface `{prefix}xc` (see `ControlHub`).  Why our own shards
and not Mininet's cluster edition, MaxiNet or containerlab: docs/sharding.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from emulation.controlproc import _child_setup
from topologies.model import Fabric, Link
from topologies.tiers import Tiers

#: Run directories of shard daemons (database, sockets, pidfiles, logs), one folder per shard.
SHARD_DIR = Path(os.environ.get("FABRICLAB_SHARD_DIR", "/run/fabriclab/shards"))
SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
CROSSINGS = ("veth", "vxlan")
#: What a cable between two switches of one shard is (`emulation.sharded`).
CABLES = ("auto", "patch", "veth")
#: Underlay addresses inside shard namespaces (no other namespace sees them) and the VXLAN port.
UNDERLAY_NET = "10.254.0"
VXLAN_PORT = 4789
#: MTU of the underlay: a VXLAN frame is the cable's frame plus 50 bytes.
UNDERLAY_MTU = 9000


class ShardError(RuntimeError):
    pass


@dataclass(frozen=True)
class ShardPlan:
    """Which shard every node (topology name) lives in."""

    count: int
    shard_of: Mapping[str, int]

    def crossing(self, fabric: Fabric) -> list[Link]:
        """The cables whose two ends are in different shards (tunnels across machines)."""
        return [ln for ln in fabric.links if self.shard_of[ln.a.node] != self.shard_of[ln.b.node]]

    def members(self, shard: int) -> list[str]:
        return sorted(n for n, s in self.shard_of.items() if s == shard)


def plan(fabric: Fabric, count: int) -> ShardPlan:
    """Split a fabric into `count` shards, balanced by switch ports (what a shard's ovs-vswitchd pays
    for).  Switches below the top tier go in groups that are connected without the top tier (a fat-tree's
    pods, a rail fabric's leaves), whole groups to the least loaded shard, largest first; the top tier
    (cores, spines: every group reaches each of them alike) is then spread the same way; a host goes with
    the switch its first port is cabled to.  Deterministic: same fabric, same plan."""
    switches = fabric.switches
    if count < 1:
        raise ValueError(f"{count}: must be at least 1")
    if count > len(switches):
        raise ValueError(f"{count} is more than the fabric's {len(switches)} switches")
    level = Tiers(fabric).level
    top = max((level[s.name] for s in switches), default=1)
    ports = {s.name: 0 for s in switches}
    for ref in fabric.port_map:
        if ref.node in ports:
            ports[ref.node] += 1
    below = [s.name for s in switches if level[s.name] < top]
    parent = {name: name for name in below}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for link in fabric.links:
        a, b = link.a.node, link.b.node
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for name in below:
        groups.setdefault(find(name), []).append(name)
    order = sorted(groups.values(), key=lambda g: (-sum(ports[n] for n in g), min(g)))
    order += [[s.name] for s in switches if level[s.name] >= top]
    load = [0] * count
    shard_of: dict[str, int] = {}
    for group in order:
        target = min(range(count), key=lambda i: (load[i], i))
        for name in group:
            shard_of[name] = target
        load[target] += sum(ports[n] for n in group)
    for host in fabric.hosts:
        peers = [fabric.peer(host.name, p) for p in range(1, host.ports + 1)]
        switch = next((p.node for p in peers if p is not None), None)
        shard_of[host.name] = shard_of[switch] if switch is not None else 0
    return ShardPlan(count, shard_of)


def uses_patch(cables: str, shaped: bool) -> bool:
    """Whether cables between two switches of one shard are OVS patch ports (`emulation.sharded`):
    `patch`, or `auto` on unshaped links; a ValueError names what is wrong (an unknown kind, or patch ports
    asked for on shaped links — HTB needs a device)."""
    if cables not in CABLES:
        raise ValueError(f"{cables!r}: expected one of {', '.join(CABLES)}")
    if cables == "patch" and shaped:
        raise ValueError("patch ports cannot be shaped (HTB needs a device): drop the scale, or use veth")
    return cables == "patch" or (cables == "auto" and not shaped)


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True, timeout_s: float = 120) -> str:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False,
                          timeout=timeout_s)  # fmt: skip
    if check and done.returncode != 0:
        raise ShardError(f"{' '.join(argv[:4])} failed ({done.returncode}): {done.stderr.strip()[:400]}")
    return done.stdout


def ip_batch(lines: Sequence[str], netns: str | None = None, force: bool = False) -> None:
    """`ip -batch` of these lines, in namespace `netns` if given."""
    if not lines:
        return
    argv = ["ip", *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    _run(argv, "".join(line.rstrip("\n") + "\n" for line in lines), check=not force)


#: ovs-vswitchd's period for writing interface statistics into OVSDB (its default is 5,000 ms).
STATS_UPDATE_INTERVAL_MS = 60_000


class ShardDaemons:
    """The `ovsdb-server` and `ovs-vswitchd` of one shard.  Both are children of this process in process
    groups of their own with a parent-death signal (as the controller is), so a run killed with SIGKILL
    takes its switches with it; `ovs-vswitchd` runs inside the shard's namespace (its datapath's tap devices
    are created there), `ovsdb-server` needs no network and runs here."""

    def __init__(self, netns: str, run_dir: Path | None = None) -> None:
        self.netns = netns
        self.dir = run_dir or SHARD_DIR / netns
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def db(self) -> str:
        return str(self.dir / "db.sock")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.dir / f"{name}.out").open("ab")
        with log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OVS_RUNDIR": str(self.dir)},
                preexec_fn=partial(_child_setup, os.getpid()),  # noqa: PLW1509
            )  # fmt: skip

    def start(self, timeout_s: float = 30.0) -> None:
        """Create the database and start both daemons; returns once ovsdb-server answers (ovs-vswitchd
        shows it is up by applying the first configuration: see `wait_applied`)."""
        if not SCHEMA.exists():
            raise ShardError(f"{SCHEMA} not found (Debian: openvswitch-common)")
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "conf.db"
        conf.unlink(missing_ok=True)
        _run(["ovsdb-tool", "create", str(conf), str(SCHEMA)])
        d = self.dir
        self._spawn("ovsdb-server", [
            "ovsdb-server", str(conf), f"--remote=punix:{self.db}", f"--pidfile={d}/ovsdb-server.pid",
            f"--unixctl={d}/ovsdb-server.ctl", f"--log-file={d}/ovsdb-server.log", "-vconsole:off",
        ])  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not self._db_answers():
            self.check()
            if time.monotonic() > deadline:
                raise ShardError(f"shard {self.netns}: ovsdb-server not answering after {timeout_s:g} s")
            time.sleep(0.02)
        # Interface statistics into OVSDB once a minute, not every 5 s: at 640 ports a shard that costs
        # ovs-vswitchd a netlink read per port and a large transaction each time (0.08 of a core for the
        # eight shards of a k=16 fabric at rest).  Nothing here reads them; OpenFlow port stats are live.
        _run(
            [
                "ovs-vsctl",
                f"--db=unix:{self.db}",
                "--no-wait",
                "init",
                "--",
                "set",
                "Open_vSwitch",
                ".",
                f"other_config:stats-update-interval={STATS_UPDATE_INTERVAL_MS}",
            ]
        )
        self._spawn("ovs-vswitchd", [
            "ip", "netns", "exec", self.netns, "ovs-vswitchd", f"unix:{self.db}",
            f"--pidfile={d}/ovs-vswitchd.pid", f"--unixctl={d}/ovs-vswitchd.ctl",
            f"--log-file={d}/ovs-vswitchd.log", "-vconsole:off",
        ])  # fmt: skip

    def _db_answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(self.db)
            except OSError:
                return False
        return True

    def check(self) -> None:
        """Raise if a daemon has exited, with the end of its log."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = self.dir / f"{name}.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                raise ShardError(f"shard {self.netns}: {name} exited ({proc.returncode}): {' '.join(tail)}")

    @property
    def vswitchd_pid(self) -> int | None:
        proc = self.procs.get("ovs-vswitchd")
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill(self) -> None:
        """SIGKILL both, without waiting: an ovs-vswitchd exiting closes a packet socket per port, each
        close waiting for an RCU grace period, so shards are best killed all at once, then waited for."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.kill()

    def stop(self) -> None:
        """SIGKILL both (nothing of theirs outlives the namespace and the run directory, which go next;
        a clean ovs-vswitchd exit would first take every port down, one by one)."""
        self.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def kill_leftover_daemons(netns: str) -> list[int]:
    """A dead run's shard daemons (their parent-death signal should have ended them): SIGKILL the PIDs in
    the shard's pidfiles whose command line names its run directory, then remove the directory."""
    folder = SHARD_DIR / netns
    killed = []
    for pidfile in sorted(folder.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            if str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    shutil.rmtree(folder, ignore_errors=True)
    return killed


@dataclass(frozen=True)
class ControlHub:
    """How shard namespaces reach the controller: a management network.  A Linux bridge `name` in this
    namespace holds 169.254.`octet`.1/24 (the controller listens there); each shard has a veth `ctl` with
    169.254.`octet`.(2 + i), its other end `{shard}r` a port of the bridge."""

    name: str
    octet: int

    @property
    def controller_ip(self) -> str:
        return f"169.254.{self.octet}.1"

    def shard_ip(self, index: int) -> str:
        return f"169.254.{self.octet}.{2 + index}"

    def up(self) -> None:
        ip_batch([
            f"link add {self.name} type bridge", f"link set {self.name} addrgenmode none",
            f"addr add {self.controller_ip}/24 dev {self.name}", f"link set {self.name} up",
        ])  # fmt: skip

    def root_lines(self, shards: Sequence[str]) -> list[str]:
        lines = []
        for ns in shards:
            lines += [
                f"link add {ns}r type veth peer name ctl netns {ns}", f"link set {ns}r addrgenmode none",
                f"link set {ns}r master {self.name}", f"link set {ns}r up",
            ]  # fmt: skip
        return lines

    def shard_lines(self, index: int) -> list[str]:
        return [f"addr add {self.shard_ip(index)}/24 dev ctl", "link set ctl up"]


def free_control_octet() -> int:
    """A 169.254.X.0/24 nobody in this namespace uses (concurrent sharded runs each take one)."""
    used = _run(["ip", "-4", "-o", "addr", "show"], check=False) + _run(
        ["ip", "-4", "route", "show"], check=False
    )
    for octet in range(64, 192):
        if f"169.254.{octet}." not in used:
            return octet
    raise ShardError("no free 169.254.X.0/24 for the shards' control network (64..191 all in use)")


def underlay_ip(index: int) -> str:
    return f"{UNDERLAY_NET}.{1 + index}"


def underlay_lines(underlay_ns: str, shards: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The wire between "machines": (root-batch lines, per-namespace lines) for a Linux bridge in
    `underlay_ns` with one veth to every shard, the shard's end `{shard}u` holding its underlay address."""
    root = [f"netns add {underlay_ns}"]
    per_ns: dict[str, list[str]] = {underlay_ns: [
        "link set lo up", f"link add name wire mtu {UNDERLAY_MTU} type bridge", "link set wire up",
    ]}  # fmt: skip
    for i, ns in enumerate(shards):
        root.append(f"link add {ns}u netns {ns} mtu {UNDERLAY_MTU} type veth peer name s{i} "
                    f"netns {underlay_ns} mtu {UNDERLAY_MTU}")  # fmt: skip
        per_ns[underlay_ns] += [f"link set s{i} master wire", f"link set s{i} up"]
        per_ns.setdefault(ns, []).extend([f"addr add {underlay_ip(i)}/24 dev {ns}u", f"link set {ns}u up"])
    return root, per_ns


def vxlan_line(intf: str, vni: int, local: int, remote: int, underlay_dev: str, mtu: int) -> str:
    """A VXLAN device standing for one end of a cable between shards `local` and `remote`."""
    return (f"link add {intf} mtu {mtu} type vxlan id {vni} local {underlay_ip(local)} "
            f"remote {underlay_ip(remote)} dstport {VXLAN_PORT} dev {underlay_dev} nolearning")  # fmt: skip


__all__ = [
    "CABLES",
    "CROSSINGS",
    "SHARD_DIR",
    "STATS_UPDATE_INTERVAL_MS",
    "ControlHub",
    "ShardDaemons",
    "ShardError",
    "ShardPlan",
    "free_control_octet",
    "ip_batch",
    "kill_leftover_daemons",
    "plan",
    "underlay_ip",
    "underlay_lines",
    "uses_patch",
    "vxlan_line",
]
