"""sssp: globally balanced shortest paths on any topology — the engine for irregular fabrics.

Like OpenSM's SSSP, destinations are routed one after another and every link remembers how many paths
already use it; unlike minhop, the weight is global and counts *flows* (source hosts), so the choice at one
switch sees the load the rest of the fabric put on a link.  For a destination, switches are visited from the
farthest to the nearest: each sends the flows it collects over its cheapest shortest-path port (load divided
by bandwidth), and those flows join the next switch's.  With all sources counted this is a greedy
all-to-all balancer.  Each switch picks the shortest-path port whose whole remaining path is cheapest
(Dijkstra over the shortest-path DAG), so two leaves do not both pile onto a spine whose link down to the
destination is already full.  Restricting it to shortest paths keeps hop counts minimal (OpenSM's SSSP may
take longer paths).

Deciding all switches of a distance level at once makes them herd onto the same cheap link for one
destination; on fat-trees that is harmless, on rail and leaf-spine fabrics it leaves a tier unbalanced.  So
while some tier's max/mean stays above 1.01 and keeps improving, whole extra rounds rip up each
destination's tree and reroute it against the loads of all the others (at most `max_refinements`).

The loop over destinations is inherent (each one sees the loads of those before), so its cost is what one
destination costs: on small fabrics with narrow levels it runs in plain Python (`sssp_scalar`), elsewhere
over candidate blocks prepared once per destination switch (`sssp_vector`: about five array operations per
distance level).  Both make the same tables.  No deadlock promise on arbitrary graphs.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controller.sm.cdg import lanes
from controller.sm.engines.base import RoutingEngine
from controller.sm.engines.common import TargetMasks, alternatives, port_order
from controller.sm.engines.sssp_scalar import Candidates
from controller.sm.engines.sssp_scalar import balance as scalar_balance
from controller.sm.engines.sssp_vector import Plans, cells
from controller.sm.engines.sssp_vector import balance as vector_balance
from controller.sm.hostorder import host_order
from controller.sm.paths import ShortestCandidates, hop_distances, multi_source_distances
from controller.sm.subnet import NO_PORT, U8, Subnet
from controller.sm.tables import RoutingTables, new_lft, set_local_routes

#: InfiniBand data virtual lanes (VL0-VL14; VL15 is management).
MAX_VLS = 15


class _Levels:
    """Switches grouped by distance to one destination switch, farthest group first (cached per switch)."""

    def __init__(self, dist: U8) -> None:
        self.dist = dist
        self._target = -1
        self.groups: list[npt.NDArray[np.intp]] = []

    def __call__(self, target: int) -> list[npt.NDArray[np.intp]]:
        if target != self._target:
            column = self.dist[:, target]
            order = np.argsort(column, kind="stable")
            values = column[order]
            cuts = np.flatnonzero(np.diff(values)) + 1
            groups = np.split(order.astype(np.intp), cuts)
            keep = [g for g in groups if 0 < column[g[0]] < 255]
            self.groups = keep[::-1]
            self._target = target
        return self.groups


def _tiers(subnet: Subnet, channel: npt.NDArray[np.intp], n_channels: int) -> npt.NDArray[np.int64]:
    """Tier id per channel: (level of its switch, level of the far switch), levels counted from leaves."""
    level = multi_source_distances(subnet, subnet.has_hosts).astype(np.int64)
    tier = np.zeros(n_channels, dtype=np.int64)
    rows, ports = np.nonzero(channel < n_channels)
    tier[channel[rows, ports]] = level[rows] * (subnet.n_switches + 1) + level[subnet.nbr[rows, ports]]
    return tier


def _worst_tier_imbalance(load: npt.NDArray[np.float64], tier: npt.NDArray[np.int64]) -> float:
    """Largest max/mean of channel loads within one tier (tiers carry different loads by design)."""
    worst = 1.0
    for t in np.unique(tier):
        values = load[tier == t]
        mean = float(values.mean())
        if mean > 0:
            worst = max(worst, float(values.max()) / mean)
    return worst


def _candidates_per_level(dist: U8, alt: U8) -> float:
    """Shortest-path ports per (destination switch, distance level): how wide the vector form's steps are."""
    ordered = np.sort(dist, axis=0)
    reachable = (ordered > 0) & (ordered < 255)
    starts = np.ones_like(reachable)
    starts[1:] = ordered[1:] != ordered[:-1]
    levels = int((starts & reachable).sum())
    return float(np.unpackbits(alt).sum()) / max(1, levels)


