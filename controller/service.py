"""The controller service: the subnet manager behind one worker thread, with events, timings and state.

Everything that changes the fabric's programming — a switch (re)connecting, a port going down or up, an
operator changing the routing — is a task on one worker thread, so the subnet manager stays single-
threaded and updates never interleave.  Port events that arrive together (both ends of a cut cable, all
ports of a dead switch) are drained and handled with one recomputation.  Reads (REST) take a snapshot
under a lock and never wait for the worker.

The southbound (the os-ken app in production, fakes in tests) is reached through the `Southbound` protocol,
so this module and the REST layer above it never import os-ken.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.sm.intents import ForwardingOptions, SwitchDelta, SwitchProgram, applied, diff, rollout
from controller.sm.manager import Computation, SubnetManager, UnknownSwitch
from controller.state import SavedState, StateStore
from topologies.model import PortRef

LOG = logging.getLogger("fabriclab.controller")


class Snapshot(Protocol):
    ports: dict[int, bool]
    flows: list[Any]
    groups: list[Any]


class Southbound(Protocol):
    def connected(self) -> set[int]: ...
    def read_switch(self, dpid: int, timeout_s: float = ...) -> Snapshot: ...
    def push(
        self, deltas: Mapping[int, SwitchDelta], phase: str, timeout_s: float = ...
    ) -> dict[int, str]: ...
    def probe_links(self, dpids: Iterable[int]) -> int: ...
    def port_stats(self, timeout_s: float = ...) -> dict[tuple[int, int], dict[str, int]]: ...


@dataclass
class _Task:
    kind: str
    args: tuple[Any, ...]
    future: Future[Any] = field(default_factory=Future)


def _ms(start: float, end: float) -> float:
    return round((end - start) * 1000.0, 2)


class FabricService:
    def __init__(
        self,
        manager: SubnetManager,
        store: StateStore | None = None,
        lldp_interval_s: float = 10.0,
        max_events: int = 1000,
    ) -> None:
        self.manager = manager
        self.store = store
        self.lldp_interval_s = lldp_interval_s
        self.southbound: Southbound | None = None
        self.installed: dict[str, SwitchProgram | None] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._event_id = 0
        self.started_at = time.time()
        self.lock = threading.RLock()
        self._queue: queue.Queue[_Task | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.unknown_switches: set[int] = set()
        self.failed_updates = 0
        self._persisted = -1
        self._warned: set[tuple[PortRef, PortRef]] = set()

    # --- lifecycle ---------------------------------------------------------------------------------------

    @classmethod
    def restore(cls, manager: SubnetManager, store: StateStore | None, **kwargs: Any) -> FabricService:
        """Apply saved operator choices (engine, options, generation) before the first computation."""
        saved = store.load() if store is not None else None
        if saved is not None:
            manager.registry.create(saved.engine)
            manager.engine = saved.engine
            manager.options = ForwardingOptions(saved.fast_failover, saved.multipath)
            manager.generation = saved.generation
        return cls(manager, store, **kwargs)

    def start(self, southbound: Southbound) -> None:
        self.southbound = southbound
        with self.lock:
            computation = self.manager.recompute()
            self._record("routing_computed", generation=computation.generation, engine=computation.engine)
            self._persist()
        for target, name in ((self._work, "fabric-worker"), (self._lldp_loop, "fabric-lldp")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _persist(self) -> None:
        if self.store is None:
            return
        m = self.manager
        self._persisted = m.generation
        self.store.save(SavedState(m.engine, m.options.fast_failover, m.options.multipath, m.generation))

    # --- inputs from the southbound (any thread; must return quickly) ------------------------------------

    def switch_connected(self, dpid: int, now: float) -> None:
        self._queue.put(_Task("connect", (dpid, now)))

    def switch_disconnected(self, dpid: int, now: float) -> None:
        self._queue.put(_Task("disconnect", (dpid, now)))

    def port_status(self, dpid: int, port: int, live: bool | None, now: float) -> None:
        if live is not None:
            self._queue.put(_Task("port", (dpid, port, live, now)))

    def link_seen(self, src_dpid: int, src_port: int, dst_dpid: int, dst_port: int, now: float) -> None:
        names = self.manager.switch_of_dpid
        if src_dpid in names and dst_dpid in names:
            src, dst = PortRef(names[src_dpid], src_port), PortRef(names[dst_dpid], dst_port)
            with self.lock:
                self.manager.discovery.link_seen(src, dst, now)
                declared = self.manager.declared.peer(src.node, src.port)
                if declared != dst and (src, dst) not in self._warned:
                    self._warned.add((src, dst))
                    LOG.warning("cabling: %s sees %s, declared peer is %s", src, dst, declared or "nothing")

    def arp_request(self, dpid: int, in_port: int, arp: Any, now: float) -> int | None:
        """Answer from the address table; note where the asker was seen (validation of host cabling)."""
        addresses = self.manager.addresses
        asker = addresses.by_ipv4.get(arp.sender_ip)
        switch = self.manager.switch_of_dpid.get(dpid)
        if asker is not None and switch is not None and asker.mac == arp.sender_mac:
            with self.lock:
                self.manager.discovery.host_seen(asker.host, asker.port, PortRef(switch, in_port), now)
        target = addresses.by_ipv4.get(arp.target_ip)
        return target.mac if target is not None else None

    # --- operator requests (REST) ------------------------------------------------------------------------

    def set_routing(
        self, engine: str | None, options: ForwardingOptions | None, dry_run: bool, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        task = _Task("routing", (engine, options, dry_run, time.time()))
        self._queue.put(task)
        result: dict[str, Any] = task.future.result(timeout_s)
        return result

    def call(self, func: Callable[[], Any], timeout_s: float = 60.0) -> Any:
        task = _Task("call", (func,))
        self._queue.put(task)
        return task.future.result(timeout_s)

    # --- the worker --------------------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            task = self._queue.get()
            if task is None:
                return
            batch = [task]
            if task.kind == "port":
                while True:  # coalesce a burst of port events into one recomputation
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None or nxt.kind != "port":
                        self._queue.put(nxt)  # keep order loosely: non-port tasks run after this burst
                        break
                    batch.append(nxt)
            try:
                result = self._dispatch(batch)
                for t in batch:
                    t.future.set_result(result)
            except Exception as exc:
                LOG.exception("task %s failed", task.kind)
                for t in batch:
                    t.future.set_exception(exc)

    def _dispatch(self, batch: list[_Task]) -> Any:
        task = batch[0]
        if task.kind == "connect":
            return self._on_connect(*task.args)
        if task.kind == "disconnect":
            return self._on_disconnect(*task.args)
        if task.kind == "port":
            return self._on_ports([t.args for t in batch])
        if task.kind == "routing":
            return self._on_routing(*task.args)
        if task.kind == "call":
            return task.args[0]()
        raise ValueError(task.kind)

    def _sb(self) -> Southbound:
        assert self.southbound is not None, "service not started"
        return self.southbound

    def _on_connect(self, dpid: int, now: float) -> None:
        try:
            name = self.manager.switch_name(dpid)
        except UnknownSwitch as exc:
            if dpid not in self.unknown_switches:
                self.unknown_switches.add(dpid)
                LOG.warning("%s; leaving it alone", exc)
                self._record("unknown_switch", dpid=f"{dpid:016x}")
            return
        snapshot = self._sb().read_switch(dpid)
        with self.lock:
            self.manager.discovery.switch_connected(name, now)
            declared_ports = [ref.port for ref in self.manager.declared.port_map if ref.node == name]
            changed = [
                p
                for p in declared_ports
                if self.manager.set_port_state(name, p, snapshot.ports.get(p, False), now)
            ]
            self.installed[name] = SwitchProgram.of(name, dpid, snapshot.flows, snapshot.groups)
            computation = self.manager.recompute() if changed else self.manager.require_current()
        read_at = time.time()
        targets = None if changed else [name]
        event = self._rollout(computation, "switch_connect", now, read_at, only=targets, switch=name)
        event["ports_down"] = sorted(p for p, up in snapshot.ports.items() if not up)
        self._sb().probe_links([dpid, *self._neighbour_dpids(name)])

    def _neighbour_dpids(self, switch: str) -> list[int]:
        declared = self.manager.declared
        result = set()
        for ref, (_, far) in declared.port_map.items():
            if ref.node == switch and far.node in self.manager.dpids:
                result.add(self.manager.dpids[far.node])
        return sorted(result)

    def _on_disconnect(self, dpid: int, now: float) -> None:
        name = self.manager.switch_of_dpid.get(dpid)
        if name is None:
            return
        with self.lock:
            self.installed.pop(name, None)
            self.manager.discovery.switch_disconnected(name)
        self._record("switch_disconnect", switch=name, detected_at=now)

    def _on_ports(self, reports: list[tuple[Any, ...]]) -> None:
        changes: list[str] = []
        detected = min(r[3] for r in reports)
        with self.lock:
            for dpid, port, live, now in reports:
                name = self.manager.switch_of_dpid.get(dpid)
                if name is None:
                    continue
                if self.manager.set_port_state(name, port, live, now):
                    changes.append(f"{name}:{port} {'up' if live else 'down'}")
            if not changes:
                return
            computation = self.manager.recompute()
        kind = "port_up" if all(c.endswith("up") for c in changes) else "port_down"
        self._rollout(computation, kind, detected, time.time(), ports=changes)

    def _on_routing(
        self, engine: str | None, options: ForwardingOptions | None, dry_run: bool, now: float
    ) -> dict[str, Any]:
        with self.lock:
            computation = self.manager.compute(engine, options)  # raises before any change on bad input
            if dry_run:
                deltas = rollout(self.installed, computation.programs)
                return {
                    "dry_run": True,
                    "engine": computation.engine,
                    "verification_ok": computation.verification.ok,
                    "switches_changed": len(deltas),
                    "flow_mods": sum(d.n_messages for d in deltas.values()),
                }
            self.manager.commit(computation)
            self._persist()
        return self._rollout(computation, "routing_change", now, time.time(), engine=computation.engine)

    def _rollout(
        self,
        computation: Computation,
        kind: str,
        detected_at: float,
        computed_at: float,
        only: list[str] | None = None,
        **details: Any,
    ) -> dict[str, Any]:
        """Push `computation` to connected switches: all adds, barrier, then all deletes, barrier."""
        with self.lock:
            if self.store is not None and computation.generation != self._persisted:
                self._persist()  # cookies about to carry this generation: never reuse it after a restart
            installed = {n: p for n, p in self.installed.items() if only is None or n in only}
            deltas = rollout(installed, computation.programs)
        by_dpid = {d.dpid: d for d in deltas.values()}
        sb = self._sb()
        problems = sb.push(by_dpid, "make")
        made = time.time()  # every new path is in place: what traffic needs
        problems.update(sb.push({k: v for k, v in by_dpid.items() if k not in problems}, "break"))
        done = time.time()  # entries nothing uses any more are gone too
        with self.lock:
            for name, delta in deltas.items():
                if delta.dpid in problems:
                    self.installed.pop(name, None)  # unknown contents: re-read on reconnect or next update
                elif name in self.installed:
                    self.installed[name] = applied(self.installed[name], delta)
        if problems:
            self.failed_updates += 1
            LOG.error("update of %d switch(es) failed: %s; re-reading them", len(problems), problems)
            for dpid in set(problems) & sb.connected():
                self._queue.put(_Task("connect", (dpid, done)))
        return self._record(
            kind,
            generation=computation.generation,
            detected_at=detected_at,
            computed_ms=_ms(detected_at, computed_at),
            installed_ms=_ms(detected_at, made),
            cleaned_ms=_ms(detected_at, done),
            switches_updated=len(deltas),
            flow_mods=sum(d.n_messages for d in deltas.values()),
            failed_switches={f"{k:016x}": v for k, v in problems.items()},
            verification_ok=computation.verification.ok,
            lost_hosts=list(computation.lost_hosts),
            **details,
        )

    def _record(self, kind: str, **fields: Any) -> dict[str, Any]:
        with self.lock:
            self._event_id += 1
            event = {"id": self._event_id, "kind": kind, "at": round(time.time(), 6), **fields}
            self.events.append(event)
        LOG.info("event %s", {k: v for k, v in event.items() if v not in (None, [], {})})
        return event

    # --- periodic discovery ------------------------------------------------------------------------------

    def _lldp_loop(self) -> None:
        last: tuple[str, ...] = ()
        while not self._stop.wait(self.lldp_interval_s):
            try:
                with self.lock:
                    self.manager.discovery.expire(time.time(), ttl_s=3 * self.lldp_interval_s)
                self._sb().probe_links(sorted(self._sb().connected()))
                report = self.validation()
                problems = tuple(
                    [
                        f"{e['link']} {e['status']}"
                        for e in report["links"]
                        if e["status"] in ("missing", "miswired")
                    ]
                    + [f"{u} unexpected" for u in report["unexpected"]]
                )
                if problems != last:  # log changes, not the same findings every round
                    if problems:
                        LOG.warning("cabling: %d problem(s): %s", len(problems), "; ".join(problems[:10]))
                    elif last:
                        LOG.info("cabling: all declared links seen as declared")
                    last = problems
            except Exception:
                LOG.exception("LLDP round failed")

    # --- reads -------------------------------------------------------------------------------------------

    def connected_switches(self) -> set[str]:
        names = self.manager.switch_of_dpid
        return {names[d] for d in self._sb().connected() if d in names} if self.southbound else set()

    def in_sync(self) -> bool:
        """Every connected switch holds exactly the current generation's program."""
        with self.lock:
            current = self.manager.current
            if current is None:
                return False
            for name in self.connected_switches():
                have = self.installed.get(name)
                want = current.programs.get(name)
                if have is None or (want is not None and not diff(have, want).empty):
                    return False
            return True

    def validation(self) -> dict[str, Any]:
        with self.lock:
            return self.manager.discovery.report(self.manager.ports_down, time.time())

    def recent_events(self, since: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["id"] > since][-limit:]


__all__ = ["FabricService", "Southbound"]
