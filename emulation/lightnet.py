"""A fabric built the fast way, with Mininet's names: batched `ip`, one OVSDB transaction, no shells.

Mininet builds a node at a time: a bash per host and per switch, a dozen shell commands per link, an
`ovs-vsctl` transaction per switch (each one an ovs-vswitchd reconfiguration that grows with the database).
At k=16 (320 switches, 1,024 hosts, 3,072 cables) that is 1,344 shells, ~40,000 commands and minutes of
OVSDB work.  Here the same network — bridges `NAME`, interfaces `NAME-ethN`, hosts in network namespaces
called `NAME` (`/run/netns/NAME`) — is made by:

* one `ip -batch` creating every namespace and veth pair, the host end born inside its namespace with its
  final name and MAC, every veth in an interface group of its own (so teardown deletes them in one call);
* the hosts configured from this process (`emulation.hostconf`: setns and rtnetlink — address,
  `addrgenmode none`, TX checksum offload off — 1 s for 1,024 hosts where a shell each took 25 s);
* one OVSDB transaction for every bridge, port and controller (`emulation.ovsdb`).

Every step can be interrupted (a signal raises in the middle): `remove_by_name` takes away whatever of
these names exists, however far the build got.  Processes in a host run under `ip netns exec`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from emulation import ovsdb
from emulation.hostconf import HostIntf, configure_hosts
from emulation.priority import prioritised

#: Parallel `ip -batch` processes configuring hosts (the machine has 2 cores; ovs-vswitchd takes one).
HOST_CONFIG_PROCESSES = 3


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True, timeout_s: float = 600) -> str:
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=timeout_s
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed ({done.returncode}): {done.stderr.strip()[:500]}")
    return done.stdout


def root_links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"], check=False)
    return [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2]


def namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@dataclass(frozen=True)
class Cable:
    """A veth pair: the root-namespace end (a switch port) and the far end (a switch port, or a host's
    interface inside the host's namespace, with its MAC)."""

    root: str
    far: str
    host: str | None = None
    mac: str | None = None


class LightHost:
    """What callers used of a Mininet host: its namespace, `cmd` and `popen` inside it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.netns = f"/run/netns/{name}"

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def cmd(self, script: str) -> str:
        """Run a shell command line in the host; its output (stdout and stderr), as Mininet's `cmd`."""
        done = subprocess.run(self.argv(["sh", "-c", script]), capture_output=True, text=True, check=False)
        return done.stdout + done.stderr

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.argv(prioritised(argv)), **kwargs)


def host_script(lines: Iterable[str]) -> str:
    """One `ip -batch` line running these shell lines inside a host namespace (`{ns}` is filled in)."""
    body = "; ".join(lines).replace('"', '\\"')
    return f'netns exec {{ns}} sh -ec "{body}"\n'


def run_in_hosts(scripts: dict[str, list[str]], processes: int = HOST_CONFIG_PROCESSES) -> None:
    """Each host's shell lines inside its namespace, spread over a few `ip -batch` processes running at
    once.  Interrupted (a signal raising in this thread), it kills them before re-raising."""
    lines = [host_script(script).replace("{ns}", host) for host, script in scripts.items() if script]
    parts = ["".join(lines[i::processes]) for i in range(processes) if lines[i:]]
    procs: list[subprocess.Popen[str]] = []
    try:
        for part in parts:
            proc = subprocess.Popen(["ip", "-batch", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip
            procs.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(part)
            proc.stdin.close()
        for proc in procs:
            assert proc.stderr is not None
            err = proc.stderr.read()
            if proc.wait() != 0:
                raise RuntimeError(f"ip -batch (in host namespaces) failed: {err.strip()[:500]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def build(
    hosts: Sequence[str],
    cables: Sequence[Cable],
    bridges: Sequence[ovsdb.BridgeSpec],
    group: int,
    host_intfs: Sequence[HostIntf],
    mtu: int = 1500,
    step: Callable[[str], None] = lambda _: None,
) -> None:
    """Namespaces, veths (root ends up, no IPv6), bridges, host configuration, then the bridges'
    controller (`ovsdb.controller_operations`); `step(name)` after each
    phase (timings).  Raises on the first failure; the caller removes what exists (`remove_by_name`).
    Everything runs in the calling thread, so a signal handler raising there stops the build at once
    (`subprocess.run` kills its child on the way out)."""
    dev = f"mtu {mtu} group {group}"
    cmds = [f"netns add {h}\n" for h in hosts]
    for c in cables:
        if c.host is None:
            cmds.append(f"link add {c.root} {dev} type veth peer name {c.far} {dev}\n")
        else:
            mac = f" address {c.mac}" if c.mac else ""
            peer = f"name {c.far} mtu {mtu} netns {c.host}{mac}"
            cmds.append(f"link add {c.root} {dev} type veth peer {peer}\n")
    _run(["ip", "-batch", "-"], "".join(cmds))
    step("links_s")
    ends = [c.root for c in cables] + [c.far for c in cables if c.host is None]
    _run(["ip", "-batch", "-"], "".join(f"link set {n} addrgenmode none\nlink set {n} up\n" for n in ends))
    with ovsdb.Ovsdb() as conn:  # ovs-vswitchd applies it while the hosts are configured
        conn.transact(ovsdb.bridge_operations(bridges, controllers=False))
        step("bridges_committed_s")
        configure_hosts(host_intfs)
        step("hosts_s")
        conn.transact(ovsdb.controller_operations(bridges))  # every cable up: now dial the controller
        conn.wait_applied()
    step("bridges_s")


def remove_by_name(
    bridges: Iterable[str], hosts: Iterable[str], links: Iterable[str], group: int | None = None
) -> None:
    """Remove bridges, namespaces and root-namespace interfaces of exactly these names (and the veths of
    interface `group`, if every one of them is among `links`).  Veths first, in one call: a port whose
    interface is gone costs ovs-vswitchd less to remove.  The bridges go in one OVSDB transaction (their
    ports, interfaces and controllers with them), without waiting for ovs-vswitchd to apply it (it takes
    ~10 ms a port, a minute at k=16, in its own time; nothing of ours is left in the database), then each
    netdev bridge's own tap device, which ovs-vswitchd would leave behind."""
    bridges, hosts, links = set(bridges), set(hosts), set(links)
    present = set(root_links())
    if group is not None:
        grouped = set(_run(["ip", "-o", "link", "show", "group", str(group)], check=False).splitlines())
        names = {line.split(":", 2)[1].strip().split("@")[0] for line in grouped if line.count(":") >= 2}
        if names and names <= links | bridges:
            _run(["ip", "link", "del", "group", str(group)], check=False)
            present = set(root_links())
    with contextlib.suppress(ovsdb.OvsdbError, OSError):
        ovsdb.delete_bridges(bridges, timeout_s=25.0, wait=False)
    present = set(root_links())
    cmds = [f"link del {n}\n" for n in sorted((links | bridges) & present)]
    cmds += [f"netns del {h}\n" for h in sorted(hosts & set(namespaces()))]
    if cmds:
        _run(["ip", "-force", "-batch", "-"], "".join(cmds), check=False)


def netns_of(name: str) -> str:
    return f"/run/netns/{name}"


def exists(name: str) -> bool:
    return os.path.exists(netns_of(name))


__all__ = [
    "Cable",
    "LightHost",
    "build",
    "exists",
    "host_script",
    "namespaces",
    "netns_of",
    "remove_by_name",
    "root_links",
    "run_in_hosts",
]