def _orders(subnet: Subnet) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """(destination indices in routing order, per switch its ports in preference order).

    Destinations: hosts in CA order (leaf by leaf, see `hostorder`), then switch LIDs by switch position.
    Greedy balancing is only as good as its order: hosts of one leaf in a row spread over the leaf's
    up-links before the next leaf starts; in LID order — GUID order, which on OpenSM's own fabrics
    interleaves the pods — the same greedy left some links at twice the mean.  Ports: by the position of
    the switch behind them (then number), so ties do not depend on how the ports happen to be numbered.
    """
    ca = host_order(subnet)
    rank = np.full(subnet.max_lid + 1, 0, dtype=np.int64)
    rank[subnet.ep_lids[ca.order]] = np.arange(ca.order.size)
    rank[subnet.switch_lids] = ca.order.size + ca.position
    order = np.argsort(rank[subnet.dest_lids], kind="stable").astype(np.intp)
    return order, port_order(subnet, ca.position)


class SsspEngine(RoutingEngine):
    name = "sssp"
    summary = "globally balanced shortest paths (all-to-all aware); any topology"
    deadlock_free = "no promise"
    #: Extra rip-up-and-reroute rounds when a tier stays unbalanced, and what counts as balanced.
    max_refinements = 3
    balanced = 1.01
    #: The balancing loop runs in plain Python (`sssp_scalar`, same tables) on fabrics of up to this many
    #: switches whose distance levels hold at most `scalar_candidates_per_level` shortest-path ports on
    #: average: there, fixed per-level costs of array operations outweigh the arithmetic they do (6x6
    #: torus 49 -> 10 ms, random regular 64x6 135 -> 48 ms; k=8 fat-tree, 64 per level: 20 vs 28 ms).
    scalar_up_to = 256
    scalar_candidates_per_level = 48.0
    #: Elsewhere `sssp_vector` runs (same tables, 2.8-3.3x faster on damaged k=16) while what it keeps —
    #: candidate blocks per destination switch and charges per destination, `sssp_vector.cells` — stays
    #: within this many array cells: damaged k=16 needs 1.1 M (peak 33 MB against the per-level loop's
    #: 7 MB), k=24 8.0 M; beyond, the per-level loop, which keeps nothing per destination.
    plan_cells = 1 << 21

    def route(self, subnet: Subnet) -> RoutingTables:
        n = subnet.n_switches
        dist = hop_distances(subnet)
        alt = alternatives(subnet, ShortestCandidates(subnet, dist))
        lft = new_lft(subnet)
        # Channel ids for switch-to-switch ports; the extra id n_channels is a dump for "no channel".
        channel, n_channels = subnet.switch_channels
        is_link = subnet.nbr >= 0
        # Cost of a flow on a link: 1 on the fastest links, more on slower ones.  Relative, so that on a
        # fabric of equal links the costs are whole numbers and ties are exact whatever the link speed.
        fastest = float(subnet.bw_gbps[is_link].max(initial=1.0))
        weight = np.where(is_link, fastest / np.where(is_link, subnet.bw_gbps, 1.0), 1.0)
        next_switch = np.where(is_link, subnet.nbr, 0).astype(np.intp)
        levels = _Levels(dist)
        host_sources = subnet.hosts_per_switch.astype(np.float64)
        order, preference = _orders(subnet)
        tier = _tiers(subnet, channel, n_channels)
        if n <= self.scalar_up_to and _candidates_per_level(dist, alt) <= self.scalar_candidates_per_level:
            every_mask = np.unpackbits(alt, axis=2, count=subnet.n_ports).astype(bool)
            candidates = Candidates(n, levels, every_mask, preference, channel, weight, next_switch)
            scalar_balance(
                candidates,
                order.tolist(),
                subnet.dest_lids.tolist(),
                subnet.dest_switch.tolist(),
                subnet.dest_is_host.tolist(),
                host_sources.tolist(),
                n,
                n_channels,
                1 + self.max_refinements,
                lambda host_load: _worst_tier_imbalance(host_load, tier),
                self.balanced,
                lft,
            )
            return self._finish(subnet, dist, lft, alt)
        if cells(alt, subnet.dest_lids.size) <= self.plan_cells:
            plans = Plans(
                dist, alt, subnet.n_ports, preference, channel, weight, next_switch, host_sources, n_channels
            )
            vector_balance(
                plans,
                order.tolist(),
                subnet.dest_lids.tolist(),
                subnet.dest_switch.tolist(),
                subnet.dest_is_host.tolist(),
                n_channels,
                1 + self.max_refinements,
                lambda host_load: _worst_tier_imbalance(host_load, tier),
                self.balanced,
                lft,
            )
            return self._finish(subnet, dist, lft, alt)
        self._balance_by_level(
            subnet, dist, alt, lft, order, preference, tier, weight, next_switch, host_sources
        )
        return self._finish(subnet, dist, lft, alt)

    def _balance_by_level(
        self,
        subnet: Subnet,
        dist: U8,
        alt: U8,
        lft: U8,
        order: npt.NDArray[np.intp],
        preference: npt.NDArray[np.intp],
        tier: npt.NDArray[np.int64],
        weight: npt.NDArray[np.float64],
        next_switch: npt.NDArray[np.intp],
        host_sources: npt.NDArray[np.float64],
    ) -> None:
        """The balancing loop as whole-level array operations over (switch x port) tables: slower than
        `sssp_vector` (about 110 operations per destination) but it keeps nothing per destination, for
        fabrics where that would cost too much memory."""
        n = subnet.n_switches
        channel, n_channels = subnet.switch_channels
        levels = _Levels(dist)
        load = np.zeros(n_channels + 1, dtype=np.float64)
        masks = TargetMasks(subnet, alt)
        switch_sources = np.ones(n, dtype=np.float64)
        inf = np.float64(np.inf)
        # Per-port arrays with each switch's columns in preference order: argmin then breaks ties by the
        # position of the switch behind a port, not by its number.
        pref_channel = np.take_along_axis(channel, preference, axis=1)
        pref_weight = np.take_along_axis(weight, preference, axis=1)
        pref_next = np.take_along_axis(next_switch, preference, axis=1)
        pref_target = -1
        pref_mask = np.zeros((n, subnet.n_ports), dtype=bool)
        path_cost = np.zeros(n + 1, dtype=np.float64)

        host_load = np.zeros_like(load)  # the part of `load` that host traffic puts there

        def push(
            groups: list[npt.NDArray[np.intp]],
            lid: int,
            flows: npt.NDArray[np.float64],
            sign: float,
            host: bool,
        ) -> None:
            """Farthest first: carry the flows along the chosen tree and charge the links they use."""
            for group in groups:
                choice = lft[group, lid].astype(np.intp)
                used = channel[group, choice]
                load[used] += sign * flows[group]
                if host:
                    host_load[used] += sign * flows[group]
                flows += np.bincount(next_switch[group, choice], weights=flows[group], minlength=flows.size)

        previous = np.inf
        for round_number in range(1 + self.max_refinements):
            for i in order.tolist():
                lid = int(subnet.dest_lids[i])
                target = int(subnet.dest_switch[i])
                if target != pref_target:
                    pref_mask = np.take_along_axis(masks(target), preference, axis=1)
                    pref_target = target
                groups = levels(target)
                host = bool(subnet.dest_is_host[i])
                sources = host_sources if host else switch_sources
                if round_number:
                    push(groups, lid, sources.copy(), -1.0, host)  # rip up, reroute against all the others
                # Nearest first: the cheapest shortest path from each switch, as a sum of link loads.
                path_cost[target] = 0.0
                for group in reversed(groups):
                    cost = load[pref_channel[group]] * pref_weight[group] + path_cost[pref_next[group]]
                    choice = np.where(pref_mask[group], cost, inf).argmin(axis=1)
                    path_cost[group] = cost[np.arange(group.size), choice]
                    lft[group, lid] = preference[group, choice]
                push(groups, lid, sources.copy(), 1.0, host)
            imbalance = _worst_tier_imbalance(host_load[:n_channels], tier)
            if imbalance <= self.balanced or imbalance >= previous - 1e-9:
                break
            previous = imbalance

    def _finish(self, subnet: Subnet, dist: U8, lft: U8, alt: U8) -> RoutingTables:
        unreachable = dist == 255
        if unreachable.any():
            rows, cols = np.nonzero(unreachable[:, subnet.dest_switch])
            lft[rows, subnet.dest_lids[cols]] = NO_PORT
        set_local_routes(lft, subnet)
        return RoutingTables(self.name, subnet, lft, alt, {})


