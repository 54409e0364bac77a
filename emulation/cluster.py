"""A sharded fabric placed on Dask workers, run and torn down from one process (`emulate up --dask`).

The plan is `emulation.shards.plan`'s (deterministic; pods whole, balanced by switch ports).  Placement:
the workers that advertise the resource `fabriclab-emu`, sorted by address, take shard i on worker
i mod W — so shards spread over machines before two share one, and the same cluster gets the same
placement.  Each worker holds a `ShardHost` actor (`emulation.shardhost`) that builds its shards, with VXLAN
cables between the workers' underlay addresses (the address each worker registered with: `dask worker
--host UNDERLAY_IP`), and relays its bridges' OpenFlow connections to the controller, which listens here
on an address the workers reach (`--openflow-advertise`; by default the one this machine uses to reach
the scheduler).

`ClusterFabric` stands where `run_up` holds a `MininetFabric`: `prepare_control` (where the controller
listens), `start`, `set_link`/`set_switch`, `check_all_pairs`, `check` (a lost worker or scheduler is an
`EmulationError` naming it) and `stop`, which tears every reachable part down, whatever happened.  While
it runs it sends every part a heartbeat; a part that stops hearing them removes itself (`ShardHost`), and
a worker that loses its scheduler ends and removes its part on the way out.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from emulation.headroom import Counters
from emulation.mnfabric import EmulationError
from emulation.sharded import ShardedFabric
from emulation.shardhost import HEARTBEAT_S, LEASE_S, ShardHost, run_id
from emulation.shards import ShardPlan, plan
from topologies.model import Fabric

#: The Dask worker resource an emulation host advertises (`dask worker --resources fabriclab-emu=1`).
EMU_RESOURCE = "fabriclab-emu"
#: Pairs one worker sends per call of the all-pairs check (then every worker reports what arrived).
MESH_CHUNK = 16384
#: How long one actor call may take before the worker counts as unresponsive.
CALL_TIMEOUT_S = 120.0


def emulation_workers(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(worker address, underlay host) of every worker with the `fabriclab-emu` resource, sorted."""
    workers = info.get("workers", {})
    return sorted(
        (address, str(w.get("host") or urlparse(address).hostname))
        for address, w in workers.items()
        if float((w.get("resources") or {}).get(EMU_RESOURCE, 0)) >= 1
    )


def place(shard_plan: ShardPlan, workers: list[str]) -> dict[int, str]:
    """Shard i on worker i mod W (see the module docstring)."""
    if not workers:
        raise EmulationError(
            f"no Dask worker offers the resource {EMU_RESOURCE} (start one: dask worker ... "
            f"--resources {EMU_RESOURCE}=1)"
        )
    return {i: workers[i % len(workers)] for i in range(shard_plan.count)}


