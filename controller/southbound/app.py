"""The os-ken application: OpenFlow connections in, switch events out, intents pushed with barriers.

The only os-ken app of fabriclab.  It keeps no routing state: handlers run on os-ken's event-loop thread,
do constant work (decode, look up, hand over) and never wait, because replies they would wait for arrive on
that same thread.  Everything that waits (reading a switch back, barrier-confirmed pushes, port counters)
runs on the caller's thread — the service's worker or a REST request — against per-(datapath, xid)
waiters that the reply handlers complete.

Datapaths are tracked per datapath id, and a DEAD event counts only for the connection that is current
for that id: a switch that reconnects quickly can deliver the old connection's death after the new
connection's arrival.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from os_ken import cfg
from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_3

from controller.sm.intents import SLOT_TABLE, FlowIntent, FlowKey, GroupIntent, SwitchDelta
from controller.southbound import compat, openflow, packets

LOG = logging.getLogger("fabriclab.openflow")
_MORE = ofproto_v1_3.OFPMPF_REPLY_MORE


class SwitchGone(RuntimeError):
    pass


class SwitchError(RuntimeError):
    pass


@dataclass
class SwitchSnapshot:
    """What a switch holds and which of its ports have link, read back on (re)connect."""

    ports: dict[int, bool]
    flows: list[FlowIntent]
    groups: list[GroupIntent]


class Listener(Protocol):
    """What the app reports to (the service); every call must return quickly."""

    def switch_connected(self, dpid: int, now: float) -> None: ...
    def switch_disconnected(self, dpid: int, now: float) -> None: ...
    def port_status(self, dpid: int, port: int, live: bool | None, now: float) -> None: ...
    def link_seen(self, src_dpid: int, src_port: int, dst_dpid: int, dst_port: int, now: float) -> None: ...
    def arp_request(self, dpid: int, in_port: int, arp: packets.Arp, now: float) -> int | None: ...
    def flow_removed(self, dpid: int, flow: FlowIntent, reason: str, now: float) -> None: ...


@dataclass
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    bodies: list[Any] = field(default_factory=list)
    gone: bool = False


class FabricApp(app_manager.OSKenApp):  # type: ignore[misc]
    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, listener: Listener, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listener = listener
        self._lock = threading.Lock()
        self._dps: dict[int, Any] = {}
        self._ports: dict[int, set[int]] = {}
        self._waiters: dict[tuple[int, int], _Waiter] = {}
        self._errors: dict[int, list[tuple[int, int, int]]] = {}
        self.handler_errors = 0

    # --- connection tracking -----------------------------------------------------------------------------

    def _guard(self, what: str, func: Callable[[], None]) -> None:
        """Handlers never raise into os-ken: log, count, carry on."""
        try:
            func()
        except Exception:
            self.handler_errors += 1
            LOG.exception("error while handling %s", what)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])  # type: ignore[untyped-decorator]
    def _state_change(self, ev: Any) -> None:
        dp, now = ev.datapath, time.time()
        if dp.id is None:
            return
        if ev.state == MAIN_DISPATCHER:
            with self._lock:
                old = self._dps.get(dp.id)
                self._dps[dp.id] = dp
                self._ports.setdefault(dp.id, set())
            if old is not None and old is not dp:
                self._fail_waiters(old)
            LOG.info("switch %016x connected from %s", dp.id, dp.address)
            self._guard("connect", lambda: self.listener.switch_connected(dp.id, now))
        elif ev.state == DEAD_DISPATCHER:
            with self._lock:
                current = self._dps.get(dp.id) is dp
                if current:
                    del self._dps[dp.id]
            self._fail_waiters(dp)
            if current:
                LOG.info("switch %016x disconnected", dp.id)
                self._guard("disconnect", lambda: self.listener.switch_disconnected(dp.id, now))

    def _fail_waiters(self, dp: Any) -> None:
        with self._lock:
            keys = [k for k in self._waiters if k[0] == id(dp)]
            waiters = [self._waiters.pop(k) for k in keys]
        for waiter in waiters:
            waiter.gone = True
            waiter.done.set()

    def connected(self) -> set[int]:
        with self._lock:
            return set(self._dps)

    def _dp(self, dpid: int) -> Any:
        with self._lock:
            dp = self._dps.get(dpid)
        if dp is None:
            raise SwitchGone(f"switch {dpid:016x} is not connected")
        return dp

    # --- replies -----------------------------------------------------------------------------------------

    def _complete(self, msg: Any, body: Any = None, more: bool = False) -> None:
        with self._lock:
            waiter = self._waiters.get((id(msg.datapath), msg.xid))
            if waiter is not None and not more:
                del self._waiters[(id(msg.datapath), msg.xid)]
        if waiter is None:
            return
        if body is not None:
            waiter.bodies.extend(body if isinstance(body, list) else [body])
        if not more:
            waiter.done.set()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)  # type: ignore[untyped-decorator]
    def _barrier_reply(self, ev: Any) -> None:
        self._complete(ev.msg)

    @set_ev_cls(  # type: ignore[untyped-decorator]
        [
            ofp_event.EventOFPFlowStatsReply,
            ofp_event.EventOFPGroupDescStatsReply,
            ofp_event.EventOFPPortDescStatsReply,
            ofp_event.EventOFPPortStatsReply,
        ],
        MAIN_DISPATCHER,
    )
    def _multipart_reply(self, ev: Any) -> None:
        self._complete(ev.msg, ev.msg.body, more=bool(ev.msg.flags & _MORE))

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])  # type: ignore[untyped-decorator]
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        dpid = msg.datapath.id
        LOG.warning(
            "switch %s error type=%d code=%d xid=%d", dpid and f"{dpid:016x}", msg.type, msg.code, msg.xid
        )
        if dpid is not None:
            with self._lock:
                self._errors.setdefault(dpid, []).append((msg.xid, msg.type, msg.code))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)  # type: ignore[untyped-decorator]
    def _port_status(self, ev: Any) -> None:
        msg, now = ev.msg, time.time()
        dpid, port = msg.datapath.id, msg.desc
        if not openflow.is_physical(port.port_no):
            return
        deleted = msg.reason == msg.datapath.ofproto.OFPPR_DELETE
        with self._lock:
            ports = self._ports.setdefault(dpid, set())
            (ports.discard if deleted else ports.add)(port.port_no)
        live = False if deleted else openflow.port_is_live(port)
        self._guard("port status", lambda: self.listener.port_status(dpid, port.port_no, live, now))

    @set_ev_cls(ofp_event.EventOFPFlowRemoved, MAIN_DISPATCHER)  # type: ignore[untyped-decorator]
    def _flow_removed(self, ev: Any) -> None:
        msg, now = ev.msg, time.time()
        dpid = msg.datapath.id
        self._guard(
            "flow removed",
            lambda: self.listener.flow_removed(
                dpid, openflow.flow_removed(msg), openflow.removed_reason(msg), now
            ),
        )

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)  # type: ignore[untyped-decorator]
    def _packet_in(self, ev: Any) -> None:
        self._guard("packet-in", lambda: self._handle_packet(ev.msg))

    def _handle_packet(self, msg: Any) -> None:
        dp, data, now = msg.datapath, bytes(msg.data), time.time()
        in_port = msg.match["in_port"]
        probe = packets.parse_lldp(data)
        if probe is not None:
            self.listener.link_seen(probe.dpid, probe.port, dp.id, in_port, now)
            return
        arp = packets.parse_arp(data)
        if arp is not None and arp.is_request:
            mac = self.listener.arp_request(dp.id, in_port, arp, now)
            if mac is not None:
                dp.send_msg(openflow.packet_out(dp, in_port, packets.arp_reply(arp, mac)))

    # --- calls from other threads ------------------------------------------------------------------------

    def _send_request(self, dpid: int, build: Callable[[Any], Any]) -> tuple[Any, Any, _Waiter]:
        dp = self._dp(dpid)
        message = build(dp)
        dp.set_xid(message)
        waiter = _Waiter()
        with self._lock:
            self._waiters[(id(dp), message.xid)] = waiter
        dp.send_msg(message)
        return dp, message, waiter

    def _await(self, dpid: int, sent: tuple[Any, Any, _Waiter], timeout_s: float) -> list[Any]:
        dp, message, waiter = sent
        if not waiter.done.wait(timeout_s):
            with self._lock:
                self._waiters.pop((id(dp), message.xid), None)
            raise SwitchError(f"switch {dpid:016x}: no reply to {type(message).__name__} in {timeout_s} s")
        if waiter.gone:
            raise SwitchGone(f"switch {dpid:016x} disconnected while waiting")
        return waiter.bodies

    def _request(self, dpid: int, build: Callable[[Any], Any], timeout_s: float) -> list[Any]:
        return self._await(dpid, self._send_request(dpid, build), timeout_s)

    def read_switch(self, dpid: int, timeout_s: float = 10.0) -> SwitchSnapshot:
        port_desc = self._request(dpid, openflow.port_desc_request, timeout_s)
        ports = {p.port_no: openflow.port_is_live(p) for p in port_desc if openflow.is_physical(p.port_no)}
        with self._lock:
            self._ports[dpid] = set(ports)
        flows = [
            openflow.flow_from_stats(s) for s in self._request(dpid, openflow.flow_stats_request, timeout_s)
        ]
        groups = [
            openflow.group_from_desc(s) for s in self._request(dpid, openflow.group_desc_request, timeout_s)
        ]
        return SwitchSnapshot(ports, flows, groups)

    def push(self, deltas: Mapping[int, SwitchDelta], phase: str, timeout_s: float = 10.0) -> dict[int, str]:
        """Send one phase ("make" or "break") of every delta, each switch's batch followed by a barrier, and
        wait for all barriers.  Returns dpid -> problem for switches that failed (error, gone, timeout)."""
        build = openflow.make_messages if phase == "make" else openflow.break_messages
        waits: dict[int, tuple[Any, _Waiter, int, int]] = {}
        problems: dict[int, str] = {}
        for dpid, delta in deltas.items():
            try:
                dp = self._dp(dpid)
            except SwitchGone as exc:
                problems[dpid] = str(exc)
                continue
            messages = build(dp, delta)
            if not messages:
                continue
            first_xid = dp.xid + 1
            buf, _ = openflow.serialize(dp, messages)
            fence = openflow.barrier(dp)
            dp.set_xid(fence)
            waiter = _Waiter()
            with self._lock:
                self._waiters[(id(dp), fence.xid)] = waiter
            fence.serialize()
            dp.send(buf + bytes(fence.buf))
            waits[dpid] = (dp, waiter, first_xid, fence.xid)
        deadline = time.monotonic() + timeout_s
        for dpid, (_, waiter, first, last) in waits.items():
            if not waiter.done.wait(max(0.0, deadline - time.monotonic())):
                problems[dpid] = f"no barrier reply within {timeout_s} s"
                continue
            if waiter.gone:
                problems[dpid] = "disconnected during update"
                continue
            with self._lock:
                errors = self._errors.pop(dpid, [])
            bad = [e for e in errors if first <= e[0] <= last]
            if bad:
                problems[dpid] = f"{len(bad)} OpenFlow error(s), first type={bad[0][1]} code={bad[0][2]}"
        return problems

    def probe_links(self, dpids: Iterable[int]) -> int:
        """Send an LLDP probe out of every known port of the given switches."""
        sent = 0
        for dpid in dpids:
            try:
                dp = self._dp(dpid)
            except SwitchGone:
                continue
            with self._lock:
                ports = sorted(self._ports.get(dpid, ()))
            messages = [
                openflow.packet_out(dp, p, packets.lldp_probe(dpid, p, 0x02FAB1000000 | p)) for p in ports
            ]
            if messages:
                buf, _ = openflow.serialize(dp, messages)
                dp.send(buf)
                sent += len(messages)
        return sent

    def port_stats(self, timeout_s: float = 2.0) -> dict[tuple[int, int], dict[str, int]]:
        """Every connected switch's port counters: all requests sent first, then the replies collected, so
        a poll costs one round trip, not one per switch (adaptive routing polls every interval)."""
        result: dict[tuple[int, int], dict[str, int]] = {}
        sent: dict[int, tuple[Any, Any, _Waiter]] = {}
        for dpid in sorted(self.connected()):
            with contextlib.suppress(SwitchGone):
                sent[dpid] = self._send_request(dpid, openflow.port_stats_request)
        deadline = time.monotonic() + timeout_s
        for dpid, request in sent.items():
            try:
                bodies = self._await(dpid, request, max(0.0, deadline - time.monotonic()))
            except (SwitchGone, SwitchError):
                continue
            for s in bodies:
                if openflow.is_physical(s.port_no):
                    result[(dpid, s.port_no)] = {
                        "rx_packets": s.rx_packets,
                        "tx_packets": s.tx_packets,
                        "rx_bytes": s.rx_bytes,
                        "tx_bytes": s.tx_bytes,
                        "rx_dropped": s.rx_dropped,
                        "tx_dropped": s.tx_dropped,
                        "rx_errors": s.rx_errors,
                        "tx_errors": s.tx_errors,
                    }
        return result

    def slot_stats(self, timeout_s: float = 2.0) -> dict[tuple[int, FlowKey], int]:
        """Bytes matched by every slot-table flow of every connected switch, (dpid, flow key) -> bytes; all
        requests sent first, then the replies collected."""
        sent: dict[int, tuple[Any, Any, _Waiter]] = {}
        for dpid in sorted(self.connected()):
            with contextlib.suppress(SwitchGone):
                sent[dpid] = self._send_request(dpid, lambda dp: openflow.table_stats_request(dp, SLOT_TABLE))
        deadline = time.monotonic() + timeout_s
        result: dict[tuple[int, FlowKey], int] = {}
        for dpid, request in sent.items():
            try:
                bodies = self._await(dpid, request, max(0.0, deadline - time.monotonic()))
            except (SwitchGone, SwitchError):
                continue
            for stat in bodies:
                result[(dpid, openflow.flow_from_stats(stat).key)] = int(stat.byte_count)
        return result

    def disconnect_all(self) -> None:
        with self._lock:
            dps = list(self._dps.values())
        for dp in dps:
            dp.close()


@dataclass
class OpenFlowRuntime:
    app: FabricApp
    manager: Any
    threads: list[threading.Thread]

    def stop(self) -> None:
        compat.close_listeners()
        self.app.disconnect_all()
        self.manager.close()


def start_openflow(listener: Listener, host: str, port: int) -> OpenFlowRuntime:
    """Start os-ken (our app + its OpenFlow handler) listening on host:port, without osken-manager."""
    compat.install()
    conf = cfg.CONF
    if not getattr(conf, "_fabriclab_parsed", False):
        conf(args=[], project="os_ken", default_config_files=[])
        conf._fabriclab_parsed = True
    conf.set_override("ofp_listen_host", host)
    conf.set_override("ofp_tcp_listen_port", port)
    manager = app_manager.AppManager.get_instance()
    manager.load_apps([__name__])
    manager.create_contexts()
    threads = manager.instantiate_apps(listener=listener)
    app = manager.applications["FabricApp"]
    return OpenFlowRuntime(app, manager, threads)


__all__ = [
    "FabricApp",
    "Listener",
    "OpenFlowRuntime",
    "SwitchError",
    "SwitchGone",
    "SwitchSnapshot",
    "start_openflow",
]
