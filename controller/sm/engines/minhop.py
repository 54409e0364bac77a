"""minhop: shortest paths with per-port load equalisation — OpenSM's default engine.

Every switch independently sends each destination out of the least-used port among those on a shortest
path.  Cheap and local; it balances the number of destinations per port, not the traffic of the whole
fabric, which is why its all-to-all balance on fat-trees is far from ftree's or sssp's.  No deadlock promise:
shortest paths on an arbitrary graph can form channel-dependency cycles (on trees they are up*/down*).
"""

from __future__ import annotations

from controller.sm.engines.base import RoutingEngine
from controller.sm.engines.common import alternatives, balance_locally
from controller.sm.paths import ShortestCandidates, hop_distances
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables, new_lft, set_local_routes


class MinHopEngine(RoutingEngine):
    name = "minhop"
    summary = "shortest paths, least-used port per switch (OpenSM default)"
    deadlock_free = "no promise"

    def route(self, subnet: Subnet) -> RoutingTables:
        dist = hop_distances(subnet)
        alt = alternatives(subnet, ShortestCandidates(subnet, dist))
        lft = new_lft(subnet)
        balance_locally(subnet, alt, lft)
        set_local_routes(lft, subnet)
        return RoutingTables(self.name, subnet, lft, alt, {})