def source_address(host: str, port: int) -> str:
    """The address this machine sends from to reach `host` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        address: str = probe.getsockname()[0]
        return address


class ClusterFabric:
    """A fabric's shards on Dask workers (see the module docstring)."""

    shells = False
    qos = None
    group = 0

    def __init__(self, fabric: Fabric, addresses: Mapping[tuple[str, int], tuple[str, str]], shards: int,
                 scheduler: str, advertise: str | None = None, name_prefix: str = "", mtu: int = 1500,
                 cables: str = "auto", connect_timeout_s: float = 10.0, **shaping: Any) -> None:  # fmt: skip
        """`shaping`: `scale`, `qos`, `buffer_packets`, `burst_bytes` (`ShardedFabric`'s), for every part."""
        try:
            self.plan = plan(fabric, shards)
        except ValueError as exc:
            raise EmulationError(f"shards: {exc}") from None
        self.fabric, self.addresses = fabric, dict(addresses)
        self.shaping = {k: v for k, v in shaping.items() if v is not None}
        # the names every part will use, checked here (a prefix too long for k=16 fails before any build),
        # and what the coordinator asks of them (a cable's interfaces)
        nowhere = dict.fromkeys(range(shards), "192.0.2.1")
        self.names = ShardedFabric(fabric, self.addresses, shards, "vxlan", cables, local=[], mtu=mtu,
                                   name_prefix=name_prefix, underlay=nowhere, **self.shaping)  # fmt: skip
        self.scheduler, self.advertise = scheduler, advertise
        self.prefix, self.mtu, self.cables = name_prefix, mtu, cables
        self.connect_timeout_s = connect_timeout_s
        self.controller = ""
        self.client: Any = None
        self.placement: dict[int, str] = {}
        self.underlay: dict[int, str] = {}
        self.actors: dict[str, Any] = {}
        self.built: dict[str, dict[str, Any]] = {}
        self.lost: str | None = None
        self.timings: dict[str, float] = {}
        self._beating: threading.Event | None = None

    # --- what run_up asks of a fabric -----------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        return []  # nothing on this machine: each worker records its own part

    def switch_daemons(self) -> list[Any]:
        return []

    def prepare_control(self) -> str:
        """Connect to the scheduler, place the shards, and return the address the controller must listen
        on (the advertised one)."""
        from distributed import Client  # noqa: PLC0415  (Dask only when asked for)

        try:
            self.client = Client(  # type: ignore[no-untyped-call]
                self.scheduler,
                timeout=self.connect_timeout_s,  # default client: actor proxies find it
            )
        except Exception as exc:  # refused, timed out, or something else answering there
            raise EmulationError(
                f"--dask {self.scheduler}: no Dask scheduler answered: {type(exc).__name__}: {exc}"[:300]
            ) from None
        workers = emulation_workers(self.client.scheduler_info(n_workers=-1))
        hosts = dict(workers)
        self.placement = place(self.plan, [address for address, _ in workers])
        self.underlay = {i: hosts[w] for i, w in self.placement.items()}
        if self.advertise is None:
            url = urlparse(self.scheduler if "://" in self.scheduler else f"tcp://{self.scheduler}")
            self.advertise = source_address(url.hostname or "127.0.0.1", url.port or 8786)
        return self.advertise

    def start(self) -> None:
        """An actor on every worker the placement uses, every part built in parallel; on any failure all
        parts are removed and an `EmulationError` names the worker."""
        proto, host, port = self.controller.split(":")
        if proto != "tcp" or self.client is None:
            raise EmulationError("a cluster fabric needs prepare_control() and a tcp:HOST:PORT controller")
        start = time.perf_counter()
        used = sorted(set(self.placement.values()))
        try:
            for worker in used:
                future = self.client.submit(ShardHost, actor=True, workers=[worker],
                                            resources={EMU_RESOURCE: 1}, pure=False)  # fmt: skip
                self.actors[worker] = future.result(timeout=CALL_TIMEOUT_S)
            self.timings["actors_s"] = time.perf_counter() - start
            pending = {}
            for worker, actor in self.actors.items():
                local = sorted(i for i, w in self.placement.items() if w == worker)
                pending[worker] = actor.build(self.fabric, self.addresses, self.plan.count, local,
                                              self.underlay, (host, int(port)), self.prefix, self.mtu,
                                              self.cables, self.shaping)  # fmt: skip
            for worker, future in pending.items():
                try:
                    self.built[worker] = future.result(timeout=CALL_TIMEOUT_S * 5)
                except Exception as exc:
                    raise EmulationError(f"worker {worker}: building its shards failed: {exc}") from None
        except BaseException:
            self.stop()
            raise
        self._heartbeats()
        self.timings["mininet_build_s"] = self.timings["mininet_start_s"] = time.perf_counter() - start

    def _heartbeats(self) -> None:
        """Tell every part, every `HEARTBEAT_S`, that this coordinator is still there: a part that stops
        hearing it (this process killed, the scheduler or the network gone) removes itself after
        `LEASE_S` (`ShardHost.heartbeat`)."""
        stop = threading.Event()
        self._beating = stop

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                for actor in list(self.actors.values()):
                    with contextlib.suppress(Exception):
                        actor.heartbeat()  # not waited for: a slow worker must not hold up the others

        threading.Thread(target=beat, name="cluster-heartbeat", daemon=True).start()

    def describe(self) -> str:
        parts = []
        for worker in sorted(self.built):
            b = self.built[worker]
            parts.append(f"{worker}: shards {b['shards']}, {b['switches']} switches, {b['hosts']} hosts")
        return f"cluster: {len(self.built)} workers ({'; '.join(parts)}); controller at {self.controller}"

    def owner(self, node: str) -> str:
        return self.placement[self.plan.shard_of[node]]

    def set_link(self, node: str, port: int, up: bool) -> str:
        """Cut or restore a cable: each machine holding a switch end sets its end (a tunnel has no
        carrier, so both ends of a crossing cable go down, as a cut fibre is seen)."""
        peer = self.fabric.peer(node, port)
        if peer is None:
            raise KeyError(f"{node}:{port} is not cabled")
        ends = [(n, p) for n, p in ((node, port), (peer.node, peer.port)) if self.fabric.nodes[n].is_switch]
        owners = {self.owner(n): (n, p) for n, p in ends}
        gone = sorted(w for w in owners if w not in self.actors)
        if gone:
            raise EmulationError(f"{node}:{port}: worker {gone[0]} is gone (cannot set its end)")
        calls = [self.actors[w].set_link(n, p, up) for w, (n, p) in owners.items()]
        done = self._wait_all(calls, f"setting {node}:{port} {'up' if up else 'down'}")
        return ", ".join(str(d) for d in done)

    def set_switch(self, name: str, up: bool) -> list[str]:
        if not self.fabric.nodes[name].is_switch:
            raise KeyError(f"{name} is not a switch")
        ports = sorted(ref.port for ref in self.fabric.port_map if ref.node == name)
        return [self.set_link(name, port, up) for port in ports]

    def check_all_pairs(self, rounds: int = 4, wait_s: float = 1.0) -> dict[tuple[str, str], bool]:
        """Every host a frame to every other, sent and received where the hosts are; missing pairs sent
        again for up to `rounds` more rounds."""
        hosts = sorted(h.name for h in self.fabric.hosts)
        index = {h: i for i, h in enumerate(hosts)}
        from controller.sm.addressing import parse_mac  # noqa: PLC0415

        macs: dict[int, int] = {}
        for (host, _), (mac, _) in self.addresses.items():
            macs.setdefault(index[host], parse_mac(mac))
        rid = run_id()
        owner = {h: self.owner(h) for h in hosts}
        calls = [actor.mesh_open(rid, {h: index[h] for h in hosts if owner[h] == w}, macs)
                 for w, actor in self.actors.items()]  # fmt: skip
        self._wait_all(calls, "opening its hosts' sockets for the all-pairs check")
        n = len(hosts)
        missing = {(s, d) for s in range(n) for d in range(n) if s != d}
        try:
            for round_no in range(rounds + 1):
                by_worker: dict[str, list[tuple[int, int]]] = {}
                for s, d in sorted(missing, key=lambda p: ((p[1] - p[0]) % n, p[0])):
                    by_worker.setdefault(owner[hosts[s]], []).append((s, d))
                # every worker sends a chunk at a time, together, and says what arrived before the next:
                # a self-clocked check (a k=16 round sent whole overflowed receivers and ran for minutes)
                longest = max((len(p) for p in by_worker.values()), default=0)
                for at in range(0, longest, MESH_CHUNK):
                    sends = [self.actors[w].mesh_send(pairs[at : at + MESH_CHUNK])
                             for w, pairs in by_worker.items() if at < len(pairs)]  # fmt: skip
                    self._wait_all(sends, "sending the all-pairs check's frames")
                    missing -= self._arrived(0.0)
                missing -= self._arrived(wait_s * min(2**round_no, 4))
                if not missing:
                    break
        finally:
            for f in [actor.mesh_close() for actor in self.actors.values()]:
                with contextlib.suppress(Exception):
                    f.result(timeout=CALL_TIMEOUT_S)
        return {(hosts[s], hosts[d]): (s, d) not in missing for s in range(n) for d in range(n) if s != d}

    def _arrived(self, wait_s: float) -> set[tuple[int, int]]:
        got = [actor.mesh_received(wait_s) for actor in self.actors.values()]
        got_all = self._wait_all(got, "reading the all-pairs check's arrivals")
        return {(int(p[0]), int(p[1])) for pairs in got_all for p in pairs}

    def _wait_all(self, futures: list[Any], what: str, timeout_s: float = CALL_TIMEOUT_S) -> list[Any]:
        """Each actor call's result; a failure or a timeout is an `EmulationError` saying what failed."""
        try:
            return [f.result(timeout=timeout_s) for f in futures]
        except Exception as exc:
            raise EmulationError(f"a worker failed {what}: {type(exc).__name__}: {exc}") from None

    # --- a scenario's traffic and counters (`emulation.runner`) ------------------------------------------

    def cable_interfaces(self, node: str, port: int) -> list[str]:
        return self.names.cable_interfaces(node, port)

    def intf_name(self, node: str, port: int) -> str:
        return self.names.intf_name(node, port)

    def rank_agents(self, work: Path) -> ClusterAgents:
        """The RoCE rank agents, each on the machine holding its host (`emulation.agents`)."""
        return ClusterAgents(self)

    @contextlib.contextmanager
    def fleet(self, spec: dict[str, Any]) -> Iterator[ClusterFleet | None]:
        """A probe fleet on every machine holding a host of `spec`'s flows (each flow names `src_host`
        and `dst_host`: its sender runs where its source is, its receiver where its destination is);
        stopped on the way out whatever happened.  None if there are no flows."""
        if not spec.get("flows"):
            yield None
            return
        workers = list(self.actors)
        try:
            sides = self._wait_all([self.actors[w].fleet_launch(spec) for w in workers],
                                   "starting its probe fleet")  # fmt: skip
            yield ClusterFleet(self, [w for w, n in zip(workers, sides, strict=True) if n],
                               len(spec["flows"]))  # fmt: skip
        finally:
            for future in [self.actors[w].fleet_stop() for w in workers if w in self.actors]:
                with contextlib.suppress(Exception):
                    future.result(timeout=30)

    def counters(self) -> Counters:
        """Every machine's headroom counters, merged (interface and host names are the run's: disjoint)."""
        merged = Counters()
        for part in self._wait_all([a.counters() for a in self.actors.values()], "reading its counters"):
            for name in vars(merged):
                getattr(merged, name).update(getattr(part, name))
        return merged

    def read_drops(self) -> dict[tuple[str, int, str], int]:
        """The partition layer's drop counters on every machine's switches (`isolation.read_drops`)."""
        merged: dict[tuple[str, int, str], int] = {}
        for part in self._wait_all([a.read_drops() for a in self.actors.values()], "reading drop counters"):
            merged.update(part)
        return merged

    def check(self) -> None:
        """Raise `EmulationError` naming what is gone: the scheduler, or a worker and its shards."""
        if self.lost is not None:
            raise EmulationError(self.lost)
        if self.client.status != "running":  # it lost the scheduler and is reconnecting, or gave up
            self.lost = (f"the Dask scheduler {self.scheduler} is gone: each worker removes its part once it "
                         f"stops hearing from this run (within {LEASE_S:g} s)")  # fmt: skip
            raise EmulationError(self.lost)
        try:
            present = {a for a, _ in emulation_workers(self.client.scheduler_info(n_workers=-1))}
        except Exception as exc:  # whatever the client raises, the scheduler is gone
            self.lost = f"the Dask scheduler {self.scheduler} is gone ({type(exc).__name__}): tearing down"
            raise EmulationError(self.lost) from None
        for worker in sorted(self.actors):
            if worker not in present:
                shards = sorted(i for i, w in self.placement.items() if w == worker)
                self.lost = (f"worker {worker} is gone, and with it shards {shards} (their switches left the "
                             f"controller): tearing the rest down")  # fmt: skip
                self.actors.pop(worker)
                raise EmulationError(self.lost)

    def stop(self) -> None:
        """Every part still reachable torn down (each worker in parallel), then the client closed."""
        if self._beating is not None:
            self._beating.set()
        if self.client is None:
            return
        stops = {}
        for worker, actor in self.actors.items():
            with contextlib.suppress(Exception):
                stops[worker] = actor.stop()
        patience = 60 if self.client.status == "running" else 5  # without a scheduler: the lease does it
        for future in stops.values():
            with contextlib.suppress(Exception):
                future.result(timeout=patience)
        self.actors.clear()
        client, self.client = self.client, None
        with contextlib.suppress(Exception):
            client.close(timeout=10)


