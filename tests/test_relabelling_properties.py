"""Proof by relabelling: the same cabling under other labels routes with the same quality and the same routes.

Hypothesis draws generated fabrics (fat-trees k=4..16 in fabriclab's and OpenSM's layout, leaf-spine with
oversubscription and parallel cables, rail-optimised) and a relabelling (`topologies.relabel`): ports
renumbered per switch, GUIDs redrawn, names anonymised, node and cable order shuffled.  The relabelled fabric
goes through the real commands — `topo export-ibnet` then `topo import-ibnet` — as a foreign fabric would.

* Any relabelling: ftree and sssp give the same quality figures (per tier max and mean, worst shift,
  contended shifts), the same hop counts, all pairs reachable and deadlock-free.
* A relabelling that keeps the order of GUIDs and of each switch's port numbers (new values, gaps, new
  names, shuffled file order): every engine gives the same routes, entry for entry through the relabelling.
  (Engines break ties by GUID and, between parallel cables, by port number — any deterministic engine must
  break them by something — so those two orders are what a relabelling may not change for equal tables.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.sm.engines import default_registry
from controller.sm.quality import quality
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from fabriclab.cli import main
from topologies.generators import fat_tree, leaf_spine, opensm_fat_tree, rail
from topologies.loader import dump_yaml, load_topology
from topologies.model import Fabric
from topologies.relabel import Relabelling, relabel

SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@st.composite
def fabrics(draw: st.DrawFn, max_k: int = 16) -> Fabric:
    kind = draw(st.sampled_from(["fat-tree", "opensm-fat-tree", "leaf-spine", "rail"]))
    if kind in ("fat-tree", "opensm-fat-tree"):
        k = draw(st.sampled_from([k for k in (4, 6, 8, 10, 12, 16) if k <= max_k]))
        return fat_tree(k) if kind == "fat-tree" else opensm_fat_tree(k)
    if kind == "leaf-spine":
        spines = draw(st.integers(2, 6))
        parallel = draw(st.integers(1, 3))
        over = draw(st.sampled_from([1, 2, 3]))  # oversubscription
        return leaf_spine(draw(st.integers(2, 10)), spines, spines * parallel * over, parallel=parallel)
    gpus = draw(st.sampled_from([2, 4, 8]))
    servers = draw(st.sampled_from([2, 4, 8]))
    return rail(servers, gpus, groups=draw(st.integers(1, 3)))


def _round_trip(fabric: Fabric) -> Fabric:
    """YAML -> `topo export-ibnet` -> `topo import-ibnet` -> YAML, through the CLI."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "in.yaml").write_text(dump_yaml(fabric))
        assert main(["topo", "export-ibnet", str(work / "in.yaml"), "-o", str(work / "f.net")]) == 0
        assert main(["topo", "import-ibnet", str(work / "f.net"), "-o", str(work / "out.yaml")]) == 0
        return load_topology(work / "out.yaml")


def _route(fabric: Fabric, engine: str) -> RoutingTables:
    return default_registry().create(engine).route(Subnet.build(fabric))


def _figures(tables: RoutingTables) -> dict[str, Any]:
    figures = quality(tables)
    result = verify(tables)
    assert figures.shift is not None
    return {
        "ok": result.ok,
        "unreachable": result.unreachable_pairs,
        "mean_hops": round(result.mean_hops, 9),
        "max_hops": result.max_hops,
        "tiers": [(t.tier, t.channels, t.max, t.mean) for t in figures.all_to_all],
        "switch_links": (figures.switch_links.max, figures.switch_links.mean),
        "shift": (figures.shift.worst_max_flows, figures.shift.shifts_with_contention),
    }


@pytest.mark.slow
@SETTINGS
@given(fabric=fabrics(), seed=st.integers(0, 2**31), engine=st.sampled_from(["ftree", "sssp"]))
def test_any_relabelling_gives_the_same_quality(fabric: Fabric, seed: int, engine: str) -> None:
    original = _figures(_route(fabric, engine))
    assert original["ok"] and original["unreachable"] == 0
    foreign = _round_trip(relabel(fabric, seed).fabric)
    assert not set(foreign.nodes) & {
        n for n in fabric.nodes if n.startswith(("leaf", "spine", "agg", "core"))
    }
    assert _figures(_route(foreign, engine)) == original


def _assert_same_routes(original: RoutingTables, relabelled: RoutingTables, mapping: Relabelling) -> None:
    a, b = original.subnet, relabelled.subnet
    rows = np.array([b.switch_index[mapping.names[name]] for name in a.switch_names], dtype=np.intp)
    lid_map = np.zeros(a.max_lid + 1, dtype=np.intp)
    for lid, endpoint in a.lids.endpoints.items():
        port = endpoint.port if not endpoint.is_switch else 0
        lid_map[lid] = b.lids.lid(mapping.names[endpoint.node], port)
    lids = a.dest_lids
    expected = original.lft[:, lids].copy()
    for s, name in enumerate(a.switch_names):
        ports = mapping.ports[name]
        row = expected[s]
        routed = (row != NO_PORT) & (row != 0)
        row[routed] = [ports[int(p)] for p in row[routed]]
    assert np.array_equal(relabelled.lft[np.ix_(rows, lid_map[lids])], expected)


@pytest.mark.slow
@SETTINGS
@given(fabric=fabrics(max_k=8), seed=st.integers(0, 2**31))
def test_order_preserving_relabelling_gives_the_same_routes_for_every_engine(
    fabric: Fabric, seed: int
) -> None:
    mapping = relabel(fabric, seed, ports="monotone", guids="monotone")
    foreign = _round_trip(mapping.fabric)
    for engine in default_registry().names():
        original, again = _route(fabric, engine), _route(foreign, engine)
        _assert_same_routes(original, again, mapping)
        if engine == "ftree":
            assert _figures(again) == _figures(original)


@pytest.mark.parametrize("seed", [1, 3, 7])
def test_relabelling_changes_every_label(seed: int) -> None:
    """Every name and GUID is new; every switch's cabled ports are renumbered one-to-one (a shuffle may
    leave a port where it was, about one per switch, never most of them); the cables are the same cables."""
    fabric = fat_tree(4)
    mapping = relabel(fabric, seed)
    assert all(mapping.names[n] != n for n in fabric.nodes)
    assert {n.guid for n in mapping.fabric.nodes.values()}.isdisjoint({n.guid for n in fabric.nodes.values()})
    kept = total = 0
    for name, node in fabric.nodes.items():
        if not node.is_switch:
            continue
        ports = mapping.ports[name]
        assert len(set(ports.values())) == len(ports)  # one-to-one
        kept += sum(old == new for old, new in ports.items())
        total += len(ports)
    assert total == sum(fabric.nodes[end.node].is_switch for link in fabric.links for end in (link.a, link.b))
    assert kept <= total // 3, f"{kept} of {total} switch ports kept their number"
    cables = {
        frozenset((mapping.port(link.a.node, link.a.port), mapping.port(link.b.node, link.b.port)))
        for link in fabric.links
    }
    assert cables == {frozenset((link.a, link.b)) for link in mapping.fabric.links}
    assert list(mapping.fabric.nodes) != [mapping.names[n] for n in fabric.nodes]
    assert mapping.fabric.links != tuple(sorted(mapping.fabric.links, key=str))
