"""Routing under canonical labels: the same tables' quality whatever the GUIDs and port numbers.

Every engine breaks ties by GUID and port number, as OpenSM's do.  On an intact fat-tree that is harmless;
on a damaged one two labellings of the same cabling give different figures (on k=4 and k=8 fat-trees with
five kinds of damage, 31 of 80 relabelled cases changed an ftree figure, 67 an sssp and dfsssp one).
`CanonicalLabels` routes `topologies.canonical.canonical_copy` of the fabric — GUIDs and port numbers from
the cabling alone — and maps the tables back to the fabric's own switches, LIDs and ports, so any labelling
of the same cabling gets tables that are images of each other and the same figures.

It is a choice, not the default (`route --labels canonical`): the default keeps OpenSM's tie-breaking, which
reproduces OpenSM's own tables entry for entry on intact fabrics and lets a cut move only the destinations
that used it (a canonical labelling of the damaged fabric renumbers the whole tree).  It costs the
labelling (k=16: ~0.2-0.3 s) on top of the routing.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from controller.sm.engines.base import RoutingEngine
from controller.sm.hostorder import HostOrder, host_order
from controller.sm.lids import assign_lids
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables
from topologies.canonical import canonical_copy

LABELS = ("as-given", "canonical")


class CanonicalLabels(RoutingEngine):
    name: ClassVar[str] = "canonical"  # instances report the engine they wrap (`tables.engine`)
    summary: ClassVar[str] = "any engine, routed on canonical GUIDs and port numbers"
    deadlock_free: ClassVar[str] = "as the engine it wraps"

    def __init__(self, inner: RoutingEngine) -> None:
        self.inner = inner
        self.max_layers = getattr(inner, "max_layers", 8)

    def problem(self, subnet: Subnet) -> str | None:
        return self.inner.problem(subnet)

    def with_lanes(self, vls: int) -> RoutingEngine:
        return CanonicalLabels(self.inner.with_lanes(vls))

    def route(self, subnet: Subnet) -> RoutingTables:
        copy, canonical = self._copy(subnet)
        return self._back(subnet, canonical, self.inner.route(canonical), copy)

    def route_some(self, subnet: Subnet, lids: npt.NDArray[np.integer]) -> RoutingTables:
        copy, canonical = self._copy(subnet)
        ours = np.array(
            [canonical.lids.lid(*_endpoint(subnet, int(lid))) for lid in np.asarray(lids).tolist()],
            dtype=np.intp,
        )
        return self._back(subnet, canonical, self.inner.route_some(canonical, ours), copy)

    @staticmethod
    def _copy(subnet: Subnet) -> tuple[dict[str, dict[int, int]], Subnet]:
        relabelled = canonical_copy(subnet.fabric)
        return relabelled.ports, Subnet.build(relabelled.fabric, assign_lids(relabelled.fabric))

    @staticmethod
    def _back(
        subnet: Subnet, canonical: Subnet, tables: RoutingTables, ports: dict[str, dict[int, int]]
    ) -> RoutingTables:
        """The canonical copy's tables on `subnet`: rows by switch name, columns by endpoint, ports through
        each switch's own numbering."""
        rows = np.array([canonical.switch_index[name] for name in subnet.switch_names], dtype=np.intp)
        # lid_of[canonical LID] = subnet's LID of the same endpoint
        lid_of = np.zeros(canonical.max_lid + 1, dtype=np.intp)
        for lid in canonical.dest_lids.tolist():
            lid_of[lid] = subnet.lids.lid(*_endpoint(canonical, lid))
        cols = canonical.dest_lids.astype(np.intp)
        # back[s, canonical port] = the port's own number (0 stays 0, NO_PORT stays NO_PORT)
        back = np.full((subnet.n_switches, 256), NO_PORT, dtype=np.uint8)
        back[:, 0] = 0
        for s, name in enumerate(subnet.switch_names):
            for own, new in ports[name].items():
                back[s, new] = own
        lft = np.full((subnet.n_switches, subnet.max_lid + 1), NO_PORT, dtype=tables.lft.dtype)
        lft[:, lid_of[cols]] = back[np.arange(subnet.n_switches)[:, None], tables.lft[rows][:, cols]]
        alt_bits = np.unpackbits(tables.alt[rows][:, rows], axis=2, count=canonical.n_ports).astype(bool)
        own_bits = np.zeros((subnet.n_switches, subnet.n_switches, subnet.n_ports), dtype=bool)
        for s, name in enumerate(subnet.switch_names):
            for own, new in ports[name].items():
                if new < canonical.n_ports and own < subnet.n_ports:
                    own_bits[s, :, own] = alt_bits[s, :, new]
        alt = np.packbits(own_bits, axis=2)
        layers = None
        if tables.layers is not None:
            layers = np.zeros((subnet.n_switches, subnet.max_lid + 1), dtype=tables.layers.dtype)
            layers[:, lid_of[cols]] = tables.layers[rows][:, cols]
        info = {**tables.info, "labels": "canonical"}
        return RoutingTables(
            tables.engine, subnet, lft, alt, info, layers, _order_back(subnet, canonical, lid_of)
        )


def _order_back(subnet: Subnet, canonical: Subnet, lid_of: npt.NDArray[np.intp]) -> HostOrder:
    """The canonical copy's CA order (leaves in its tree order, hosts by its ports) in `subnet`'s indices."""
    ours = host_order(canonical)
    ep_of = np.full(subnet.max_lid + 1, -1, dtype=np.int64)
    ep_of[subnet.ep_lids] = np.arange(subnet.ep_lids.size)
    endpoint = ep_of[lid_of[canonical.ep_lids]]  # canonical endpoint index -> subnet's
    switch = np.array([subnet.switch_index[name] for name in canonical.switch_names], dtype=np.int64)
    slot = np.empty_like(ours.slot)
    slot[endpoint] = ours.slot
    position = np.empty_like(ours.position)
    position[switch] = ours.position
    return HostOrder(endpoint[ours.order], slot, ours.per_leaf, position, switch[ours.leaves])


def _endpoint(subnet: Subnet, lid: int) -> tuple[str, int]:
    endpoint = subnet.lids.endpoints[lid]
    return endpoint.node, (0 if endpoint.is_switch else endpoint.port)


def labelled(engine: RoutingEngine, labels: str) -> RoutingEngine:
    """`engine` routing under `labels` ("as-given": the fabric's own GUIDs and ports; "canonical")."""
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {', '.join(LABELS)}, got {labels!r}")
    return CanonicalLabels(engine) if labels == "canonical" else engine


__all__ = ["LABELS", "CanonicalLabels", "labelled"]
