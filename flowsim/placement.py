"""Where flows go: the controller's tables and slot tables for the fabric as it is now, the policy's routes
over them, and the counters adaptive routing reads.

Link ids of a simulation: the fabric's directed links (`flowsim.network`), then per leaf an up and a down
bundle (aggregated classes), then one link per sender pacer, then — under adaptive policies — *counters*:
per slot-table set one link for its sprayed traffic and one per slot for its pinned traffic, of infinite
capacity (they never limit; their load is the per-slot byte count the controller reads).  A flow's route
is [pacer] uplink-or-bundle, the fabric hops, [counters].
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from controller.sm.policies import PolicyParams, RoutingPolicy
from flowsim.adaptive import ControllerAdaptive, local_split
from flowsim.maxmin import ranges
from flowsim.network import F64, I32, I64, Network, Routing, route_fabric
from flowsim.pool import BYTES_PER_GBIT
from flowsim.routes import Routes, SlotPick, five_tuple_hash, spray, walk
from flowsim.slots import SetKey, SlotTables

#: Counter blocks are allocated this many sets at a time.
COUNTER_CHUNK = 64
CSR = tuple[Routes, I64, I32, F64, I32]


class Placement:
    """Routes of flows under one policy, over the tables of the fabric as it is now (faults change it)."""

    def __init__(
        self,
        network: Network,
        policy: RoutingPolicy,
        engine: str,
        seed: int,
        ideal: bool,
        first_counter: int,
        grow: Callable[[int], None],
    ) -> None:
        self.net = network
        self.engine = engine
        self.seed = seed
        self.ideal = ideal
        self.multipath = policy.multipath and not ideal
        self.local_ar = policy.name == "local-ar" and not ideal
        self.counting = (policy.adaptive or self.local_ar) and not ideal
        n_sw = network.subnet.n_switches
        self.base_up = network.n_links
        self.base_down = network.n_links + n_sw
        self.base_pacer = network.n_links + 2 * n_sw
        self.base_counter = first_counter
        self.grow = grow  # asks the simulation for link ids up to n (counters)
        self.down_links: set[int] = set()
        self.down_switches: set[str] = set()
        self._routings: dict[tuple[frozenset[int], frozenset[str]], Routing] = {}
        #: Slot assignments that differ from even (adaptive moves), kept across reroutes by set key.
        self.weights: dict[SetKey, tuple[int, ...]] = {}
        self.routing = self._routing()
        self.tables = SlotTables(self.routing, self.weights)
        self.block_size = 1 + self.tables.width_max
        self.block_of: dict[SetKey, int] = {}
        self.frac = self.tables.frac.copy()  # local-ar: each set's shares over its ports
        self.adaptive = ControllerAdaptive(policy.params) if policy.adaptive and not ideal else None

    # --- the fabric as it is ------------------------------------------------------------------------

    def _routing(self) -> Routing:
        key = (frozenset(self.down_links), frozenset(self.down_switches))
        if key not in self._routings:
            self._routings[key] = route_fabric(self.net, self.engine, *key)
        return self._routings[key]

    def fault(self, link: int | None, switch: str | None, down: bool) -> None:
        """A cable or switch went down (or came back): the controller's tables for what is left, the slot
        weights of sets that survive kept."""
        if link is not None:
            (self.down_links.add if down else self.down_links.discard)(link)
        if switch is not None:
            (self.down_switches.add if down else self.down_switches.discard)(switch)
        self.routing = self._routing()
        self.tables = SlotTables(self.routing, self.weights)
        self.frac = self.tables.frac.copy()

    # --- routes -------------------------------------------------------------------------------------

    def routes(self, src: I32, dst: I32, sport: I32, sprayed: np.ndarray) -> Routes:
        """Fabric part of the routes (ending with the hop into the destination host) under the policy."""
        if self.ideal:
            n = src.size
            ok = self.routing.reachable(src, dst)
            indptr = np.arange(n + 1, dtype=np.int64)
            leaf = self.net.leaf_of.astype(np.int64)
            key = leaf[src] * self.net.subnet.n_switches + leaf[dst]
            return Routes(indptr, self.net.host_down[dst], np.ones(n), ok, key)
        if not self.multipath:
            return walk(self.routing, src, dst, None)
        sp = np.flatnonzero(sprayed)
        pin = np.flatnonzero(~sprayed)
        parts: list[tuple[I64, Routes]] = []
        if sp.size:
            frac = self.local_frac() if self.local_ar else None  # local-ar: its own shares per set
            parts.append((sp, spray(self.routing, src[sp], dst[sp], self.tables, frac, usage=self.counting)))
        if pin.size:
            fh = five_tuple_hash(self.routing, src[pin], dst[pin], sport[pin], self.seed)
            pick = SlotPick(self.tables, sport[pin], fh, usage=self.counting)
            parts.append((pin, walk(self.routing, src[pin], dst[pin], pick)))
        return parts[0][1] if len(parts) == 1 and parts[0][0].size == src.size else merge(src.size, parts)

    def full_routes(
        self, src: I32, dst: I32, sport: I32, sprayed: np.ndarray, pacer: I32, aggregated: bool
    ) -> CSR:
        """Routes with the sender's pacer (if any) and uplink (or its leaf's bundle) in front and, when
        counting, the slot counters behind; returns CSR (and every entry's hop: 0 at the sender)."""
        r = self.routes(src, dst, sport, sprayed)
        counts = np.diff(r.indptr)
        n = src.size
        paced = pacer >= 0
        extra = np.zeros(n, dtype=np.int64)
        u_flow = u_link = u_w = u_hop = None
        if r.usage is not None and r.usage[0].size:
            flows, sids, slots, shares, hops = r.usage
            blocks = self.blocks(sids)
            order = np.argsort(flows, kind="stable")
            u_flow = flows[order]
            u_link = (self.base_counter + blocks * self.block_size + 1 + slots)[order].astype(np.int32)
            u_w = shares[order]
            u_hop = hops[order] + 1
            extra = np.bincount(u_flow, minlength=n).astype(np.int64)
        new_counts = np.where(r.ok, counts + 1 + paced + extra, 0)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new_counts, out=indptr[1:])
        links = np.empty(int(indptr[-1]), dtype=np.int32)
        weight = np.empty(int(indptr[-1]))
        hop = np.zeros(int(indptr[-1]), dtype=np.int32)
        good = np.flatnonzero(r.ok)
        head = indptr[good]
        gp = good[paced[good]]
        links[indptr[gp]] = self.base_pacer + pacer[gp]
        weight[indptr[gp]] = 1.0
        head = head + paced[good]
        leaf = self.net.leaf_of
        links[head] = np.where(aggregated, self.base_up + leaf[src[good]], self.net.host_up[src[good]])
        weight[head] = 1.0
        body = ranges(head + 1, counts[good])
        within = ranges(r.indptr[good], counts[good])
        links[body] = r.links[within]
        weight[body] = r.weight[within]
        hop[body] = (r.hop[within] if r.hop is not None else 0) + 1
        if aggregated:  # the last hop (into the host) becomes the destination leaf's bundle
            links[head + counts[good]] = self.base_down + leaf[dst[good]]
        if u_flow is not None and u_link is not None and u_w is not None and u_hop is not None:
            keep = r.ok[u_flow]
            uf = u_flow[keep]
            at = indptr[uf + 1] - extra[uf] + (np.arange(uf.size) - np.searchsorted(uf, uf, side="left"))
            links[at] = u_link[keep]
            weight[at] = u_w[keep]
            hop[at] = u_hop[keep]
        return r, indptr, links, weight, hop

    # --- counters, adaptive routing, local AR ----------------------------------------------------------

    def blocks(self, sids: I32) -> I64:
        """Counter block of each (local) set id, allocating blocks (and counter links) as sets appear."""
        keys = self.tables.keys
        for key in [keys[s] for s in np.unique(sids).tolist() if keys[s] not in self.block_of]:
            self.block_of[key] = len(self.block_of)
        need = self.base_counter + len(self.block_of) * self.block_size
        self.grow(need + COUNTER_CHUNK * self.block_size)
        lookup = np.array([self.block_of.get(k, -1) for k in keys], dtype=np.int64)
        out: I64 = lookup[sids]
        return out

    def local_frac(self) -> F64:
        if self.frac.shape[0] < self.tables.n_sets:
            self.frac = np.vstack([self.frac, self.tables.frac[self.frac.shape[0] :]])
        return self.frac

    def local_step(self, load: F64, cap: F64) -> tuple[F64, int, float]:
        """One damped local-AR re-split of every set from the links' load now (Gb/s)."""
        tables = self.tables
        frac = self.local_frac()
        n = tables.n_sets
        if n == 0:
            return frac, 0, 0.0
        blocks = self.blocks(np.arange(n, dtype=np.int32))
        arriving = load[self.base_counter + blocks * self.block_size]
        switch = tables.switch[:, None].repeat(tables.max_ports, axis=1)
        link = self.routing.link_of[switch, np.maximum(tables.ports, 0)]
        valid = (tables.ports > 0) & (link >= 0)
        port_load = np.where(valid, load[np.maximum(link, 0)], 0.0)
        port_cap = np.where(valid, cap[np.maximum(link, 0)], 0.0)
        return local_split(tables, frac, arriving, port_load, port_cap)

    def adaptive_sample(self, delta: F64, cap: F64, params: PolicyParams) -> int:
        """The controller's decision on one interval's counters (`delta`: bytes per link id); applies the
        moves and returns how many sets changed."""
        if self.adaptive is None:
            return 0
        interval = params.interval_ms / 1000.0
        tables, routing = self.tables, self.routing
        utilisation: dict[tuple[str, int], float] = {}
        for sid, (name, ports) in enumerate(tables.keys):
            s = int(tables.switch[sid])
            for port in ports:
                link = int(routing.link_of[s, port])
                if link >= 0:
                    utilisation[(name, port)] = delta[link] / (cap[link] * BYTES_PER_GBIT * interval)
        blocks = self.blocks(np.arange(tables.n_sets, dtype=np.int32))

        def slot_load(sid: int) -> list[float]:
            base = self.base_counter + int(blocks[sid]) * self.block_size
            width = int(tables.width[sid])
            s = int(tables.switch[sid])
            out = []
            for slot in range(width):
                link = int(routing.link_of[s, int(tables.ports[sid, tables.assign[sid, slot]])])
                sent = delta[base + 1 + slot] + delta[base] / width  # pinned in the slot + its sprayed share
                out.append(sent / (cap[link] * BYTES_PER_GBIT * interval))
            return out

        changed = self.adaptive.sample(tables, utilisation, slot_load, set())
        for sid, assignment in changed.items():
            tables.set_assignment(sid, assignment)
        return len(changed)


