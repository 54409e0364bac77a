"""Routing results: linear forwarding tables plus the equal-cost alternatives behind them.

`lft[s, lid]` is the output port of switch s for destination LID `lid` (255: no route), exactly what an
InfiniBand switch holds and what the controller turns into destination-based flows.  `alt` keeps, per
(switch, destination switch), the bit set of all ports an engine considered equally good; select groups,
fast-failover groups and adaptive routing draw on it later without recomputing paths.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.sm.hostorder import HostOrder
from controller.sm.subnet import NO_PORT, U8, Subnet


class RouteError(LookupError):
    """A path lookup failed (no route, loop, unknown node)."""


@dataclass(frozen=True)
class Hop:
    node: str
    in_port: int | None
    out_port: int | None

    def __str__(self) -> str:
        parts = [self.node]
        if self.in_port is not None:
            parts.insert(0, f"{self.in_port}>")
        if self.out_port is not None:
            parts.append(f">{self.out_port}")
        return "".join(parts)


@dataclass(frozen=True, eq=False)
class RoutingTables:
    engine: str
    subnet: Subnet
    lft: U8
    alt: U8
    info: Mapping[str, Any] = field(default_factory=dict)
    #: Virtual lane (layer) per route when the engine assigned them (dfsssp): layers[s, lid] is the lane of
    #: traffic entering the fabric at switch s towards `lid`.  None: everything on VL 0.
    layers: U8 | None = None
    #: The CA order the engine numbered destinations in, where it is not the subnet's own
    #: (`hostorder.host_order`): routing under canonical labels (`engines.labels`).  Shift permutations are
    #: judged, and `opensm-ftree-ca-order.dump` written, in it.  None: the subnet's.
    ca_order: HostOrder | None = None

    def _switch(self, switch: str | int) -> int:
        if isinstance(switch, int):
            return switch
        try:
            return self.subnet.switch_index[switch]
        except KeyError:
            raise RouteError(f"unknown switch {switch!r}") from None

    def port(self, switch: str | int, lid: int) -> int:
        return int(self.lft[self._switch(switch), lid])

    def alternatives(self, switch: str | int, lid: int) -> tuple[int, ...]:
        """All ports of `switch` on equally good routes to `lid` (the chosen one among them)."""
        s = self._switch(switch)
        try:
            target, port = self.subnet.lid_target(lid)
        except KeyError as exc:
            raise RouteError(str(exc)) from None
        if target == s:
            return (port,)
        bits = np.unpackbits(self.alt[s, target], count=self.subnet.n_ports)
        return tuple(int(p) for p in np.flatnonzero(bits))

    def table(self, switch: str | int) -> dict[int, int]:
        """LID -> port for one switch (routed LIDs only)."""
        row = self.lft[self._switch(switch)]
        lids = self.subnet.dest_lids
        return {int(lid): int(row[lid]) for lid in lids if row[lid] != NO_PORT}

    def path(self, src: str, dst: str, choose: Callable[[int, int, int], int] | None = None) -> list[Hop]:
        """Hop-by-hop path from host (or switch) `src` to host (or switch) `dst`, following the tables;
        `choose(switch, dst_lid, table_port)` may pick another port at a switch (a multipath policy)."""
        subnet = self.subnet
        try:
            dst_lid = subnet.lids.lid(dst)
        except KeyError:
            raise RouteError(f"unknown node {dst!r}") from None
        nodes = subnet.fabric.nodes
        if src not in nodes:
            raise RouteError(f"unknown node {src!r}")
        hops: list[Hop] = []
        if nodes[src].is_host:
            ep = subnet.endpoint_index(src)
            hops.append(Hop(src, None, subnet.endpoints[ep].port))
            current, in_port = int(subnet.ep_switch[ep]), int(subnet.ep_switch_port[ep])
        else:
            current, in_port = subnet.switch_index[src], None
        for _ in range(subnet.n_switches + 1):
            out = int(self.lft[current, dst_lid])
            if choose is not None and out not in (NO_PORT, 0):
                out = choose(current, dst_lid, out)
            name = subnet.switch_names[current]
            if out == NO_PORT:
                raise RouteError(f"{name} has no route to {dst} (LID {dst_lid})")
            hops.append(Hop(name, in_port, out if out != 0 else None))
            if out == 0:
                return hops
            nxt = int(subnet.nbr[current, out])
            if nxt < 0:
                ep = int(subnet.host_ep[current, out])
                if ep < 0:
                    raise RouteError(f"{name} port {out} toward {dst} is not connected")
                hops.append(Hop(subnet.endpoints[ep].node, int(subnet.nbr_port[current, out]), None))
                return hops
            current, in_port = nxt, int(subnet.nbr_port[current, out])
        raise RouteError(f"routing loop on the way from {src} to {dst}")

    def digest(self) -> str:
        """Content hash of the forwarding tables (same fabric and engine must give the same digest)."""
        return hashlib.sha256(np.ascontiguousarray(self.lft).tobytes()).hexdigest()[:16]


def new_lft(subnet: Subnet) -> U8:
    return np.full((subnet.n_switches, subnet.max_lid + 1), NO_PORT, dtype=np.uint8)


def set_local_routes(lft: U8, subnet: Subnet) -> None:
    """Entries of destinations on the switch itself: its own LID (port 0) and its hosts' ports."""
    lft[subnet.dest_switch, subnet.dest_lids] = subnet.dest_port


__all__ = ["Hop", "RouteError", "RoutingTables", "new_lft", "set_local_routes"]
