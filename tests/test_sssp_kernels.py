"""sssp's two forms of the balancing loop make the same tables, and DFSSSP's incremental cycle breaking makes
the same layers as peeling every layer's graph from scratch after every move.

Both are speed changes that must not change a single entry: the references here are the vector loop
(`scalar_up_to = -1`) and a plain from-scratch form of DFSSSP's layering written for this test.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from controller.sm.cdg import acyclic_core, assign_layers, find_cycles, layer_cycles, path_dependencies
from controller.sm.engines.minhop import MinHopEngine
from controller.sm.engines.sssp import DfssspEngine, SsspEngine, _candidates_per_level
from controller.sm.paths import hop_distances
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from topologies.direct import dragonfly, random_regular, torus
from topologies.faults import SwitchFailures, degrade
from topologies.generators import fat_tree, opensm_fat_tree
from topologies.ibnet import dump_ibnet, parse_ibnet
from topologies.model import Fabric
from topologies.relabel import relabel

FABRICS: dict[str, Callable[[], Fabric]] = {
    "torus6x6": lambda: torus(6, 6, hosts_per_switch=2),
    "torus5x3": lambda: torus(5, 3, hosts_per_switch=1),
    "torus3x3x3": lambda: torus(3, 3, hosts_per_switch=1, z=3),
    "dragonfly9x4": lambda: dragonfly(9, 4, 2, hosts_per_switch=2),
    "dragonfly4x3": lambda: dragonfly(4, 3, 1, hosts_per_switch=1),
    "rr32x4-s2": lambda: random_regular(32, 4, hosts_per_switch=2, seed=2),
    "rr40x5-s3": lambda: random_regular(40, 5, hosts_per_switch=2, seed=3),
    "rr48x4-s4": lambda: random_regular(48, 4, hosts_per_switch=1, seed=4),
    "ft4": lambda: fat_tree(4),
    "ft6": lambda: fat_tree(6),
    "osm-ft4-relabelled": lambda: parse_ibnet(
        dump_ibnet(relabel(opensm_fat_tree(4), seed=3).fabric), "relabelled.net"
    ),
    "ft6-cut-12": lambda: degrade(fat_tree(6), 12, seed=5).fabric,
    "ft8-agg-gone": lambda: degrade(fat_tree(8), 0, SwitchFailures.parse("agg:1"), seed=2).fabric,
}


def _both(subnet: Subnet) -> tuple[RoutingTables, RoutingTables]:
    vector, scalar = SsspEngine(), SsspEngine()
    vector.scalar_up_to = -1
    scalar.scalar_up_to, scalar.scalar_candidates_per_level = 10**6, float("inf")
    return vector.route(subnet), scalar.route(subnet)


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_the_scalar_loop_makes_the_vector_loops_tables(name: str) -> None:
    subnet = Subnet.build(FABRICS[name]())
    vector, scalar = _both(subnet)
    assert np.array_equal(vector.lft, scalar.lft), f"{name}: the two forms of sssp disagree"
    assert vector.digest() == scalar.digest()


def test_the_default_picks_the_scalar_loop_only_where_levels_are_narrow() -> None:
    """Which form runs is a speed choice; prove the switch is real in both directions."""
    engine = SsspEngine()
    narrow = Subnet.build(torus(6, 6, hosts_per_switch=2))
    wide = Subnet.build(fat_tree(8))
    limit = engine.scalar_candidates_per_level
    assert _candidates_per_level(hop_distances(narrow), engine.route(narrow).alt) <= limit
    assert _candidates_per_level(hop_distances(wide), engine.route(wide).alt) > limit


def _layers_from_scratch(tables: RoutingTables, max_layers: int) -> tuple[int, bool, np.ndarray]:
    """DFSSSP's cycle breaking the slow, obvious way: after every move, rebuild the layer's dependency set
    from the routes in it, peel it, walk a cycle from its lowest node, move the routes of its weakest edge."""
    subnet = tables.subnet
    codes, owners, n_chan = path_dependencies(tables)
    n_paths = int(subnet.has_hosts.sum()) * int(subnet.dest_lids.size)
    layer = np.zeros(n_paths, dtype=np.int64)
    for current in range(max_layers):
        while True:
            mine = layer[owners] == current
            present, count = np.unique(codes[mine], return_counts=True)
            alive = acyclic_core(present, n_chan)
            if not alive.any():
                break
            if current == max_layers - 1:
                return max_layers, False, layer
            cycle = find_cycles(present, n_chan, alive, limit=1)[0]
            edges = sorted({cycle[i] * n_chan + cycle[(i + 1) % len(cycle)] for i in range(len(cycle))})
            weakest = min(edges, key=lambda code: (int(count[np.searchsorted(present, code)]), code))
            layer[np.unique(owners[mine & (codes == weakest)])] = current + 1
        if not (layer > current).any():
            return current + 1, True, layer
    return max_layers, True, layer


LAYERED = ["torus6x6", "torus5x3", "torus3x3x3", "dragonfly9x4", "rr32x4-s2", "rr40x5-s3"]


@pytest.mark.parametrize("name", LAYERED)
@pytest.mark.parametrize("max_layers", [2, 8])
def test_incremental_layering_equals_layering_from_scratch(name: str, max_layers: int) -> None:
    subnet = Subnet.build(FABRICS[name]())
    leaves = np.flatnonzero(subnet.has_hosts)
    for tables in (SsspEngine().route(subnet), MinHopEngine().route(subnet)):
        got = assign_layers(tables, max_layers)
        count, acyclic, layer = _layers_from_scratch(tables, max_layers)
        assert (got.count, got.acyclic) == (count, acyclic), name
        assert got.layers is not None
        per_path = got.layers[np.ix_(leaves, subnet.dest_lids)].astype(np.int64).ravel()
        assert np.array_equal(per_path, layer), f"{name}: a route landed on another lane"
        if acyclic:
            assert layer_cycles(tables, got.layers)[2] == [], f"{name}: a layer still has a cycle"


def test_dfsssp_layers_every_route_acyclically_on_a_torus_that_needs_many() -> None:
    tables = DfssspEngine(15).route(Subnet.build(torus(4, 4, hosts_per_switch=1, z=4)))
    assert tables.layers is not None
    count, _, cycles = layer_cycles(tables, tables.layers)
    assert cycles == [] and 2 < count <= 15
