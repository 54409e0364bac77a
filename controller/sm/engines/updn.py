"""updn: up*/down* routing from automatically chosen roots — deadlock-free on any topology.

Roots are the top tier inferred from the cabling (the switches farthest from hosts); ranks are hop distances
from them, and links between switches of equal rank are ordered by GUID so every link has a direction.  A
route climbs zero or more links and then descends, never climbing after a descent, so the channel
dependency graph is acyclic with a single virtual lane (Autonet, OpenSM's updn).  Ports are balanced like
minhop's among the legal next hops.  If the top tier cannot give every pair a route on a strange or badly
broken fabric, a single central root is used instead (reported in `info["fallback"]`).
"""

from __future__ import annotations

from controller.sm.engines.base import RoutingEngine
from controller.sm.engines.common import alternatives, balance_locally
from controller.sm.orientation import orient
from controller.sm.paths import UpDownCandidates
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables, new_lft, set_local_routes


class UpDownEngine(RoutingEngine):
    name = "updn"
    summary = "up*/down* from the top tier; deadlock-free on any topology"
    deadlock_free = "any topology"

    def route(self, subnet: Subnet) -> RoutingTables:
        orientation = orient(subnet, "guid")
        alt = alternatives(subnet, UpDownCandidates(subnet, orientation.ud, orientation.hops))
        lft = new_lft(subnet)
        balance_locally(subnet, alt, lft)
        set_local_routes(lft, subnet)
        return RoutingTables(self.name, subnet, lft, alt, orientation.describe(subnet))
