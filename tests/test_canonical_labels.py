"""Any relabelling of a damaged fabric, routed under canonical labels, gives every figure unchanged.

Engines break ties by GUID and port number (as OpenSM's do); on a damaged fat-tree that makes the figures
depend on the labels: an arbitrary relabelling (ports renumbered per switch, GUIDs redrawn in another order,
names anonymised, file order shuffled, then through `topo export-ibnet` / `import-ibnet`) changed some ftree
figure in 31 of 80 cases on k=4 and k=8 and some sssp or dfsssp figure in 67 of 80.  `route --labels
canonical` (`engines.labels.CanonicalLabels`) routes a copy labelled from the cabling alone
(`topologies.canonical`) and maps the tables back: same figures for every labelling, tables that verify on
the fabric's own switches, LIDs and ports.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.sm.engines import default_registry
from controller.sm.engines.labels import CanonicalLabels, labelled
from controller.sm.hostorder import host_order
from controller.sm.subnet import NO_PORT, Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from fabriclab.cli import main
from tests.conftest import DATA
from tests.test_relabelling_properties import _figures, _round_trip
from topologies.canonical import canonical_copy
from topologies.faults import SwitchFailures, degrade
from topologies.generators import fat_tree, opensm_fat_tree
from topologies.ibnet import load_ibnet
from topologies.loader import dump_yaml
from topologies.model import Fabric
from topologies.relabel import relabel

DAMAGE = st.sampled_from(["core:1", "agg:1", "links:3", "links:8", "core:1,agg:1"])


def _damaged(k: int, layout: str, damage: str, seed: int) -> Fabric:
    base = fat_tree(k) if layout == "fabriclab" else opensm_fat_tree(k)
    if damage.startswith("links:"):
        broken = degrade(base, fail_links=int(damage[6:]), seed=seed).fabric
    else:
        broken = degrade(base, fail_switches=SwitchFailures.parse(damage), seed=seed).fabric
    return _round_trip(broken)  # both sides through the importer: its link speeds, its port widths


def _canonical(fabric: Fabric, engine: str) -> RoutingTables:
    return CanonicalLabels(default_registry().create(engine)).route(Subnet.build(fabric))


def _shape(fabric: Fabric) -> list[tuple[int, int, int, int]]:
    guid = {node.name: node.guid for node in fabric.nodes.values()}
    return sorted((guid[lk.a.node], lk.a.port, guid[lk.b.node], lk.b.port) for lk in fabric.links)


@pytest.mark.slow
@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    k=st.sampled_from([4, 8]),
    layout=st.sampled_from(["fabriclab", "opensm"]),
    damage=DAMAGE,
    seed=st.integers(0, 2**31),
    engine=st.sampled_from(["ftree", "sssp", "dfsssp"]),
)
def test_any_relabelling_of_a_damaged_fabric_changes_no_figure_under_canonical_labels(
    k: int, layout: str, damage: str, seed: int, engine: str
) -> None:
    damaged = _damaged(k, layout, damage, seed % 1000)
    foreign = _round_trip(relabel(damaged, seed).fabric)
    original = _canonical(damaged, engine)
    again = _canonical(foreign, engine)
    figures = _figures(original)
    assert figures["unreachable"] == 0
    assert _figures(again) == figures
    # the copy each was routed on is the same one: GUIDs and ports from the cabling alone
    assert _shape(canonical_copy(damaged).fabric) == _shape(canonical_copy(foreign).fabric)


def test_the_fabrics_own_labels_do_change_figures_there() -> None:
    """The case for the option: the same damaged cabling under two labellings, routed as given, differs."""
    damaged = _damaged(4, "fabriclab", "links:3", 3)
    foreign = _round_trip(relabel(damaged, 3).fabric)
    engine = default_registry().create("ftree")
    as_given = [_figures(engine.route(Subnet.build(f))) for f in (damaged, foreign)]
    assert as_given[0] != as_given[1]
    assert _figures(_canonical(damaged, "ftree")) == _figures(_canonical(foreign, "ftree"))


@pytest.mark.parametrize("engine", ["ftree", "sssp", "dfsssp"])
def test_tables_mapped_back_are_the_copys_tables_on_the_fabrics_own_ports(engine: str) -> None:
    """Entry by entry: switch s forwards LID l out of the port that, on the copy, is the copy's entry —
    through the port maps; the lanes and alternatives the same way; everything verifies."""
    fabric = _damaged(8, "opensm", "links:8", 2)
    subnet = Subnet.build(fabric)
    relabelled = canonical_copy(fabric)
    copy = Subnet.build(relabelled.fabric)
    inner = default_registry().create(engine)
    ours, theirs = CanonicalLabels(inner).route(subnet), inner.route(copy)
    for name in subnet.switch_names:
        back = {new: old for old, new in relabelled.ports[name].items()} | {0: 0}
        s, c = subnet.switch_index[name], copy.switch_index[name]
        for lid in subnet.dest_lids.tolist():
            endpoint = subnet.lids.endpoints[lid]
            twin = copy.lids.lid(endpoint.node, 0 if endpoint.is_switch else endpoint.port)
            assert ours.lft[s, lid] == back.get(int(theirs.lft[c, twin]), NO_PORT), (name, lid)
            if theirs.layers is not None:
                assert ours.layers is not None and ours.layers[s, lid] == theirs.layers[c, twin]
        for lid in subnet.dest_lids[::7].tolist():
            mapped = {back[p] for p in theirs.alternatives(name, copy.lids.lid(*_ends(subnet, lid)))}
            assert set(ours.alternatives(name, lid)) == mapped
    result = verify(ours)
    assert result.unreachable_pairs == 0 and result.loop_entries == 0 and result.dead_entries == 0
    assert ours.info["labels"] == "canonical"
    # shift permutations are judged in the copy's CA order, brought back to this subnet's endpoints
    assert ours.ca_order is not None
    order = host_order(copy).order
    names = [(copy.endpoints[i].node, copy.endpoints[i].port) for i in order.tolist()]
    assert [
        (subnet.endpoints[i].node, subnet.endpoints[i].port) for i in ours.ca_order.order.tolist()
    ] == names


def _ends(subnet: Subnet, lid: int) -> tuple[str, int]:
    endpoint = subnet.lids.endpoints[lid]
    return endpoint.node, 0 if endpoint.is_switch else endpoint.port


def test_incremental_reroute_under_canonical_labels_equals_a_full_one() -> None:
    """`route_some` maps the asked LIDs to the copy's and back: the columns equal a full routing's."""
    from controller.sm.incremental import reroute

    engine = labelled(default_registry().create("ftree"), "canonical")
    fabric = _damaged(8, "fabriclab", "links:3", 1)
    previous = engine.route(Subnet.build(fabric))
    used = previous.lft[:, previous.subnet.dest_lids]
    index = next(
        i
        for i, link in enumerate(fabric.links)
        if fabric.nodes[link.a.node].is_switch
        and fabric.nodes[link.b.node].is_switch
        and (used[previous.subnet.switch_index[link.a.node]] == link.a.port).any()
    )
    step = reroute(previous, fabric.without(links=[index]), engine)
    full = engine.route(step.tables.subnet)
    affected = np.array(sorted(step.affected_lids), dtype=np.intp)
    assert affected.size > 0
    assert np.array_equal(step.tables.lft[:, affected], full.lft[:, affected])


def test_route_cli_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fabric = _damaged(4, "fabriclab", "links:3", 3)
    (tmp_path / "f.yaml").write_text(dump_yaml(fabric))
    args = ["route", str(tmp_path / "f.yaml"), "--engine", "ftree", "--report"]
    assert main([*args, "--labels", "canonical", "--json", "--dump-dir", str(tmp_path / "d")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine_info"]["labels"] == "canonical"
    # the dumped CA order is the one the tables were numbered and judged in
    tables = _canonical(fabric, "ftree")
    assert tables.ca_order is not None
    subnet = tables.subnet
    dumped = [
        int(line.split("\t")[0], 16)
        for line in (tmp_path / "d" / "opensm-ftree-ca-order.dump").read_text().splitlines()
    ]
    assert [lid for lid in dumped if lid != 0xFFFF] == subnet.ep_lids[tables.ca_order.order].tolist()
    assert main([*args, "--labels", "canonical"]) == 0
    assert "labels        canonical" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        main([*args, "--labels", "sorted"])
    assert bad.value.code == 2
    assert "--labels" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["ftree", "sssp"])
def test_opensms_k16_with_five_percent_cut_under_canonical_labels(engine: str) -> None:
    """OpenSM's own k=16 (its generator's cabling, GUIDs and names) with 102 cables cut, and a relabelled
    copy of it: the same figures under canonical labels (as given they differ: all-to-all max/mean ftree
    1.516 vs 1.508, sssp 1.877 vs 1.862; canonical 1.500 and 1.870 for both)."""
    reference = load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz")
    damaged = _round_trip(degrade(reference, fail_links=102, seed=4).fabric)
    foreign = _round_trip(relabel(damaged, 4).fabric)
    assert _figures(_canonical(damaged, engine)) == _figures(_canonical(foreign, engine))
