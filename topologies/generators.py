"""Generators for the fabrics AI clusters are built from.

Every generator is deterministic: the same parameters give the same names, GUIDs, port numbers and node
order, so a generated fabric can be regenerated instead of stored.  Names are 1-based and global (`h1`,
`leaf1`, `agg1`, `core1`, `spine1`) so that hosts are addressed the same way on every fabric.

Port conventions (documented because cabling plans and OpenSM dumps refer to them):

* fat-tree (k-ary, 3 tiers): a leaf (edge) switch uses ports 1..k/2 for hosts and k/2+1..k for the
  aggregation switches of its pod; an aggregation switch uses 1..k/2 for the leaves of its pod and k/2+1..k
  for its core group; a core switch uses port p+1 for pod p.  This is the usual cabling of a k-ary fat-tree
  (and that of the OpenSM reference fabric).
* leaf-spine: leaf ports 1..H for hosts, then for each spine its parallel links in turn; spine port
  (leaf index x parallel) + i + 1.
* opensm-fat-tree: the same k-ary 3-tree cabled the way OpenSM's own test generator (`gen_net.py fattree3`)
  writes it, as in `/work/shared/reference/opensm-ft3-k16` (names `hN_pPeE`, `edge_pP_E`, `agg_pP_A`, `coreC`;
  GUIDs 0x0002c9 | index bytes little-endian | 00 for CAs, 02 for switches; the first CA, then every switch,
  then the other CAs).  Its port numbering happens to equal the fat-tree's above, but names, GUIDs and node
  order do not: a fabric fabriclab did not lay out itself, for benchmarks and tests.
* rail: a server has G network adapters (one host node per NIC, `server` set), NIC i of every server in a
  group is cabled to rail leaf i of that group on port (server index in group + 1); leaf uplinks follow, one
  block of parallel links per spine; every leaf of every group reaches every spine (DGX SuperPOD style, one
  shared spine layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from topologies.direct import MAX_GENERATED_HOSTS, dragonfly, random_regular, torus
from topologies.errors import TopologyError
from topologies.model import MAX_PORTS, Fabric, Link, Node, NodeKind, PortRef, make_guid

DEFAULT_BW_GBPS = 400.0
#: MAX_GENERATED_HOSTS: a k=64 fat-tree (65,536 hosts, a 13 MB file) takes half a minute to load; k=254
#: would build 4 million hosts for minutes and gigabytes.  Leaf-spine and rail fabrics stay below it
#: through the radix limit; direct topologies (torus, dragonfly, random-regular) check it first.


class _Builder:
    """Collects nodes and links in order; hands out GUIDs per kind in creation order."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        self._count = {NodeKind.HOST: 0, NodeKind.SWITCH: 0}

    def add(self, name: str, kind: NodeKind, ports: int, **attrs: Any) -> str:
        index = self._count[kind]
        self._count[kind] += 1
        self.nodes[name] = Node(name=name, kind=kind, guid=make_guid(kind, index), ports=ports, **attrs)
        return name

    def link(self, a: str, pa: int, b: str, pb: int, bw_gbps: float) -> None:
        self.links.append(Link(PortRef(a, pa), PortRef(b, pb), bw_gbps))

    def build(self, name: str, description: str, meta: Mapping[str, Any]) -> Fabric:
        # Hosts first, then switches: LIDs are handed out in this order, like OpenSM does on such fabrics.
        ordered = {n: v for n, v in self.nodes.items() if v.is_host}
        ordered.update({n: v for n, v in self.nodes.items() if v.is_switch})
        return Fabric(name=name, nodes=ordered, links=tuple(self.links), description=description, meta=meta)


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise TopologyError(message, field=field)