class ClusterFleet:
    """The probe fleets of a scenario's flows on the machines that hold their hosts (`ClusterFabric.fleet`):
    told when to start together, their records merged into one per flow."""

    def __init__(self, cluster: ClusterFabric, workers: list[str], flows: int) -> None:
        self.cluster, self.workers, self.flows = cluster, workers, flows

    def go(self, start_at: float) -> None:
        actors = self.cluster.actors
        self.cluster._wait_all([actors[w].fleet_go(start_at) for w in self.workers], "starting its flows")

    def collect(self, timeout_s: float) -> dict[str, Any]:
        """{"senders": [...], "receivers": [...]} in the order of the flows, each from the machine holding
        that side; RuntimeError if a side is missing."""
        actors = self.cluster.actors
        calls = [actors[w].fleet_collect(timeout_s) for w in self.workers]
        parts = self.cluster._wait_all(calls, "collecting its flows' records", timeout_s + CALL_TIMEOUT_S)
        merged: dict[str, list[Any]] = {"senders": [None] * self.flows, "receivers": [None] * self.flows}
        for part in parts:
            for side, records in merged.items():
                for i, record in enumerate(part[side]):
                    if record is not None:
                        records[i] = record
        for side, records in merged.items():
            absent = [i for i, r in enumerate(records) if r is None]
            if absent:
                raise RuntimeError(f"no machine reported the {side[:-1]} of flows {absent[:10]}")
        return merged