class DfssspEngine(SsspEngine):
    """sssp's routes, plus virtual-lane layers where they would deadlock (OpenSM's dfsssp).

    The routes are sssp's (balanced shortest paths); if the channel dependency graph of host traffic has a
    cycle, routes — (ingress leaf, destination) pairs, i.e. DFSSSP's paths — are spread over layers by its
    cycle breaking (`cdg.assign_layers`) and the tables carry the layer of every route.  Fat-trees need one
    layer; tori, dragonflies and random graphs a few.
    """

    name = "dfsssp"
    summary = "sssp + virtual-lane layers where its routes would deadlock (DFSSSP); any topology"
    deadlock_free = "any topology (up to --vls lanes, 8 by default, 15 at most)"
    #: Virtual lanes available for layers by default (InfiniBand switches commonly offer 8 data VLs).
    max_layers = 8

    def __init__(self, max_layers: int = 8) -> None:
        if not 1 <= max_layers <= MAX_VLS:
            raise ValueError(f"virtual lanes must be 1..{MAX_VLS}, got {max_layers}")
        self.max_layers = max_layers

    def with_lanes(self, vls: int) -> DfssspEngine:
        """Up to `vls` layers (InfiniBand has 15 data VLs; OpenSM's dfsssp uses what the switches offer)."""
        return type(self)(vls)

    def route(self, subnet: Subnet) -> RoutingTables:
        tables = super().route(subnet)
        layers, info = lanes(tables, self.max_layers)
        return RoutingTables(self.name, subnet, tables.lft, tables.alt, info, layers)


__all__ = ["MAX_VLS", "DfssspEngine", "SsspEngine"]