def _positive(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _check_radix(ports: int, what: str, parts: str = "") -> None:
    """`parts` says which parameters add up to the ports, so the error names what to change."""
    of = f"{parts}, " if parts else ""
    _require(ports <= MAX_PORTS, "generator", f"{what} would need {ports} ports ({of}at most {MAX_PORTS})")


def fat_tree(k: int, bw_gbps: float = DEFAULT_BW_GBPS) -> Fabric:
    """3-tier k-ary fat-tree: k pods of k/2 leaves and k/2 aggregation switches, (k/2)^2 cores, k^3/4 hosts.
    Full bisection bandwidth."""
    _require(
        isinstance(k, int) and k >= 2 and k % 2 == 0,
        "generator.k",
        f"k must be an even integer >= 2, got {k}",
    )
    _require(_positive(bw_gbps), "generator.bw_gbps", f"bw_gbps must be a finite number > 0, got {bw_gbps}")
    _check_radix(k, f"a k={k} fat-tree")
    _require(
        k**3 // 4 <= MAX_GENERATED_HOSTS,
        "generator.k",
        f"a k={k} fat-tree has {k**3 // 4:,} hosts (at most {MAX_GENERATED_HOSTS:,}: k <= 64)",
    )
    half = k // 2
    b = _Builder()
    hosts_per_pod = half * half
    for host in range(k * hosts_per_pod):
        b.add(f"h{host + 1}", NodeKind.HOST, 1, pod=host // hosts_per_pod)
    for pod in range(k):
        for e in range(half):
            b.add(f"leaf{pod * half + e + 1}", NodeKind.SWITCH, k, tier=0, pod=pod)
    for pod in range(k):
        for a in range(half):
            b.add(f"agg{pod * half + a + 1}", NodeKind.SWITCH, k, tier=1, pod=pod)
    for c in range(half * half):
        b.add(f"core{c + 1}", NodeKind.SWITCH, k, tier=2, group=c // half)
    for host in range(k * hosts_per_pod):
        leaf, port = divmod(host, half)
        b.link(f"h{host + 1}", 1, f"leaf{leaf + 1}", port + 1, bw_gbps)
    for pod in range(k):
        for e in range(half):
            for a in range(half):
                b.link(f"leaf{pod * half + e + 1}", half + a + 1, f"agg{pod * half + a + 1}", e + 1, bw_gbps)
    for pod in range(k):
        for a in range(half):
            for i in range(half):
                core = a * half + i
                b.link(f"agg{pod * half + a + 1}", half + i + 1, f"core{core + 1}", pod + 1, bw_gbps)
    return b.build(
        f"fat-tree-k{k}",
        f"3-tier k={k} fat-tree ({5 * k * k // 4} switches, {k**3 // 4} hosts)",
        {"generator": {"kind": "fat-tree", "k": k, "bw_gbps": bw_gbps}},
    )


#: OUI of the GUIDs OpenSM's test generator hands out (Mellanox's 0x0002c9).
_OPENSM_OUI = 0x0002C9 << 40


def _opensm_guid(index: int, kind: int) -> int:
    """GUID as OpenSM's test generator numbers nodes: the index in the 3rd and 4th bytes, low byte first."""
    return _OPENSM_OUI | (index & 0xFF) << 24 | ((index >> 8) & 0xFF) << 16 | kind


def opensm_fat_tree(k: int, bw_gbps: float = DEFAULT_BW_GBPS) -> Fabric:
    """3-tier k-ary fat-tree in the layout of OpenSM's test generator (see the module docstring).

    Byte for byte, `dump_ibnet` of `opensm_fat_tree(16)` is the reference fabric.net (apart from comments).
    """
    _require(
        isinstance(k, int) and k >= 2 and k % 2 == 0,
        "generator.k",
        f"k must be an even integer >= 2, got {k}",
    )
    _require(bw_gbps > 0, "generator.bw_gbps", f"bw_gbps must be positive, got {bw_gbps}")
    _check_radix(k, f"a k={k} fat-tree")
    half = k // 2
    hosts = k * half * half
    _require(hosts < 1 << 16, "generator.k", f"k={k} needs more hosts than the GUID layout numbers")
    nodes: dict[str, Node] = {}
    links: list[Link] = []

    def host(n: int) -> str:
        pod, rest = divmod(n, half * half)
        return f"h{n}_p{pod}e{rest // half}"

    def add_host(n: int) -> None:
        nodes[host(n)] = Node(host(n), NodeKind.HOST, _opensm_guid(n, 0), 1, pod=n // (half * half))

    add_host(0)  # the generator writes the first CA (where the SM runs) before the switches
    for pod in range(k):
        for e in range(half):
            name = f"edge_p{pod}_{e}"
            nodes[name] = Node(name, NodeKind.SWITCH, _opensm_guid(pod * half + e, 2), k, tier=0, pod=pod)
    for pod in range(k):
        for a in range(half):
            name = f"agg_p{pod}_{a}"
            index = k * half + pod * half + a
            nodes[name] = Node(name, NodeKind.SWITCH, _opensm_guid(index, 2), k, tier=1, pod=pod)
    for c in range(half * half):
        nodes[f"core{c}"] = Node(
            f"core{c}", NodeKind.SWITCH, _opensm_guid(2 * k * half + c, 2), k, tier=2, group=c // half
        )
    for n in range(1, hosts):
        add_host(n)
    for n in range(hosts):
        edge, port = divmod(n, half)
        links.append(
            Link(PortRef(host(n), 1), PortRef(f"edge_p{edge // half}_{edge % half}", port + 1), bw_gbps)
        )
    for pod in range(k):
        for e in range(half):
            for a in range(half):
                links.append(
                    Link(
                        PortRef(f"edge_p{pod}_{e}", half + a + 1), PortRef(f"agg_p{pod}_{a}", e + 1), bw_gbps
                    )
                )
        for a in range(half):
            for i in range(half):
                links.append(
                    Link(
                        PortRef(f"agg_p{pod}_{a}", half + i + 1),
                        PortRef(f"core{a * half + i}", pod + 1),
                        bw_gbps,
                    )
                )
    return Fabric(
        f"opensm-fat-tree-k{k}",
        nodes,
        tuple(links),
        description=f"3-tier k={k} fat-tree in OpenSM's test-generator layout",
        meta={"generator": {"kind": "opensm-fat-tree", "k": k, "bw_gbps": bw_gbps}},
    )


def leaf_spine(
    leaves: int,
    spines: int,
    hosts_per_leaf: int,
    parallel: int = 1,
    bw_gbps: float = DEFAULT_BW_GBPS,
    uplink_bw_gbps: float | None = None,
) -> Fabric:
    """2-tier leaf-spine (folded Clos).  Oversubscription = host bandwidth / uplink bandwidth per leaf."""
    up_bw = bw_gbps if uplink_bw_gbps is None else uplink_bw_gbps
    _require(leaves >= 1, "generator.leaves", f"leaves must be >= 1, got {leaves}")
    _require(spines >= 1, "generator.spines", f"spines must be >= 1, got {spines}")
    _require(
        hosts_per_leaf >= 1, "generator.hosts_per_leaf", f"hosts_per_leaf must be >= 1, got {hosts_per_leaf}"
    )
    _require(parallel >= 1, "generator.parallel", f"parallel must be >= 1, got {parallel}")
    _require(_positive(bw_gbps), "generator.bw_gbps", f"bw_gbps must be a finite number > 0, got {bw_gbps}")
    _require(
        _positive(up_bw),
        "generator.uplink_bw_gbps",
        f"uplink_bw_gbps must be a finite number > 0, got {up_bw}",
    )
    leaf_ports = hosts_per_leaf + spines * parallel
    spine_ports = leaves * parallel
    _check_radix(leaf_ports, "a leaf", "hosts_per_leaf + spines x parallel")
    _check_radix(spine_ports, "a spine", "leaves x parallel")
    b = _Builder()
    for h in range(leaves * hosts_per_leaf):
        b.add(f"h{h + 1}", NodeKind.HOST, 1)
    for leaf in range(leaves):
        b.add(f"leaf{leaf + 1}", NodeKind.SWITCH, leaf_ports, tier=0)
    for spine in range(spines):
        b.add(f"spine{spine + 1}", NodeKind.SWITCH, spine_ports, tier=1)
    for h in range(leaves * hosts_per_leaf):
        leaf, port = divmod(h, hosts_per_leaf)
        b.link(f"h{h + 1}", 1, f"leaf{leaf + 1}", port + 1, bw_gbps)
    for leaf in range(leaves):
        for spine in range(spines):
            for i in range(parallel):
                b.link(
                    f"leaf{leaf + 1}",
                    hosts_per_leaf + spine * parallel + i + 1,
                    f"spine{spine + 1}",
                    leaf * parallel + i + 1,
                    up_bw,
                )
    ratio = (hosts_per_leaf * bw_gbps) / (spines * parallel * up_bw)
    return b.build(
        f"leaf-spine-{leaves}x{spines}",
        f"2-tier leaf-spine: {leaves} leaves x {hosts_per_leaf} hosts, {spines} spines x {parallel} links, "
        f"oversubscription {ratio:g}:1",
        {
            "generator": {
                "kind": "leaf-spine",
                "leaves": leaves,
                "spines": spines,
                "hosts_per_leaf": hosts_per_leaf,
                "parallel": parallel,
                "bw_gbps": bw_gbps,
                "uplink_bw_gbps": up_bw,
            },
            "oversubscription": ratio,
        },
    )


def rail(
    servers: int,
    gpus: int = 8,
    groups: int = 1,
    spines: int | None = None,
    parallel: int | None = None,
    bw_gbps: float = DEFAULT_BW_GBPS,
) -> Fabric:
    """Rail-optimised fabric (DGX SuperPOD style).

    Each group (scalable unit) has `servers` servers with `gpus` NICs each and `gpus` rail leaves; NIC i of
    every server of the group is on rail leaf i, so same-rank GPUs of different servers are one hop apart.
    All leaves connect to one shared spine layer.  By default the uplinks match the downlinks (1:1): `spines`
    defaults to `servers` with one link each; give `spines` and `parallel` to build something else.
    """
    _require(servers >= 1, "generator.servers", f"servers must be >= 1, got {servers}")
    _require(gpus >= 1, "generator.gpus", f"gpus must be >= 1, got {gpus}")
    _require(groups >= 1, "generator.groups", f"groups must be >= 1, got {groups}")
    _require(_positive(bw_gbps), "generator.bw_gbps", f"bw_gbps must be a finite number > 0, got {bw_gbps}")
    if spines is None and parallel is None:
        spines, parallel = servers, 1
    elif spines is None:
        assert parallel is not None
        _require(parallel >= 1, "generator.parallel", f"parallel must be >= 1, got {parallel}")
        _require(
            servers % parallel == 0,
            "generator.parallel",
            f"parallel={parallel} does not divide servers={servers}; give spines explicitly",
        )
        spines = servers // parallel
    elif parallel is None:
        parallel = 1
    _require(spines >= 1, "generator.spines", f"spines must be >= 1, got {spines}")
    _require(parallel >= 1, "generator.parallel", f"parallel must be >= 1, got {parallel}")
    leaf_ports = servers + spines * parallel
    leaves = groups * gpus
    spine_ports = leaves * parallel
    _check_radix(leaf_ports, "a rail leaf", "servers + spines x parallel")
    _check_radix(spine_ports, "a spine", "groups x gpus x parallel")
    b = _Builder()
    for g in range(groups):
        for s in range(servers):
            server = g * servers + s
            for i in range(gpus):
                b.add(
                    f"h{server * gpus + i + 1}",
                    NodeKind.HOST,
                    1,
                    rail=i,
                    group=g,
                    server=f"srv{server + 1}",
                )
    for g in range(groups):
        for i in range(gpus):
            b.add(f"leaf{g * gpus + i + 1}", NodeKind.SWITCH, leaf_ports, tier=0, rail=i, group=g)
    for sp in range(spines):
        b.add(f"spine{sp + 1}", NodeKind.SWITCH, spine_ports, tier=1)
    for g in range(groups):
        for s in range(servers):
            server = g * servers + s
            for i in range(gpus):
                b.link(f"h{server * gpus + i + 1}", 1, f"leaf{g * gpus + i + 1}", s + 1, bw_gbps)
    for leaf in range(leaves):
        for sp in range(spines):
            for j in range(parallel):
                b.link(
                    f"leaf{leaf + 1}",
                    servers + sp * parallel + j + 1,
                    f"spine{sp + 1}",
                    leaf * parallel + j + 1,
                    bw_gbps,
                )
    ratio = servers / (spines * parallel)
    return b.build(
        f"rail-{groups}x{servers}x{gpus}",
        f"rail-optimised fabric: {groups} group(s) x {servers} servers x {gpus} GPUs, "
        f"{leaves} rail leaves, {spines} spines x {parallel} links, oversubscription {ratio:g}:1",
        {
            "generator": {
                "kind": "rail",
                "servers": servers,
                "gpus": gpus,
                "groups": groups,
                "spines": spines,
                "parallel": parallel,
                "bw_gbps": bw_gbps,
            },
            "oversubscription": ratio,
        },
    )


#: Generator registry: kind -> function.  The YAML `generator:` block and the CLI both dispatch through it.
GENERATORS: dict[str, Callable[..., Fabric]] = {
    "fat-tree": fat_tree,
    "opensm-fat-tree": opensm_fat_tree,
    "leaf-spine": leaf_spine,
    "rail": rail,
    "torus": torus,
    "dragonfly": dragonfly,
    "random-regular": random_regular,
}


def generate(kind: str, **params: Any) -> Fabric:
    try:
        function = GENERATORS[kind]
    except KeyError:
        raise TopologyError(
            f"unknown generator {kind!r} (choose from {', '.join(GENERATORS)})", field="generator.kind"
        ) from None
    fabric: Fabric = function(**params)
    return fabric


__all__ = ["GENERATORS", "fat_tree", "generate", "leaf_spine", "opensm_fat_tree", "rail"]
