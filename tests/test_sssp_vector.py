"""sssp's vector form (`engines/sssp_vector.py`, compact per-destination-switch candidate blocks) makes the
same tables as the per-level loop it replaced on the fabrics it runs on (the loop is still the engine's for
fabrics too large for the blocks' memory, `SsspEngine.plan_cells`, so it is the reference here).

A speed change that must not change a single entry: every LFT entry, the alternatives, and (through them)
dfsssp's lanes.  Fabrics: OpenSM's k=16 damaged as `benchmarks/routing.py` damages it (the cases issue 30's
timings are taken on), the fabrics of `test_sssp_kernels.py`, one with links of mixed speed (weights other
than 1), and blocks built one destination switch at a time as well as all at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from controller.sm.cdg import lanes
from controller.sm.engines import sssp_vector
from controller.sm.engines.sssp import SsspEngine
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from fabriclab.cli.failures import link_failures
from tests.conftest import DATA
from tests.test_sssp_kernels import FABRICS
from topologies.faults import SwitchFailures, degrade
from topologies.generators import fat_tree, leaf_spine
from topologies.ibnet import dump_ibnet, load_ibnet, parse_ibnet
from topologies.model import Fabric


def _damaged_k16(switches: str = "0", links_pct: float = 0.0) -> Fabric:
    """OpenSM's k=16 file damaged as `benchmarks/routing.py`'s `osm-k16-*` cases (seed 1, imported)."""
    fabric = load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz")
    links = link_failures(f"{links_pct:g}%", fabric)
    damaged = degrade(fabric, links, SwitchFailures.parse(switches), 1).fabric
    return parse_ibnet(dump_ibnet(damaged), f"{damaged.name}.net")


def _mixed_speeds(fabric: Fabric, every: int = 3) -> Fabric:
    """Every `every`-th switch-to-switch link at a quarter of the speed: costs with weights other than 1."""
    hosts = {host.name for host in fabric.hosts}
    slowed, seen = [], 0
    for link in fabric.links:
        between_switches = link.a.node not in hosts and link.b.node not in hosts
        seen += between_switches
        slow = between_switches and seen % every == 0
        slowed.append(replace(link, bw_gbps=link.bw_gbps / 4) if slow else link)
    return replace(fabric, links=tuple(slowed))


DAMAGED_K16: dict[str, Callable[[], Fabric]] = {
    "osm-k16-core1": lambda: _damaged_k16(switches="core:1"),
    "osm-k16-agg1": lambda: _damaged_k16(switches="agg:1"),
    "osm-k16-5pct": lambda: _damaged_k16(links_pct=5.0),
}
OTHERS: dict[str, Callable[[], Fabric]] = {
    **FABRICS,
    "ft8": lambda: fat_tree(8),
    "ft8-mixed-speeds": lambda: _mixed_speeds(fat_tree(8)),
    "leafspine-mixed-speeds": lambda: _mixed_speeds(leaf_spine(6, 4, 3, parallel=2), every=2),
    "ft8-cut-20": lambda: degrade(fat_tree(8), 20, seed=3).fabric,
    # A pod's aggregation switches gone: its leaves are cut off (unreachable pairs, switches without rows).
    "ft8-pod-cut-off": lambda: fat_tree(8).without(nodes=("agg1", "agg2", "agg3", "agg4", "core1")),
}


def _vector() -> SsspEngine:
    engine = SsspEngine()
    engine.scalar_up_to, engine.plan_cells = -1, 1 << 40  # the vector form everywhere
    return engine


def _reference() -> SsspEngine:
    engine = SsspEngine()
    engine.scalar_up_to, engine.plan_cells = -1, -1  # the per-level loop everywhere
    return engine


def _assert_same(name: str, got: RoutingTables, want: RoutingTables) -> None:
    assert np.array_equal(got.alt, want.alt), f"{name}: alternatives differ"
    differ = np.argwhere(got.lft != want.lft)
    assert differ.size == 0, (
        f"{name}: {len(differ)} LFT entries differ, first (switch, lid) {differ[:3].tolist()}"
    )
    assert got.digest() == want.digest()


@pytest.mark.parametrize("name", sorted(DAMAGED_K16))
def test_the_vector_form_makes_the_old_loops_tables_on_damaged_k16(name: str) -> None:
    subnet = Subnet.build(DAMAGED_K16[name]())
    want = _reference().route(subnet)
    _assert_same(name, _vector().route(subnet), want)
    # The default engine on this fabric (over 256 switches, 1.1 M cells) is the vector form.
    default = SsspEngine()
    assert subnet.n_switches > default.scalar_up_to
    assert sssp_vector.cells(want.alt, subnet.dest_lids.size) <= default.plan_cells
    _assert_same(name + " (default)", default.route(subnet), want)


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_the_vector_form_makes_the_old_loops_tables(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    subnet = Subnet.build(OTHERS[name]())
    want = _reference().route(subnet)
    _assert_same(name, _vector().route(subnet), want)
    monkeypatch.setattr(sssp_vector, "CHUNK_CELLS", 1)
    _assert_same(name + " (plans built one switch at a time)", _vector().route(subnet), want)


def test_mixed_speeds_really_weigh_links() -> None:
    """The mixed-speed fabrics must exercise the weighted path (some weight other than 1)."""
    subnet = Subnet.build(OTHERS["ft8-mixed-speeds"]())
    is_link = subnet.nbr >= 0
    assert len(set(subnet.bw_gbps[is_link].tolist())) == 2


@pytest.mark.parametrize("name", ["torus6x6", "dragonfly9x4", "rr40x5-s3"])
def test_dfsssp_lanes_from_the_vector_form_equal_the_old_loops(name: str) -> None:
    subnet = Subnet.build(FABRICS[name]())
    got_layers, got_info = lanes(_vector().route(subnet), 8)
    want_layers, want_info = lanes(_reference().route(subnet), 8)
    assert got_info == want_info
    assert np.array_equal(got_layers, want_layers), f"{name}: a route landed on another lane"


def test_routing_twice_gives_the_same_tables() -> None:
    """Determinism: plans are cached per routing, nothing carries over from one routing to the next."""
    subnet = Subnet.build(FABRICS["ft8-agg-gone"]())
    engine = _vector()
    first, second = engine.route(subnet), engine.route(subnet)
    assert np.array_equal(first.lft, second.lft)
