"""The make phase's waves (`controller.sm.ordering.make_waves`): every switch gets its new entries only after
each neighbour its new entries lead to, for the same destination, has its own — checked here entry by entry
with plain loops over the tables (not the function's numpy), on cable cuts, restores and switch losses of
k=4 and k=8 fat-trees, OpenSM's layout and a relabelled copy."""

from __future__ import annotations

import pytest

from controller.sm.intents import ForwardingOptions
from controller.sm.manager import SubnetContext
from controller.sm.ordering import make_waves
from controller.sm.subnet import NO_PORT
from controller.sm.tables import RoutingTables
from tests import faultwalk
from topologies.generators import fat_tree, opensm_fat_tree
from topologies.model import Fabric
from topologies.relabel import relabel


def _changed(old: RoutingTables, new: RoutingTables) -> dict[str, set[int]]:
    """Switch -> destination LIDs whose chosen port differs between the two (switches of `new`)."""
    out: dict[str, set[int]] = {}
    for name in new.subnet.switch_names:
        mine = set()
        for lid in new.subnet.dest_lids.tolist():
            if old.subnet.lids.endpoints.get(lid) != new.subnet.lids.endpoints[lid]:
                continue
            before = old.port(name, lid) if name in old.subnet.switch_index else None
            if before != new.port(name, lid):
                mine.add(lid)
        if mine:
            out[name] = mine
    return out


def _check(old: RoutingTables, new: RoutingTables) -> int:
    """Waves for every switch whose entries changed; returns how many waves."""
    changed = _changed(old, new)
    waves = make_waves(old, new, changed)
    placed = [name for wave in waves for name in wave]
    assert sorted(placed) == sorted(changed)  # each switch once
    at = {name: i for i, wave in enumerate(waves) for name in wave}
    fabric = new.subnet.fabric
    for name, lids in changed.items():
        for lid in lids:
            port = new.port(name, lid)
            if port in (0, NO_PORT):
                continue
            peer = fabric.peer(name, port)
            if peer is None or not fabric.nodes[peer.node].is_switch:
                continue
            if lid in changed.get(peer.node, ()):
                last = len(waves) - 1
                assert at[peer.node] < at[name] or at[name] == at[peer.node] == last, (name, lid, peer.node)
    return len(waves)


CASES = [
    pytest.param(fat_tree(4), id="ft4"),
    pytest.param(fat_tree(8), id="ft8"),
    pytest.param(opensm_fat_tree(8), id="opensm-layout-8"),
    pytest.param(relabel(fat_tree(8), 4).fabric, id="ft8-relabelled"),
]


@pytest.mark.parametrize("fabric", CASES)
def test_waves_put_downstream_switches_first(fabric: Fabric) -> None:
    context = SubnetContext.build(fabric)
    previous = context.compute("ftree", ForwardingOptions(), {}, 1)
    multi = 0
    for step, (_, down) in enumerate(faultwalk.walk(fabric, seed=3, steps=10)):
        now = context.compute("ftree", ForwardingOptions(), down, step + 2, previous)
        multi += _check(previous.tables, now.tables) > 1
        previous = now
    assert multi >= 3  # ordering mattered, not only single waves


def test_a_restore_updates_the_cables_far_switch_before_the_ones_that_send_into_it() -> None:
    fabric = fat_tree(4)
    context = SubnetContext.build(fabric)
    link = next(lk for lk in fabric.links if str(lk).startswith("leaf1:3"))
    down = {link.a: 1.0, link.b: 1.0}
    cut = context.compute("ftree", ForwardingOptions(), down, 1)
    back = context.compute("ftree", ForwardingOptions(), {}, 2, cut)
    changed = _changed(cut.tables, back.tables)
    waves = make_waves(cut.tables, back.tables, changed)
    assert len(waves) >= 2
    far = link.b.node
    assert far in waves[0], (far, waves)


def test_without_what_was_installed_one_wave() -> None:
    tables = SubnetContext.build(fat_tree(4)).compute("ftree", ForwardingOptions(), {}, 1).tables
    assert make_waves(None, tables, ["leaf1", "agg1"]) == (frozenset({"leaf1", "agg1"}),)
    assert make_waves(tables, tables, []) == ()