class ClusterAgents:
    """The RoCE rank agents of a run across machines: each machine's `ShardHost` runs those of its hosts;
    the calls of `emulation.agents.AgentSet` go to every machine that has some."""

    def __init__(self, cluster: ClusterFabric) -> None:
        self.cluster = cluster
        self.hosts: dict[str, list[str]] = {}  # worker -> its hosts with an agent

    def __len__(self) -> int:
        return sum(len(h) for h in self.hosts.values())

    def _call(self, method: str, what: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> list[Any]:
        actors = self.cluster.actors
        calls = [getattr(actors[w], method)(*args) for w in self.hosts]
        return self.cluster._wait_all(calls, what, timeout_s)

    def launch(self, plans: dict[str, dict[str, Any]]) -> None:
        by_worker: dict[str, dict[str, dict[str, Any]]] = {}
        for host, agent_plan in plans.items():
            by_worker.setdefault(self.cluster.owner(host), {})[host] = agent_plan
        self.hosts = {w: sorted(p) for w, p in sorted(by_worker.items())}
        calls = [self.cluster.actors[w].roce_launch(by_worker[w]) for w in self.hosts]
        self.cluster._wait_all(calls, "starting its RoCE agents")

    def go(self, start_at: float) -> None:
        self._call("roce_go", "starting its RoCE agents' traffic", start_at)

    def finished(self) -> bool:
        return bool(self.hosts) and all(self._call("roce_finished", "polling its RoCE agents"))

    def reports(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {}
        for part in self._call("roce_reports", "reading its RoCE agents' reports", timeout_s,
                               timeout_s=timeout_s + CALL_TIMEOUT_S):  # fmt: skip
            merged.update(part)
        return merged

    def stop(self) -> None:
        for w in list(self.hosts):
            actor = self.cluster.actors.get(w)
            if actor is not None:
                with contextlib.suppress(Exception):
                    actor.roce_stop().result(timeout=30)


__all__ = [
    "EMU_RESOURCE",
    "ClusterAgents",
    "ClusterFabric",
    "ClusterFleet",
    "emulation_workers",
    "place",
    "source_address",
]
