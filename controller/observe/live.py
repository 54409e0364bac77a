"""The live view's data: the fabric drawn once (`view()`), then frames pushed as server-sent events.

A frame is what changed the picture: links down, switches connected, generation and engine, the latest
per-direction utilisation (only when a new counter poll arrived) and the events the client has not seen.
Frames are built from the published snapshot at most once per `frame_interval_s`, whatever the number of
clients, and shared by all of them; each client keeps only a cursor (last event id, last utilisation
sent).  A slow client never makes the server hold more: its stream waits on the socket (uvicorn applies
back-pressure) and, when it drains, gets the newest frame — intermediate ones are skipped, events are not
(they come from the snapshot's log by id; a client that fell further behind than the log is told so with
`events_gap` and can read `GET /api/v1/events`).  Clients are capped (`max_clients`; more get 503).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from controller.core.state import Record
from controller.observe.model import COLLAPSE_ABOVE_NODES, Layout, link_utilisation, per_mille
from controller.published import PortStats, Published


@dataclass(frozen=True)
class LiveOptions:
    #: At most this many frames per second reach a client (4).
    frame_interval_s: float = 0.25
    max_clients: int = 16
    keepalive_s: float = 15.0
    #: Events in one frame; older unseen ones are summarised by `events_gap`.
    max_events_per_frame: int = 100


@dataclass(frozen=True)
class Frame:
    seq: int
    built_at: float
    pub: Published
    #: JSON of everything but events and utilisation (shared by every client).
    state_json: str
    stats: PortStats | None
    #: JSON array of per-mille utilisation, or None before two polls.
    util_json: str | None


class LiveView:
    def __init__(
        self,
        snapshot: Callable[[], Published],
        layout: Layout,
        capacity_factor: float = 1.0,
        options: LiveOptions | None = None,
        token_required: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: seconds, monotonic; injected so tests step time instead of sleeping."""
        self.snapshot, self.layout, self.capacity_factor = snapshot, layout, capacity_factor
        self.clock = clock
        self.options = options or LiveOptions()
        self.token_required = token_required
        self._lock = threading.Lock()
        self._frame: Frame | None = None
        self._util_for: tuple[PortStats | None, str | None] = (None, None)
        self._seq = 0
        self._clients = 0
        self._view: dict[str, Any] | None = None
        self.frames_built = 0

    # --- the drawing (fixed: the declared fabric) --------------------------------------------------------

    def view(self) -> dict[str, Any]:
        if self._view is None:
            self._view = self._build_view()
        pub = self.snapshot()
        return {
            **self._view,
            "engine": pub.state.config.engine,
            "engines": pub.context.registry.names(),
            "token_required": self.token_required,
        }

    def _build_view(self) -> dict[str, Any]:
        layout = self.layout
        fabric = layout.fabric
        tiers = layout.tiers
        names = list(fabric.nodes)
        index = {name: i for i, name in enumerate(names)}
        link_tiers = list(tiers.link_tiers())
        nodes = []
        for name in names:
            node, place = fabric.nodes[name], layout.placements[name]
            entry: dict[str, Any] = {
                "name": name,
                "kind": node.kind.value,
                "level": place.level,
                "x": round(place.x, 5),
            }
            if place.group is not None:
                entry["group"] = place.group
            nodes.append(entry)
        return {
            "fabric": fabric.name,
            "summary": fabric.summary(),
            "levels": list(tiers.names),
            "link_tiers": link_tiers,
            "rail_optimised": layout.rail_optimised,
            "nodes": nodes,
            # [a node index, a port, b node index, b port, link tier index, Gb/s], in declared order = link id
            "links": [
                [
                    index[k.a.node],
                    k.a.port,
                    index[k.b.node],
                    k.b.port,
                    link_tiers.index(tiers.of_link(k)),
                    k.bw_gbps,
                ]
                for k in fabric.links
            ],
            "groups": [
                {
                    "name": g.name,
                    "label": g.label,
                    "members": [index[m] for m in g.members],
                    "x0": round(g.x0, 5),
                    "x1": round(g.x1, 5),
                    "level_min": g.level_min,
                    "level_max": g.level_max,
                }
                for g in layout.groups
            ],
            "collapsed": len(names) > COLLAPSE_ABOVE_NODES,
            "frame_interval_s": self.options.frame_interval_s,
            "capacity_factor": self.capacity_factor,
        }

    # --- frames --------------------------------------------------------------------------------------------

    def frame(self, now: float | None = None) -> Frame:
        """The newest frame: rebuilt from the snapshot when it changed and the last one is old enough."""
        now = self.clock() if now is None else now
        pub = self.snapshot()
        with self._lock:
            current = self._frame
            fresh = current is not None and (
                current.pub is pub or now - current.built_at < self.options.frame_interval_s
            )
            if current is not None and fresh:
                return current
            self._seq += 1
            frame = self._build(pub, self._seq, now)
            self._frame = frame
            self.frames_built += 1
            return frame

    def _build(self, pub: Published, seq: int, now: float) -> Frame:
        context, state = pub.context, pub.state
        current = state.current
        down = [i for i in range(len(context.declared.links)) if not context.link_up(i, state.ports_down)]
        declared = [s.name for s in context.declared.switches]
        body = {
            "seq": seq,
            "at": round(pub.published_at, 3),
            "generation": state.generation,
            "engine": state.config.engine,
            "fast_failover": state.config.options.fast_failover,
            "multipath": state.config.options.multipath,
            "policy": state.config.options.policy,
            "verified": bool(current and current.verification.ok),
            "in_sync": state.in_sync,
            "switches": len(declared),
            "connected": len(state.connected),
            "disconnected": [n for n in declared if n not in state.connected],
            "down": down,
            "ports_down": sorted(str(ref) for ref in state.ports_down),
            "lost_hosts": list(current.lost_hosts) if current else [],
            "stats_at": round(pub.stats.at, 3) if pub.stats else None,
        }
        stats, util_json = self._util_for
        if pub.stats is not stats:
            usage = link_utilisation(context.declared, pub.previous_stats, pub.stats, self.capacity_factor)
            util_json = json.dumps(per_mille(usage), separators=(",", ":")) if usage is not None else None
            self._util_for = (pub.stats, util_json)
        return Frame(seq, now, pub, json.dumps(body, separators=(",", ":")), pub.stats, util_json)

    def message(self, frame: Frame, cursor: int, util_sent: PortStats | None) -> tuple[bytes, int]:
        """One SSE message for a client whose last event id is `cursor`; returns it and the new cursor."""
        records: tuple[Record, ...] = frame.pub.state.records
        unseen = [r for r in records if r.id > cursor]
        gap = bool(unseen) and unseen[0].id > cursor + 1 and cursor > 0
        limit = self.options.max_events_per_frame
        if len(unseen) > limit:
            unseen, gap = unseen[-limit:], True
        parts = [frame.state_json[:-1]]
        events = json.dumps([r.as_dict() for r in unseen], separators=(",", ":"))
        parts.append(f',"events":{events},"events_gap":{json.dumps(gap)}')
        if frame.util_json is not None and frame.stats is not util_sent:
            parts.append(f',"util":{frame.util_json}')
        data = "".join(parts) + "}"
        new_cursor = unseen[-1].id if unseen else max(cursor, records[-1].id if records else 0)
        return f"id: {frame.seq}\nevent: frame\ndata: {data}\n\n".encode(), new_cursor

    # --- streams -------------------------------------------------------------------------------------------

    def can_accept(self) -> bool:
        return self._clients < self.options.max_clients

    @property
    def clients(self) -> int:
        return self._clients

    async def stream(self, since: int = 0) -> AsyncGenerator[bytes, None]:
        """Frames for one client until it goes away (the server cancels the generator then)."""
        with self._lock:
            if self._clients >= self.options.max_clients:
                yield b'event: busy\ndata: {"error": "too many live-view clients"}\n\n'
                return
            self._clients += 1
        try:
            yield f"retry: 2000\n: {self.layout.fabric.name}\n\n".encode()
            cursor, util_sent, last_seq = since, None, -1
            last_sent = self.clock()
            while True:
                frame = self.frame()
                now = self.clock()
                if frame.seq != last_seq:
                    data, cursor = self.message(frame, cursor, util_sent)
                    util_sent, last_seq, last_sent = frame.stats, frame.seq, now
                    yield data
                elif now - last_sent >= self.options.keepalive_s:
                    last_sent = now
                    yield b": keepalive\n\n"
                await asyncio.sleep(self.options.frame_interval_s)
        finally:
            with self._lock:
                self._clients -= 1


__all__ = ["Frame", "LiveOptions", "LiveView"]
