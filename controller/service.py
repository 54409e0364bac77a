"""The controller service: the decision core on one worker thread, its commands executed, its state published.

All decisions are in `controller.core` (pure).  This module only carries: inputs from the southbound, the
operator and two timers go into one queue; one worker thread hands them to the core in arrival order and
executes the commands the core returns (read a switch, push a rollout, probe links, save state), feeding
their outcomes back to the core; after every step it publishes the new immutable state, which REST and
metrics read without locks and without ever waiting for a computation.

Port-status, flow-removed and LLDP inputs that arrive together are handed over as one event (one
recomputation for both ends of a cut cable or all ports of a dead switch, one read-back of a wiped switch)
without reordering anything else.

Port counters are polled every `stats_interval_s`, or every policy interval while the policy is
``adaptive``; under adaptive routing each sample also goes to the core (`CountersSampled`), which decides
moves.  At most one sample waits in the queue: a worker busy with a large recomputation skips samples
rather than queueing stale ones (control stays bounded and off the forwarding path).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from controller.core import adaptive
from controller.core.arp import arp_answer
from controller.core.events import (
    CountersSampled,
    Event,
    FlowRemoval,
    FlowsRemoved,
    LinkSighting,
    LinksSeen,
    Log,
    LogLevel,
    OperatorRequest,
    PartitionEditRequested,
    PartitionsRequested,
    PolicyRequested,
    PortChange,
    PortsChanged,
    ProbeLinks,
    Push,
    PushDone,
    QosPolicyRequested,
    ReadSwitch,
    Reply,
    RoutingRequested,
    Save,
    Saved,
    Start,
    SwitchConnected,
    SwitchDisconnected,
    SwitchesConnected,
    SwitchRead,
    SwitchReadFailed,
    Tick,
)
from controller.core.fabric import FabricCore, Step
from controller.core.state import Config, FabricState
from controller.executor import Executor
from controller.formats.qosfile import QosFileError, policy_from_data
from controller.heap import Heap
from controller.published import PortCounters, PortStats, Published
from controller.sm.intents import FlowIntent, FlowKey, ForwardingOptions, GroupIntent, SwitchDelta
from controller.sm.manager import SubnetContext
from controller.sm.partitions import PartitionError, Partitions
from controller.sm.pkey_edits import PartitionEdit
from controller.sm.policies import PolicyChoice, PolicyError
from controller.sm.qos import QosPolicy
from controller.statestore import SavedState, StateError, StateStore
from topologies.model import Fabric

LOG = logging.getLogger("fabriclab.controller")
_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR}
#: Operator requests waiting for the worker beyond this are refused (503): nothing queues without bound.
MAX_PENDING_REQUESTS = 4


class Snapshot(Protocol):
    ports: dict[int, bool]
    flows: list[FlowIntent]
    groups: list[GroupIntent]


class Southbound(Protocol):
    def connected(self) -> set[int]: ...
    def read_switch(self, dpid: int, timeout_s: float = ...) -> Snapshot: ...
    def push(
        self, deltas: Mapping[int, SwitchDelta], phase: str, timeout_s: float = ...
    ) -> dict[int, str]: ...
    def probe_links(self, dpids: Iterable[int]) -> int: ...
    def port_stats(self, timeout_s: float = ...) -> dict[tuple[int, int], dict[str, int]]: ...
    def slot_stats(self, timeout_s: float = ...) -> dict[tuple[int, FlowKey], int]: ...


class Busy(RuntimeError):
    """The worker has too much queued; try again later (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Stopping(Busy):
    """The controller is shutting down: the change was not made (HTTP 503)."""


@dataclass
class _Request:
    event: OperatorRequest
    future: Future[Any] = field(default_factory=Future)
    started: bool = False
    cancelled: bool = False


_STOP = object()
#: Inputs that arrive in bursts and are handed to the core as one event each burst.
_BATCHED: dict[type, Callable[[tuple[Any, ...]], Event]] = {
    PortChange: PortsChanged,
    LinkSighting: LinksSeen,
    FlowRemoval: FlowsRemoved,
    SwitchConnected: lambda batch: SwitchesConnected(tuple(e.dpid for e in batch)),
}


class FabricService:
    def __init__(
        self,
        core: FabricCore,
        state: FabricState,
        store: StateStore | None = None,
        lldp_interval_s: float = 10.0,
        stats_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        heap: Heap | None = None,
    ) -> None:
        self.core = core
        #: The garbage collector's policy (`controller.heap`), installed by the composition root.
        self._heap = heap
        self.context = core.context
        self.store = store
        self.lldp_interval_s = lldp_interval_s
        self.stats_interval_s = stats_interval_s
        self.clock = clock
        self.southbound: Southbound | None = None
        self._state = state
        self._started_at = clock()
        self._published = Published(self.context, state, None, self._started_at, self._started_at)
        self._publish_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._held: Any = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._requests: dict[int, _Request] = {}
        self._requests_lock = threading.Lock()
        self._next_request = 1
        #: A counter sample is queued and not yet handled (at most one waits).
        self._sample_queued = threading.Event()
        #: Held while the state is saved; `_closed` (set by `stop`) refuses saves after it.
        self._saving = threading.Lock()
        self._closed = False
        self._executor = Executor(core, _ServiceEffects(self), clock, batch_reads=True,
                                  on_step=self._on_step, on_error=self._on_error)  # fmt: skip

    @classmethod
    def for_fabric(
        cls,
        fabric: Fabric,
        store: StateStore | None = None,
        config: Callable[[Config], Config] | None = None,
        lldp_interval_s: float = 10.0,
        link_scale: float = 1.0,
        **kwargs: Any,
    ) -> FabricService:
        """A service for `fabric`: saved choices from `store` (if any), then `config(saved) -> chosen` (the
        command line's overrides).  Raises StateError, GenerationExhausted, UnknownEngine or PolicyError
        up front.  `link_scale`: see `FabricCore`."""
        core = FabricCore(SubnetContext.build(fabric), lldp_ttl_s=3 * lldp_interval_s, link_scale=link_scale)
        saved = store.load() if store is not None else None
        try:
            state = core.initial_state(saved)
            if saved is not None and saved.qos is not None:
                assert store is not None
                state = _with_saved_qos(state, saved, store, fabric)
        except PolicyError as exc:
            assert store is not None  # defaults are valid: only a saved policy can be bad
            raise StateError(f"{store.path}: {exc}") from None
        except PartitionError as exc:  # saved members this topology does not have
            assert store is not None
            raise StateError(f"{store.path}: partitions: {exc.message}") from None
        if config is not None:
            state = core.initial_state(saved, config(state.config))
        return cls(core, state, store, lldp_interval_s=lldp_interval_s, **kwargs)

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self, southbound: Southbound) -> None:
        """Compute the first generation (before any switch can connect), then start the threads."""
        self.southbound = southbound
        self._run(Start())
        for target, name in (
            (self._work, "fabric-worker"),
            (self._lldp_loop, "fabric-lldp"),
            (self._stats_loop, "fabric-stats"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def sync(self, timeout_s: float = 30.0) -> None:
        """Wait until everything queued before this call has been handled (tests, benchmarks)."""
        marker: Future[None] = Future()
        self._queue.put(marker)
        marker.result(timeout_s)

    def stop(self, timeout_s: float = 3.0) -> None:
        """Stop within `timeout_s` whatever the worker is doing (a k=16 recompute takes seconds).

        Operators still queued are answered at once (`Stopping`: not made); the change under way gets
        what is left of the time to finish (then its answer is the real one); then saving is closed, so
        a save is either whole on disk or never started.  The worker is a daemon thread: it may still
        be computing when the process exits, but it can no longer save."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._queue.put(_STOP)
        self._fail_requests(started=False, why="the controller is stopping: this change was not made")
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._saving:  # a save under way finishes; none starts after this
            self._closed = True
        self._fail_requests(
            started=True,
            why="the controller stopped during this change: it was kept only if the state shows it after "
            "the restart",
        )

    def _fail_requests(self, started: bool, why: str) -> None:
        with self._requests_lock:
            chosen = [r for r in self._requests.values() if r.started == started]
            for request in chosen:
                self._requests.pop(request.event.request, None)
        for request in chosen:
            if not request.future.done():
                request.future.set_exception(Stopping(why, retry_after_s=10))

    # --- reads (any thread, never wait) ------------------------------------------------------------------

    def snapshot(self) -> Published:
        return self._published

    def _publish(self, state: FabricState | None = None, stats: PortStats | None = None) -> None:
        with self._publish_lock:
            old = self._published
            self._published = Published(
                self.context,
                state if state is not None else old.state,
                stats if stats is not None else old.stats,
                self._started_at,
                self.clock(),
                old.stats if stats is not None else old.previous_stats,
            )

    # --- inputs from the southbound (os-ken's thread; must return at once) -------------------------------

    def switch_connected(self, dpid: int, now: float) -> None:
        self._queue.put(SwitchConnected(dpid))

    def switch_disconnected(self, dpid: int, now: float) -> None:
        self._queue.put(SwitchDisconnected(dpid))

    def port_status(self, dpid: int, port: int, live: bool | None, now: float) -> None:
        if live is not None:
            self._queue.put(PortChange(dpid, port, live, now))

    def flow_removed(self, dpid: int, flow: FlowIntent, reason: str, now: float) -> None:
        self._queue.put(FlowRemoval(dpid, flow, reason, now))

    def link_seen(self, src_dpid: int, src_port: int, dst_dpid: int, dst_port: int, now: float) -> None:
        self._queue.put(LinkSighting(src_dpid, src_port, dst_dpid, dst_port, now))

    def arp_request(self, dpid: int, in_port: int, arp: Any, now: float) -> int | None:
        """Answered at once (`controller.core.arp`, from the published state); the sighting: to the core."""
        answer = arp_answer(self.context, self._published.state.config.partitions, dpid, in_port,
                            arp.sender_ip, arp.sender_mac, arp.target_ip, now)  # fmt: skip
        if answer.seen is not None:
            self._queue.put(answer.seen)
        return answer.reply_mac

    # --- operator requests -------------------------------------------------------------------------------

    def waiting_requests(self) -> int:
        """Operator requests queued and not yet started by the worker."""
        with self._requests_lock:
            return sum(1 for r in self._requests.values() if not r.started)

    def set_routing(
        self, engine: str | None, options: ForwardingOptions | None, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        """Change engine/options and reprogram the switches.  Raises the core's error for bad input,
        `StateNotSaved` when the choice could not be persisted, `Busy` when the worker is backed up."""
        return self._ask(lambda request: RoutingRequested(request, engine, options), timeout_s)

    def set_policy(self, choice: PolicyChoice, timeout_s: float = 60.0) -> dict[str, Any]:
        """Change the routing policy and reprogram the switches (same errors as `set_routing`)."""
        return self._ask(lambda request: PolicyRequested(request, choice), timeout_s)

    def set_partitions(self, partitions: Partitions, change: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Replace the partitions (validated whole by the caller) and reprogram the edge switches,
        make-before-break; persisted first (same errors as `set_routing`)."""
        return self._ask(lambda request: PartitionsRequested(request, partitions, change), timeout_s)

    def edit_partitions(self, edit: PartitionEdit, timeout_s: float = 60.0) -> dict[str, Any]:
        """One P_Key edit, decided by the core against the partitions running when the worker reaches it
        (`controller.sm.pkey_edits`: `EditError` says why not), then as `set_partitions`."""
        return self._ask(lambda request: PartitionEditRequested(request, edit), timeout_s)

    def set_qos(self, policy: QosPolicy, source: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Replace the QoS policy (validated whole by the caller): persisted first, one generation, one
        event (same errors as `set_routing`)."""
        return self._ask(lambda request: QosPolicyRequested(request, policy, source), timeout_s)

    def _ask(self, make: Callable[[int], OperatorRequest], timeout_s: float) -> dict[str, Any]:
        with self._requests_lock:
            waiting = sum(1 for r in self._requests.values() if not r.started)  # (the lock is not reentrant)
            if waiting >= MAX_PENDING_REQUESTS:
                raise Busy(f"{waiting} routing changes are already waiting; try again shortly")
            request = _Request(make(self._next_request))
            self._requests[request.event.request] = request
            self._next_request += 1
        self._queue.put(request.event)
        try:
            result: dict[str, Any] = request.future.result(timeout_s)
            return result
        except TimeoutError:
            with self._requests_lock:
                if not request.started:
                    request.cancelled = True
                    self._requests.pop(request.event.request, None)
                    raise Busy(
                        f"the controller is busy: request not started within {timeout_s:g} s"
                    ) from None
            done: dict[str, Any] = request.future.result()  # started: computations and pushes are bounded
            return done

    # --- the worker --------------------------------------------------------------------------------------

    def _next_event(self) -> Any:
        if self._held is not None:
            item, self._held = self._held, None
            return item
        return self._queue.get()

    def _coalesce(self, first: Any) -> Any:
        """Consecutive port changes (or LLDP sightings) become one event; anything else stays in order."""
        kind = type(first)
        if kind not in _BATCHED:
            return first
        batch = [first]
        while True:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if type(nxt) is not kind:
                self._held = nxt
                break
            batch.append(nxt)
        return _BATCHED[kind](tuple(batch))

    def _work(self) -> None:
        while True:
            item = self._next_event()
            if item is _STOP or self._stop.is_set():
                return
            if isinstance(item, Future):  # a sync() marker
                item.set_result(None)
                continue
            event = self._coalesce(item)
            if isinstance(event, CountersSampled):
                self._sample_queued.clear()
            if isinstance(event, OperatorRequest):
                with self._requests_lock:
                    request = self._requests.get(event.request)
                    if request is None or request.cancelled:
                        continue
                    request.started = True
            if self._heap is None:
                self._run(event)
                continue
            # a reroute: fewer young collections, and its objects frozen before they are walked
            with self._heap.hurried() if isinstance(event, PortsChanged) else contextlib.nullcontext():
                self._run(event)
                self._heap.settled()

    def _run(self, event: Event) -> None:
        """Hand `event` to the core, execute its commands, and feed their outcomes back until done
        (`controller.executor`); a core that raises keeps its old state and tells a waiting caller."""
        self._state = self._executor.run(self._state, event)

    def _on_step(self, step: Step) -> None:
        self._state = step.state
        self._publish(state=step.state)
        for record in step.records:
            LOG.info("event %s", record.as_dict())

    def _on_error(self, event: Event, exc: Exception) -> None:
        if isinstance(event, OperatorRequest):
            self._reply(Reply(event.request, error=exc))

    def _reply(self, reply: Reply) -> None:
        with self._requests_lock:
            request = self._requests.pop(reply.request, None)
        if request is None or request.future.done():
            return
        if reply.error is not None:
            request.future.set_exception(reply.error)
        else:
            request.future.set_result(reply.result)

    # --- timers ------------------------------------------------------------------------------------------

    def _lldp_loop(self) -> None:
        while not self._stop.wait(self.lldp_interval_s):
            self._queue.put(Tick())

    def poll_interval_s(self) -> float:
        """How often counters are polled now (the core's rule, `controller.core.adaptive.poll_interval_s`)."""
        return adaptive.poll_interval_s(self._published.state.config, self.stats_interval_s)

    def _stats_loop(self) -> None:
        names = self.context.switch_of_dpid
        next_at = time.monotonic()
        while True:
            interval = self.poll_interval_s()
            next_at = max(next_at + interval, time.monotonic())  # a fixed cadence; never catch up in bursts
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                return
            sb = self.southbound
            if sb is None:
                continue
            wanted = adaptive.sample_wanted(self._published.state.config)
            timeout = max(0.5, min(2.0, interval))
            try:
                raw = sb.port_stats(timeout_s=timeout)
                slots = sb.slot_stats(timeout_s=timeout) if wanted else {}
                at = self.clock()
            except Exception:
                LOG.exception("polling port counters failed")
                continue
            counters = {
                (names[dpid], port): PortCounters(**{f: int(c.get(f, 0)) for f in _COUNTER_FIELDS})
                for (dpid, port), c in raw.items()
                if dpid in names
            }
            self._publish(stats=PortStats(at, counters))
            if wanted and not self._sample_queued.is_set():
                self._sample_queued.set()
                tx = {key: int(c.get("tx_bytes", 0)) for key, c in raw.items()}
                self._queue.put(CountersSampled(at, tx, slots))


class _ServiceEffects:
    """What the core's commands do in the running controller: the southbound, the state store, the log,
    the callers waiting on a request (`controller.executor.Effects`)."""

    def __init__(self, service: FabricService) -> None:
        self.service = service

    def _sb(self) -> Southbound:
        sb = self.service.southbound
        assert sb is not None, "service not started"
        return sb

    def read(self, command: ReadSwitch) -> Event:
        try:
            snap = self._sb().read_switch(command.dpid)
        except Exception as exc:  # gone, timed out: the core decides what next
            return SwitchReadFailed(command.dpid, f"{type(exc).__name__}: {exc}")
        return SwitchRead(command.dpid, dict(snap.ports), tuple(snap.flows), tuple(snap.groups))

    def push(self, command: Push) -> Event:
        """One phase, as the core asked it (which phase, which switches, how long they get)."""
        clock = self.service.clock
        started = clock()
        problems = self._sb().push(command.deltas, command.phase, command.timeout_s) if command.deltas else {}
        return PushDone(command.rollout, command.phase, problems, started, clock())

    def probe(self, command: ProbeLinks) -> None:
        self._sb().probe_links(command.dpids)

    def save(self, command: Save) -> Saved:
        service = self.service
        if service.store is None:
            return Saved()
        with service._saving:
            if service._closed:
                return Saved(error="StateError: the controller is stopping")
            try:
                service.store.save(command.state)
            except Exception as exc:
                return Saved(error=f"{type(exc).__name__}: {exc}")
        return Saved()

    def log(self, command: Log) -> None:
        LOG.log(_LEVELS[command.level], "%s", command.message)

    def reply(self, command: Reply) -> None:
        self.service._reply(command)

    def drain(self) -> list[Event]:
        return []  # LLDP answers arrive on the southbound's thread, through the queue


_COUNTER_FIELDS = tuple(PortCounters.__dataclass_fields__)


def _with_saved_qos(state: FabricState, saved: SavedState, store: StateStore, fabric: Fabric) -> FabricState:
    """The saved QoS policy, held to the policy file's rules against the fabric running now: `StateError`
    naming the file and the field."""
    legacy = store.qos_path != store.path  # a qos.json of older controllers: its field is "policy"
    where = "policy" if legacy else "qos"
    try:
        policy = policy_from_data(saved.qos, f"{store.qos_path}: {where}", fabric)
    except QosFileError as exc:
        field = f"{where}.{exc.field}" if exc.field else where
        raise StateError(f"{store.qos_path}: {field}: {exc.message}") from None
    config = replace(state.config, qos=policy, qos_source=saved.qos_source or "saved")
    return replace(state, config=config)


__all__ = ["Busy", "FabricService", "PortCounters", "PortStats", "Published", "Southbound"]
