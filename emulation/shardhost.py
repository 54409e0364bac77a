"""One machine's part of a fabric spread over several: a Dask actor that builds, holds and tears down its
shards (`emulation.cluster` places them; docs/sharding.md).

A `ShardHost` lives on a Dask worker started with `--resources fabriclab-emu=1` (root, Open vSwitch
installed).  `build` realises the shards the plan gives this machine with `ShardedFabric(local=...)`:
their namespaces and ovs-vswitchd, the hosts cabled to their switches, veths inside the machine and a
VXLAN device per cable to a shard elsewhere, between the two machines' underlay addresses.  A shard's
namespace has no route out, so its bridges dial a unix socket here and `OpenFlowRelay` carries each
connection to the one controller over this machine's network: the controller then sees every switch as
on one machine.  Only control traffic passes the relay; packets never do.

The shards' daemons are children of the worker with a parent-death signal: a worker killed with SIGKILL
takes its switches with it (the controller sees them leave); its namespaces stay until `fabriclab emulate
clean` runs on that machine (the run's record, written here, names them).  The all-pairs check runs where
the hosts are: `mesh_open` opens a raw socket in each local host, `mesh_send` sends the frames of the pairs
whose source is here, `mesh_received` says which pairs arrived here (`emulation.mesh` frames).  So does a
scenario's traffic (`scenario run --dask`): `fleet_*` run one probe fleet with this machine's sides of the
UDP flows, `roce_*` the RoCE rank agents of this machine's hosts; `counters` and `read_drops` read the
headroom and partition counters of this machine's part.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import selectors
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from emulation import fleet, isolation, runfile
from emulation.agents import LocalAgents
from emulation.headroom import Counters, snapshot_of
from emulation.mesh import arrivals, open_sockets, probe_frame
from emulation.sharded import ShardedFabric
from topologies.model import Fabric

#: A part not hearing from its coordinator for this long removes itself (`ShardHost.heartbeat`).
LEASE_S = 10.0
#: How often the coordinator says it is there (`emulation.cluster`).
HEARTBEAT_S = 2.0
#: Bytes read from one side of a relayed OpenFlow connection at a time.
RELAY_CHUNK = 1 << 16


class OpenFlowRelay:
    """Unix sockets whose every connection is carried to `controller` (host, port) over TCP."""

    def __init__(self, paths: list[Path], controller: tuple[str, int]) -> None:
        self.paths, self.controller = paths, controller
        self._servers: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0

    def start(self) -> None:
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(path))
            server.listen(1024)
            self._servers.append(server)
            threading.Thread(target=self._accept, args=(server,), name="of-relay", daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                switch, _ = server.accept()
            except OSError:
                return  # closed by stop()
            try:
                upstream = socket.create_connection(self.controller, timeout=10)
            except OSError:
                switch.close()  # the switch retries, as it would with the controller down
                continue
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open |= {switch, upstream}
                self.connections += 1
            for a, b in ((switch, upstream), (upstream, switch)):
                threading.Thread(target=self._pump, args=(a, b), name="of-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy until either side closes, then close both (the other pump then ends too)."""
        try:
            while data := src.recv(RELAY_CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._open -= {src, dst}

    def stop(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for path in self.paths:
            path.unlink(missing_ok=True)


def _marker() -> str:
    """What this process's command line contains for as long as it runs (`runfile.alive`)."""
    argv = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    return next((a for a in argv if "dask" in a or "distributed" in a), argv[0] if argv else "python")


class ShardHost:
    """The shards of one machine (see the module docstring).  Methods are called by the coordinator
    through Dask's actor proxy, one at a time."""

    def __init__(self) -> None:
        self.net: ShardedFabric | None = None
        self.relay: OpenFlowRelay | None = None
        self.prefix = self.part = ""
        self._mesh: list[socket.socket] = []
        self._mesh_index: list[int] = []
        self._selector: selectors.BaseSelector | None = None
        self._run_id = b""
        self._got: set[tuple[int, int]] = set()
        self._macs: dict[int, int] = {}
        #: When the coordinator was last heard from (any call); `LEASE_S` without: the part removes itself.
        self.heard = time.monotonic()
        self._watch: threading.Event | None = None
        self._fleet: subprocess.Popen[str] | None = None
        self._agents: LocalAgents | None = None
        self._work: Path | None = None

    def build(self, fabric: Fabric, addresses: dict[tuple[str, int], tuple[str, str]], shards: int,
              local: list[int], underlay: dict[int, str], controller: tuple[str, int], prefix: str,
              mtu: int = 1500, cables: str = "auto",
              shaping: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Build this machine's shards; returns timings and what was built.  On failure everything built
        here is removed before the error propagates.  `shaping`: `scale`, `qos`, `buffer_packets`,
        `burst_bytes` as `ShardedFabric` takes them (each machine shapes the cable ends it holds)."""
        if self.net is not None:
            raise RuntimeError("this worker already holds a part of a fabric")
        start = time.perf_counter()
        self.prefix, self.part = prefix, f"w{os.getpid()}"
        net = ShardedFabric(fabric, addresses, shards, "vxlan", cables, local=local, underlay=underlay,
                            name_prefix=prefix, mtu=mtu, **(shaping or {}))  # fmt: skip
        paths = [Path(net.controller_of(i).removeprefix("unix:")) for i in sorted(net.local)]
        self.relay = OpenFlowRelay(paths, controller)
        runfile.write(runfile.RunRecord(prefix, net.node_names, net.group, os.getpid(), None, time.time(),
                                        self.part, _marker()))  # fmt: skip
        self.net = net
        try:
            self.relay.start()
            net.controller = "unix:"  # each shard's bridges dial the relay in its run directory
            net.start()
        except BaseException:
            self.stop()
            raise
        self._watchdog()
        _LIVE.add(self)
        return {"built_s": round(time.perf_counter() - start, 3), "shards": sorted(local),
                "switches": sum(1 for s in fabric.switches if net.plan.shard_of[s.name] in net.local),
                "hosts": len(net.local_hosts()), "timings": dict(net.timings)}  # fmt: skip

    def heartbeat(self) -> bool:
        """The coordinator is still there; False if this part already removed itself."""
        self.heard = time.monotonic()
        return self.net is not None

    def _watchdog(self) -> None:
        """Remove this part once the coordinator has not been heard from for `LEASE_S` and its controller
        (a child of the coordinator that dies with it) does not answer either: a coordinator killed with
        SIGKILL, a network cut — nothing is left behind for long.  At k=16 on two cores a loaded worker
        heard nothing for over 10 s while the coordinator was fine: hence the second opinion."""
        stop = threading.Event()
        self._watch = stop
        self.heard = time.monotonic()

        def watch() -> None:
            while not stop.wait(1.0):
                if time.monotonic() - self.heard > LEASE_S:
                    if self._controller_answers():  # a busy coordinator, not a gone one (the controller
                        self.heard = time.monotonic()  # dies with it): heartbeats can starve under load
                        continue
                    with contextlib.suppress(Exception):
                        self.stop()
                    return

        threading.Thread(target=watch, name="shard-lease", daemon=True).start()

    def _controller_answers(self) -> bool:
        relay = self.relay
        if relay is None:
            return False
        try:
            socket.create_connection(relay.controller, timeout=3).close()
        except OSError:
            return False
        return True

    def set_link(self, node: str, port: int, up: bool) -> str:
        if self.net is None:
            raise RuntimeError("nothing built here")
        return self.net.set_link(node, port, up)

    # --- the all-pairs check, where the hosts are ----------------------------------------------------------

    def mesh_open(self, run_id: bytes, index: dict[str, int], macs: dict[int, int]) -> list[str]:
        """A raw socket in every host here (`index`: host topology name -> its index in the whole check;
        `macs`: every host's MAC by index); returns the hosts opened."""
        if self.net is None:
            raise RuntimeError("nothing built here")
        self.mesh_close()
        endpoints = self.net.endpoints(index)  # topology names
        self._mesh = open_sockets(endpoints)
        self._mesh_index = [index[ep.name] for ep in endpoints]
        self._selector = selectors.DefaultSelector()
        for sock, i in zip(self._mesh, self._mesh_index, strict=True):
            self._selector.register(sock, selectors.EVENT_READ, i)
        self._run_id, self._got, self._macs = run_id, set(), macs
        return [ep.name for ep in endpoints]

    def mesh_send(self, pairs: list[tuple[int, int]], pace_every: int = 256) -> int:
        """Send a frame for each (s, d) whose source is here; returns how many were sent."""
        socks = dict(zip(self._mesh_index, self._mesh, strict=True))
        sent = 0
        self.heard = time.monotonic()  # a long call counts as hearing from the coordinator while it runs
        for k, (s, d) in enumerate(pairs, 1):
            sock = socks.get(s)
            if sock is None:
                continue
            with contextlib.suppress(BlockingIOError):
                sock.send(probe_frame(self._macs[d], self._macs[s], self._run_id, s, d))
                sent += 1
            if k % pace_every == 0:
                self._drain(0.001)  # reading here keeps our own receive buffers from overflowing
                self.heard = time.monotonic()
        return sent

    def _drain(self, timeout_s: float) -> None:
        if self._selector is not None:
            self._got.update(arrivals(self._selector, timeout_s, self._run_id))

    def mesh_received(self, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """Pairs whose frame arrived here since the last call (reading for up to `wait_s` more)."""
        deadline = time.monotonic() + wait_s
        while True:
            self._drain(max(0.0, min(0.05, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
        got, self._got = sorted(self._got), set()
        return got

    def mesh_close(self) -> None:
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for sock in self._mesh:
            sock.close()
        self._mesh, self._mesh_index = [], []

    # --- a scenario's traffic and counters, where the hosts are ------------------------------------------

    def fleet_launch(self, spec: dict[str, Any]) -> int:
        """A probe fleet (`emulation.fleet`) for the sides of `spec`'s flows whose hosts are here (each flow
        names its `src_host` and `dst_host`); returns how many sides that is (0: none, no fleet)."""
        if self.net is None:
            raise RuntimeError("nothing built here")
        self.fleet_stop()
        flows = fleet.place_sides(spec["flows"], self.net.endpoints())
        sides = sum((f["src_netns"] is not None) + (f["dst_netns"] is not None) for f in flows)
        if sides:
            self._fleet = fleet.launch({**spec, "flows": flows})
        return sides

    def fleet_go(self, start_at: float) -> None:
        if self._fleet is not None:
            fleet.go(self._fleet, start_at)

    def fleet_collect(self, timeout_s: float) -> dict[str, Any] | None:
        """The fleet's records (`fleet.collect`: None for a side that is elsewhere), or None if no fleet."""
        proc, self._fleet = self._fleet, None
        self.heard = time.monotonic()
        return fleet.collect(proc, timeout_s) if proc is not None else None

    def fleet_stop(self) -> None:
        proc, self._fleet = self._fleet, None
        if proc is not None:
            fleet.stop(proc)

    def roce_launch(self, plans: dict[str, dict[str, Any]]) -> None:
        """The RoCE rank agents of this machine's hosts in `plans` (`emulation.agents`); their plans and
        logs in a scratch directory here, removed with the part."""
        if self.net is None:
            raise RuntimeError("nothing built here")
        self.roce_stop()
        self._work = Path(tempfile.mkdtemp(prefix="fabriclab-rank-"))
        self._agents = LocalAgents(self.net, self._work)
        self._agents.launch(plans)

    def roce_go(self, start_at: float) -> None:
        if self._agents is not None:
            self._agents.go(start_at)

    def roce_finished(self) -> bool:
        self.heard = time.monotonic()  # polled while the run goes on: the coordinator is there
        return self._agents is None or self._agents.finished()

    def roce_reports(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        self.heard = time.monotonic()
        return self._agents.reports(timeout_s) if self._agents is not None else {}

    def roce_stop(self) -> None:
        agents, self._agents = self._agents, None
        if agents is not None:
            agents.stop()
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def counters(self) -> Counters:
        """The headroom counters of this machine's part (`headroom.snapshot`)."""
        if self.net is None:
            raise RuntimeError("nothing built here")
        return snapshot_of(self.net)

    def read_drops(self) -> isolation.Drops:
        """The partition layer's drop counters on this machine's switches (`isolation.read_drops`)."""
        if self.net is None:
            raise RuntimeError("nothing built here")
        shard_of, local = self.net.plan.shard_of, self.net.local
        ours = [s.name for s in self.net.fabric.switches if shard_of[s.name] in local]
        return isolation.read_drops(self.net, ours)

    # --- teardown -------------------------------------------------------------------------------------------

    def stop(self) -> float:
        """Remove everything built here; returns the seconds it took.  Safe to call twice."""
        start = time.perf_counter()
        _LIVE.discard(self)
        if self._watch is not None:
            self._watch.set()
            self._watch = None
        self.mesh_close()
        self.fleet_stop()
        self.roce_stop()
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        if self.net is not None:
            self.net.stop()
            self.net = None
            runfile.discard(self.prefix, self.part)
        return round(time.perf_counter() - start, 3)


#: The parts this process holds: removed when it exits (a worker ends when it loses its scheduler).
_LIVE: set[ShardHost] = set()


@atexit.register
def _stop_all() -> None:
    for host in list(_LIVE):
        with contextlib.suppress(Exception):
            host.stop()


def run_id() -> bytes:
    return secrets.token_bytes(4)


__all__ = ["OpenFlowRelay", "ShardHost", "run_id"]
