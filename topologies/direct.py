"""Direct networks (every switch has hosts) for the general engines: torus, dragonfly, random regular.

Fat-tree routing does not apply to them (switches with hosts are cabled to each other), shortest paths on
them close channel-dependency cycles, and they are the fabrics OpenSM's sssp/dfsssp, torus-2QoS and lash
exist for.  Deterministic like the other generators; names `s<i>` (torus: `s<x>_<y>`), hosts `h1..hN`
numbered switch by switch, hosts on ports 1..H of their switch, switch-to-switch cables after them.

* torus: a 2-D grid with wrap-around links, ports H+1/H+2 for +x/-x and H+3/H+4 for +y/-y;
* dragonfly (Kim et al.): `groups` groups of `routers` routers, all-to-all inside a group (local ports
  H+1..H+routers-1 in order of the peer's index), `globals_per_router` global ports each (after the local
  ones), global link t of a group (router t // h, port t % h) going to the t-th other group;
  `groups` <= routers * globals_per_router + 1 (the balanced maximum);
* random regular: `switches` switches of switch degree `degree`, a seeded random regular graph (networkx),
  redrawn with the next seed until connected; ports in order of the peer's index.
"""

from __future__ import annotations

from topologies.errors import TopologyError
from topologies.model import MAX_PORTS, Fabric, Link, Node, NodeKind, PortRef, make_guid

DEFAULT_BW_GBPS = 400.0


#: The generators' size limit (a k=64 fat-tree's host count); `topologies.generators` shares it.
MAX_GENERATED_HOSTS = 65_536


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise TopologyError(message, field=field)


def _require_size(switches: int, hosts_per_switch: int, field: str) -> None:
    """Refuse at once (not after minutes of building) a fabric over the generators' size limit."""
    _require(hosts_per_switch >= 1, "generator.hosts_per_switch", "hosts_per_switch must be >= 1")
    _require(
        switches * hosts_per_switch <= MAX_GENERATED_HOSTS and switches <= MAX_GENERATED_HOSTS,
        field,
        f"{switches:,} switches with {hosts_per_switch} host(s) each: more than the generators' limit of "
        f"{MAX_GENERATED_HOSTS:,} hosts",
    )


class _Direct:
    """Switches with H hosts each, hosts numbered switch by switch."""

    def __init__(self, names: list[str], hosts_per_switch: int, ports: int, bw_gbps: float) -> None:
        _require(hosts_per_switch >= 1, "generator.hosts_per_switch", "hosts_per_switch must be >= 1")
        _require(bw_gbps > 0, "generator.bw_gbps", f"bw_gbps must be positive, got {bw_gbps}")
        _require(ports <= MAX_PORTS, "generator", f"a switch would need {ports} ports (at most {MAX_PORTS})")
        self.h = hosts_per_switch
        self.bw = bw_gbps
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        for i in range(len(names) * hosts_per_switch):
            self.nodes[f"h{i + 1}"] = Node(f"h{i + 1}", NodeKind.HOST, make_guid(NodeKind.HOST, i), 1)
        for i, name in enumerate(names):
            self.nodes[name] = Node(name, NodeKind.SWITCH, make_guid(NodeKind.SWITCH, i), ports)
            for j in range(hosts_per_switch):
                host = f"h{i * hosts_per_switch + j + 1}"
                self.links.append(Link(PortRef(host, 1), PortRef(name, j + 1), bw_gbps))

    def cable(self, a: str, pa: int, b: str, pb: int) -> None:
        self.links.append(Link(PortRef(a, self.h + pa), PortRef(b, self.h + pb), self.bw))

    def build(self, name: str, description: str, meta: dict[str, object]) -> Fabric:
        return Fabric(name, self.nodes, tuple(self.links), description=description, meta={"generator": meta})


