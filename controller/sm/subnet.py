"""The subnet as the routing engines see it: the fabric compiled into dense numpy arrays.

Engines work on whole tables at once (switches x destinations), so the graph is turned once into index
arrays — a neighbour table indexed by (switch, port), endpoint attachment, LIDs — the way OpenSM builds its
internal tables after discovery.  Nothing here depends on node names or placement metadata: a fabric with
arbitrary names routes exactly like the same cabling with generated ones.

Switch indices follow LID order, ports keep their real numbers (column p is port p; column 0 is the switch
itself), so a row of a forwarding table can be written out without translation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.sm.lids import Endpoint, LidMap, assign_lids
from topologies.model import Fabric

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]

#: Forwarding-table value meaning "no route" (OpenSM's OSM_NO_PATH).
NO_PORT = 255
#: Distance value meaning "unreachable".
INF = 255


@dataclass(frozen=True, eq=False)
class Subnet:
    fabric: Fabric
    lids: LidMap
    switch_names: tuple[str, ...]
    switch_guids: npt.NDArray[np.uint64]
    switch_lids: I32
    #: nbr[s, p]: index of the switch on port p of switch s, -1 if none (unconnected, host, or p = 0).
    nbr: I32
    #: nbr_port[s, p]: the far end's port number (0 where nbr is -1 and no host is there).
    nbr_port: I32
    #: host_ep[s, p]: endpoint index of the host port on port p of switch s, -1 if none.
    host_ep: I32
    #: bw_gbps[s, p]: bandwidth of the link on port p, 0 if none.
    bw_gbps: F64
    #: Host endpoints (connected host ports) in LID order.
    endpoints: tuple[Endpoint, ...]
    ep_lids: I32
    ep_switch: I32
    ep_switch_port: I32
    ep_bw_gbps: F64

    @classmethod
    def build(cls, fabric: Fabric, lids: LidMap | None = None) -> Subnet:
        lids = lids or assign_lids(fabric)
        switch_eps = sorted(
            ((lid, e) for lid, e in lids.endpoints.items() if e.is_switch), key=lambda item: item[0]
        )
        host_eps = sorted(
            ((lid, e) for lid, e in lids.endpoints.items() if not e.is_switch), key=lambda item: item[0]
        )
        names = tuple(e.node for _, e in switch_eps)
        index = {name: i for i, name in enumerate(names)}
        ep_index = {(e.node, e.port): i for i, (_, e) in enumerate(host_eps)}
        n_sw = len(names)
        max_port = max((fabric.nodes[n].ports for n in names), default=0)
        width = max_port + 1
        nbr = np.full((n_sw, width), -1, dtype=np.int32)
        nbr_port = np.zeros((n_sw, width), dtype=np.int32)
        host_ep = np.full((n_sw, width), -1, dtype=np.int32)
        bw = np.zeros((n_sw, width), dtype=np.float64)
        ep_switch = np.full(len(host_eps), -1, dtype=np.int32)
        ep_switch_port = np.zeros(len(host_eps), dtype=np.int32)
        ep_bw = np.zeros(len(host_eps), dtype=np.float64)
        for link in fabric.links:
            a, b = link.a, link.b
            ia, ib = index.get(a.node), index.get(b.node)
            if ia is not None and ib is not None:
                nbr[ia, a.port], nbr_port[ia, a.port] = ib, b.port
                nbr[ib, b.port], nbr_port[ib, b.port] = ia, a.port
                bw[ia, a.port] = bw[ib, b.port] = link.bw_gbps
            elif ia is not None or ib is not None:
                (sw, sp, host) = (ia, a.port, b) if ia is not None else (ib, b.port, a)
                assert sw is not None
                ep = ep_index[(host.node, host.port)]
                host_ep[sw, sp] = ep
                nbr_port[sw, sp] = host.port
                bw[sw, sp] = link.bw_gbps
                ep_switch[ep], ep_switch_port[ep], ep_bw[ep] = sw, sp, link.bw_gbps
        return cls(
            fabric=fabric,
            lids=lids,
            switch_names=names,
            switch_guids=np.array([e.guid for _, e in switch_eps], dtype=np.uint64),
            switch_lids=np.array([lid for lid, _ in switch_eps], dtype=np.int32),
            nbr=nbr,
            nbr_port=nbr_port,
            host_ep=host_ep,
            bw_gbps=bw,
            endpoints=tuple(e for _, e in host_eps),
            ep_lids=np.array([lid for lid, _ in host_eps], dtype=np.int32),
            ep_switch=ep_switch,
            ep_switch_port=ep_switch_port,
            ep_bw_gbps=ep_bw,
        )

    # --- sizes and lookups -----------------------------------------------------------------------------

    @property
    def n_switches(self) -> int:
        return len(self.switch_names)

    @property
    def n_ports(self) -> int:
        """Columns of per-port arrays: highest port number + 1."""
        return int(self.nbr.shape[1])

    @property
    def max_lid(self) -> int:
        return self.lids.max_lid

    @cached_property
    def switch_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.switch_names)}

    def renumbering(self, old_index: Mapping[str, int]) -> Renumbering:
        """Where this subnet's switches were in an earlier subnet whose `switch_index` is `old_index` (by
        name: a lost or returning switch shifts the rows).  The last answer is kept: a reroute asks it of
        the same pair from routing, verification, compile and rollout."""
        memo = self.__dict__.get("_renumbering")
        if memo is not None and memo[0] is old_index:
            found: Renumbering = memo[1]
            return found
        names = self.switch_names
        old_of = np.fromiter((old_index.get(name, -1) for name in names), dtype=np.intp, count=len(names))
        old_of.flags.writeable = False
        identity = len(old_index) == len(names) and bool((old_of == np.arange(len(names))).all())
        result = Renumbering(old_of, identity)
        self.__dict__["_renumbering"] = (old_index, result)
        return result

    @cached_property
    def has_hosts(self) -> Bool:
        """Switches with at least one host attached (leaves, as far as routing is concerned)."""
        result = np.zeros(self.n_switches, dtype=bool)
        result[self.ep_switch] = True
        return result

    @cached_property
    def hosts_per_switch(self) -> I64:
        return np.bincount(self.ep_switch, minlength=self.n_switches).astype(np.int64)

    # --- destinations: every LID, as (attachment switch, final port) -------------------------------------

    @cached_property
    def dest_lids(self) -> I32:
        """All LIDs in ascending order: the columns engines fill."""
        return np.array(sorted(self.lids.endpoints), dtype=np.int32)

    @cached_property
    def dest_switch(self) -> I32:
        """For each entry of `dest_lids`: the switch the destination hangs off (itself for a switch)."""
        lut = self._lid_lookup
        return lut[0][self.dest_lids]

    @cached_property
    def dest_port(self) -> I32:
        """For each entry of `dest_lids`: the port the destination switch delivers on (0 = itself)."""
        lut = self._lid_lookup
        return lut[1][self.dest_lids]

    @cached_property
    def dest_is_host(self) -> Bool:
        return self.dest_port > 0

    @cached_property
    def _lid_lookup(self) -> tuple[I32, I32]:
        size = self.max_lid + 1
        switch_of = np.full(size, -1, dtype=np.int32)
        port_of = np.zeros(size, dtype=np.int32)
        switch_of[self.switch_lids] = np.arange(self.n_switches, dtype=np.int32)
        switch_of[self.ep_lids] = self.ep_switch
        port_of[self.ep_lids] = self.ep_switch_port
        return switch_of, port_of

    @cached_property
    def switch_channels(self) -> tuple[npt.NDArray[np.intp], int]:
        """Ids 0..n-1 of the directed switch-to-switch channels, as ids[s, p] for the channel leaving switch
        s on port p; n marks ports without one.  Shared by the engines, the deadlock check and quality."""
        is_link = self.nbr >= 0
        count = int(is_link.sum())
        ids = np.full(self.nbr.shape, count, dtype=np.intp)
        ids[is_link] = np.arange(count)
        return ids, count

    def lid_target(self, lid: int) -> tuple[int, int]:
        """(switch the LID hangs off or is, port it is delivered on there: 0 for the switch itself)."""
        switch_of, port_of = self._lid_lookup
        if not 0 < lid < switch_of.size or switch_of[lid] < 0:
            raise KeyError(f"LID {lid} is not assigned")
        return int(switch_of[lid]), int(port_of[lid])

    @cached_property
    def links_between_switches(self) -> int:
        return int((self.nbr >= 0).sum()) // 2

    def endpoint_index(self, node: str, port: int = 0) -> int:
        lid = self.lids.lid(node, port)
        found = np.flatnonzero(self.ep_lids == lid)
        if found.size == 0:
            raise KeyError(f"{node} is not a host")
        return int(found[0])


@dataclass(frozen=True, eq=False)
class Renumbering:
    """Each switch of a subnet at its row in an earlier one (`Subnet.renumbering`)."""

    #: old_of[s]: switch s's row before, -1 where it was not there.
    old_of: npt.NDArray[np.intp]
    #: The same switches at the same rows: arrays line up without being gathered (a cable cut).
    identity: bool

    @property
    def complete(self) -> bool:
        """Every switch was there before."""
        return bool((self.old_of >= 0).all())

    def rows(self, before: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """`before` (rows in the old numbering) in the new one; every switch must have been there."""
        return before if self.identity else before[self.old_of]

    def grid(self, before: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """A [switch, switch, ...] array of the old numbering in the new one."""
        return before if self.identity else before[np.ix_(self.old_of, self.old_of)]


__all__ = ["INF", "NO_PORT", "Renumbering", "Subnet"]
