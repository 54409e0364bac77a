"""The fabric as the simulator sees it: directed links with capacities, and the controller's routing.

Every cable is two directed links (one per direction), numbered once for the whole, healthy fabric so that
routes computed on a degraded copy (after a fault the controller routes a fabric without the dead link or
switch) land on the same link ids.  Routing is the controller's own: `Subnet.build` + an engine from the
registry, giving the LFT (`static`) and the equal-cost alternatives (`ecmp`, `spray`, `adaptive`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from controller.sm.engines import default_registry
from controller.sm.lids import LidMap, assign_lids
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from topologies.errors import InputError
from topologies.model import Fabric, PortRef
from topologies.scale import Scale

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]


class SimInputError(InputError):
    """Input the simulator cannot use (unknown host, bad workload): one line naming the field, exit 2."""

    def __init__(self, message: str, field: str | None = None, **where: Any) -> None:
        super().__init__(message, field=field, **where)


@dataclass(frozen=True, eq=False)
class Network:
    """Directed links of the healthy fabric.

    Link ids: `link_of[s, p]` is the link leaving switch s on port p (toward a switch or a host);
    `host_up[e]` the link from host endpoint e into its switch.  `fabric_link` marks switch-to-switch links,
    which are the ones utilisation figures are about (host links are set by the workload, not the routing).
    """

    fabric: Fabric
    subnet: Subnet
    link_of: I32
    host_up: I32
    cap_gbps: F64
    fabric_link: Bool
    #: For every link: (node, port) it leaves from, and (node, port) it arrives at.
    tail: tuple[PortRef, ...]
    head: tuple[PortRef, ...]
    #: Emulated / real speed: the scenario's `scale` (1.0: real speeds).
    speed_factor: float = 1.0
    scale: str | None = None

    @classmethod
    def build(cls, fabric: Fabric, scale: Scale | None = None) -> Network:
        """Every cable as two directed links; at the scenario's scale when given (the speeds the emulator
        shapes its links to), else at the topology's real speeds."""
        subnet = Subnet.build(fabric)
        link_of = np.full(subnet.nbr.shape, -1, dtype=np.int32)
        caps: list[float] = []
        fabric_link: list[bool] = []
        tail: list[PortRef] = []
        head: list[PortRef] = []
        for s, name in enumerate(subnet.switch_names):
            for p in range(1, subnet.n_ports):
                far = int(subnet.nbr[s, p])
                ep = int(subnet.host_ep[s, p])
                if far < 0 and ep < 0:
                    continue
                link_of[s, p] = len(caps)
                caps.append(float(subnet.bw_gbps[s, p]))
                fabric_link.append(far >= 0)
                tail.append(PortRef(name, p))
                if far >= 0:
                    head.append(PortRef(subnet.switch_names[far], int(subnet.nbr_port[s, p])))
                else:
                    endpoint = subnet.endpoints[ep]
                    head.append(PortRef(endpoint.node, endpoint.port))
        host_up = np.empty(len(subnet.endpoints), dtype=np.int32)
        for e, endpoint in enumerate(subnet.endpoints):
            host_up[e] = len(caps)
            caps.append(float(subnet.ep_bw_gbps[e]))
            fabric_link.append(False)
            tail.append(PortRef(endpoint.node, endpoint.port))
            head.append(PortRef(subnet.switch_names[subnet.ep_switch[e]], int(subnet.ep_switch_port[e])))
        factor = scale.emulated_gbps / scale.real_gbps if scale is not None else 1.0
        return cls(
            fabric=fabric,
            subnet=subnet,
            link_of=link_of,
            host_up=host_up,
            cap_gbps=np.array(caps, dtype=np.float64) * factor,
            fabric_link=np.array(fabric_link, dtype=bool),
            tail=tuple(tail),
            head=tuple(head),
            speed_factor=factor,
            scale=str(scale) if scale is not None else None,
        )

    @property
    def link_speeds(self) -> str:
        return f"scaled {self.scale} (as the emulator shapes them)" if self.scale else "real (no scaling)"

    @cached_property
    def nic_gbps(self) -> F64:
        """Every host endpoint's NIC speed, scaled as the links are."""
        return self.subnet.ep_bw_gbps * self.speed_factor

    @cached_property
    def switch_egress(self) -> Bool:
        """Links that leave a switch (its output queue is where a saturated link's packets wait)."""
        out = np.zeros(self.n_links, dtype=bool)
        out[: int(self.host_up.min()) if self.host_up.size else self.n_links] = True
        return out

    @property
    def n_links(self) -> int:
        return int(self.cap_gbps.size)

    @property
    def n_hosts(self) -> int:
        return len(self.subnet.endpoints)

    @cached_property
    def host_index(self) -> dict[str, int]:
        """Host name -> endpoint index (a host's first connected port, as the SM addresses it)."""
        index: dict[str, int] = {}
        for e, endpoint in enumerate(self.subnet.endpoints):
            index.setdefault(endpoint.node, e)
        return index

    @cached_property
    def host_down(self) -> I32:
        """Link from the switch into host endpoint e."""
        sub = self.subnet
        return self.link_of[sub.ep_switch, sub.ep_switch_port].astype(np.int32)

    @cached_property
    def leaf_of(self) -> I32:
        """Switch each host endpoint hangs off (its "leaf", whatever the fabric calls it)."""
        return self.subnet.ep_switch.astype(np.int32)

    def hosts(self, names: Iterable[str], field: str = "hosts") -> I32:
        """Endpoint indices of host names; an unknown name is a `SimInputError` naming it."""
        out = []
        index = self.host_index
        for name in names:
            e = index.get(name)
            if e is None:
                raise SimInputError(f"unknown host {name!r} (the fabric has {len(index)} hosts)", field)
            out.append(e)
        return np.array(out, dtype=np.int32)

    def link_name(self, link: int) -> str:
        return f"{self.tail[link]}->{self.head[link]}"