def torus(x: int, y: int, hosts_per_switch: int = 1, bw_gbps: float = DEFAULT_BW_GBPS, z: int = 1) -> Fabric:
    """2-D torus of x * y switches, or 3-D of x * y * z with `z` >= 3 (`z` = 1: 2-D, names unchanged)."""
    _require(x >= 3 and y >= 3, "generator.x", f"a torus needs at least 3 switches per ring, got {x}x{y}")
    _require(z == 1 or z >= 3, "generator.z", f"a 3-D torus needs at least 3 switches per ring, got z={z}")
    _require_size(x * y * z, hosts_per_switch, "generator.x")
    if z == 1:
        names = [f"s{i}_{j}" for j in range(y) for i in range(x)]
        b = _Direct(names, hosts_per_switch, hosts_per_switch + 4, bw_gbps)
        for j in range(y):
            for i in range(x):
                b.cable(f"s{i}_{j}", 1, f"s{(i + 1) % x}_{j}", 2)
                b.cable(f"s{i}_{j}", 3, f"s{i}_{(j + 1) % y}", 4)
        params = {"kind": "torus", "x": x, "y": y, "hosts_per_switch": hosts_per_switch, "bw_gbps": bw_gbps}
        return b.build(f"torus-{x}x{y}", f"2-D torus {x}x{y}, {hosts_per_switch} host(s) per switch", params)
    names = [f"s{i}_{j}_{k}" for k in range(z) for j in range(y) for i in range(x)]
    b = _Direct(names, hosts_per_switch, hosts_per_switch + 6, bw_gbps)
    for k in range(z):  # ports +1/+2 along x, +3/+4 along y, +5/+6 along z (out, in)
        for j in range(y):
            for i in range(x):
                b.cable(f"s{i}_{j}_{k}", 1, f"s{(i + 1) % x}_{j}_{k}", 2)
                b.cable(f"s{i}_{j}_{k}", 3, f"s{i}_{(j + 1) % y}_{k}", 4)
                b.cable(f"s{i}_{j}_{k}", 5, f"s{i}_{j}_{(k + 1) % z}", 6)
    params = {
        "kind": "torus",
        "x": x,
        "y": y,
        "z": z,
        "hosts_per_switch": hosts_per_switch,
        "bw_gbps": bw_gbps,
    }
    return b.build(
        f"torus-{x}x{y}x{z}", f"3-D torus {x}x{y}x{z}, {hosts_per_switch} host(s) per switch", params
    )


def dragonfly(
    groups: int,
    routers: int,
    globals_per_router: int,
    hosts_per_switch: int = 1,
    bw_gbps: float = DEFAULT_BW_GBPS,
) -> Fabric:
    """Dragonfly: groups of fully connected routers, one global link between every pair of groups."""
    a, h = routers, globals_per_router
    _require(a >= 2, "generator.routers", f"routers must be >= 2, got {a}")
    _require(h >= 1, "generator.globals_per_router", f"globals_per_router must be >= 1, got {h}")
    _require(
        2 <= groups <= a * h + 1,
        "generator.groups",
        f"groups must be 2..{a * h + 1} (routers x globals_per_router + 1), got {groups}",
    )
    _require_size(groups * a, hosts_per_switch, "generator.groups")
    names = [f"s{g * a + r}" for g in range(groups) for r in range(a)]
    b = _Direct(names, hosts_per_switch, hosts_per_switch + a - 1 + h, bw_gbps)
    for g in range(groups):
        for r in range(a):
            for q in range(r + 1, a):
                b.cable(f"s{g * a + r}", q, f"s{g * a + q}", r + 1)
    for g in range(groups):
        for d in range(g + 1, groups):
            t = d - 1  # group d is g's (d-1)-th other group
            u = g  # and g is d's g-th
            b.cable(f"s{g * a + t // h}", a + t % h, f"s{d * a + u // h}", a + u % h)
    params = {
        "kind": "dragonfly",
        "groups": groups,
        "routers": routers,
        "globals_per_router": globals_per_router,
        "hosts_per_switch": hosts_per_switch,
        "bw_gbps": bw_gbps,
    }
    return b.build(
        f"dragonfly-{groups}x{routers}",
        f"dragonfly: {groups} groups of {routers} routers, {h} global link(s) per router",
        params,
    )


def random_regular(
    switches: int, degree: int, hosts_per_switch: int = 1, seed: int = 0, bw_gbps: float = DEFAULT_BW_GBPS
) -> Fabric:
    """Connected random `degree`-regular graph of switches (Jellyfish-like), seeded."""
    import networkx as nx  # noqa: PLC0415 - only this generator needs it

    _require(switches >= 3, "generator.switches", f"switches must be >= 3, got {switches}")
    _require_size(switches, hosts_per_switch, "generator.switches")
    _require(
        2 <= degree < switches and switches * degree % 2 == 0,
        "generator.degree",
        f"degree must be 2..{switches - 1} with switches x degree even, got {degree}",
    )
    attempt = seed
    while True:
        graph = nx.random_regular_graph(degree, switches, seed=attempt)
        if nx.is_connected(graph):
            break
        attempt += 1
    names = [f"s{i}" for i in range(switches)]
    b = _Direct(names, hosts_per_switch, hosts_per_switch + degree, bw_gbps)
    port = {i: {q: k + 1 for k, q in enumerate(sorted(graph.neighbors(i)))} for i in range(switches)}
    for i, q in sorted((min(e), max(e)) for e in graph.edges()):
        b.cable(f"s{i}", port[i][q], f"s{q}", port[q][i])
    params = {
        "kind": "random-regular",
        "switches": switches,
        "degree": degree,
        "hosts_per_switch": hosts_per_switch,
        "seed": seed,
        "bw_gbps": bw_gbps,
    }
    return b.build(
        f"random-regular-{switches}x{degree}", f"random {degree}-regular graph of {switches} switches", params
    )


__all__ = ["dragonfly", "random_regular", "torus"]