def merge(n: int, parts: list[tuple[I64, Routes]]) -> Routes:
    """Routes of disjoint subsets of n flows, as one CSR in flow order."""
    counts = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=bool)
    key = np.full(n, -1, dtype=np.int64)
    for rows, r in parts:
        counts[rows] = np.diff(r.indptr)
        ok[rows] = r.ok
        key[rows] = r.key
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    links = np.empty(int(indptr[-1]), dtype=np.int32)
    weight = np.empty(int(indptr[-1]))
    hop = np.zeros(int(indptr[-1]), dtype=np.int32)
    usage: list[tuple[I64, I32, I64, F64, I32]] = []
    for rows, r in parts:
        dest = ranges(indptr[rows], np.diff(r.indptr))
        links[dest] = r.links
        weight[dest] = r.weight
        if r.hop is not None:
            hop[dest] = r.hop
        if r.usage is not None:
            f, s, slot, w, h = r.usage
            usage.append((rows[f], s, slot, w, h))
    merged = None
    if usage:
        merged = (
            np.concatenate([u[0] for u in usage]),
            np.concatenate([u[1] for u in usage]),
            np.concatenate([u[2] for u in usage]),
            np.concatenate([u[3] for u in usage]),
            np.concatenate([u[4] for u in usage]),
        )
    return Routes(indptr, links, weight, ok, key, merged, hop)


__all__ = ["COUNTER_CHUNK", "Placement", "merge"]