@dataclass(frozen=True, eq=False)
class Routing:
    """The controller's tables for the fabric as it is now (healthy or degraded), in full-fabric ids.

    `sw_map[s]` is the healthy-fabric index of switch s of the (possibly degraded) subnet the tables were
    computed for; `ep_map[e]` likewise for host endpoints (-1 where a host is gone).
    """

    network: Network
    tables: RoutingTables
    sw_map: I32
    ep_local: I32
    #: link_of in full-fabric link ids, indexed by the degraded subnet's (switch, port).
    link_of: I32

    @property
    def subnet(self) -> Subnet:
        return self.tables.subnet

    def reachable(self, src: I32, dst: I32) -> Bool:
        """Both endpoints still attached (a host behind a dead switch is cut off until it comes back)."""
        return (self.ep_local[src] >= 0) & (self.ep_local[dst] >= 0)


def route_fabric(
    network: Network,
    engine: str,
    down_links: Iterable[int] = (),
    down_switches: Iterable[str] = (),
    lids: LidMap | None = None,
) -> Routing:
    """The controller's tables for the fabric minus failed cables (fabric link indices) and switches.

    LIDs are carried over from the healthy fabric, as the SM keeps them across re-sweeps."""
    fabric = network.fabric
    dead_links = set(down_links)
    dead_switches = set(down_switches)
    full = network.subnet
    if dead_links or dead_switches:
        degraded = fabric.without(links=dead_links, nodes=dead_switches)
        degraded = _drop_isolated_hosts(degraded)
        subnet = Subnet.build(degraded, assign_lids(degraded, lids or full.lids))
    else:
        subnet = full
    tables = default_registry().create(engine).route(subnet)
    sw_map = np.array([full.switch_index[name] for name in subnet.switch_names], dtype=np.int32)
    ep_local = np.full(len(full.endpoints), -1, dtype=np.int32)
    full_ep = {(e.node, e.port): i for i, e in enumerate(full.endpoints)}
    for i, endpoint in enumerate(subnet.endpoints):
        ep_local[full_ep[(endpoint.node, endpoint.port)]] = i
    link_of = network.link_of[sw_map][:, : subnet.n_ports]
    if link_of.shape[1] < subnet.n_ports:  # pragma: no cover - degraded fabrics never grow ports
        raise AssertionError("degraded subnet has more ports than the fabric")
    return Routing(network, tables, sw_map, ep_local, np.ascontiguousarray(link_of))


def _drop_isolated_hosts(fabric: Fabric) -> Fabric:
    """Hosts whose only cable went with a dead switch drop out (an SM sweep would not see them)."""
    cabled = {ref.node for link in fabric.links for ref in (link.a, link.b)}
    lonely = [h.name for h in fabric.hosts if h.name not in cabled]
    return fabric.without(nodes=lonely) if lonely else fabric


def fabric_link_index(fabric: Fabric, node: str, port: int) -> int:
    """Index in `fabric.links` of the cable on node:port (the scenario names faults by port)."""
    entry = fabric.port_map.get(PortRef(node, port))
    if entry is None:
        raise SimInputError(f"{node}:{port} is not a cabled port", "port")
    return entry[0]


__all__ = [
    "Network",
    "Routing",
    "SimInputError",
    "fabric_link_index",
    "route_fabric",
]
