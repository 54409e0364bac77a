"""The controller's incremental reroute against a full recomputation, over seeded random walks of cable cuts,
restores and whole-switch losses on k=8 and k=16 fat-trees, relabelled copies and OpenSM's own k=16 (as its
ibnetdiscover file describes it).

After every step, through the controller's own path (`SubnetContext.compute` with the previous generation):
- every destination whose routes used a failed part (affected) has exactly the column a full recomputation
  of the live fabric gives (the same engine, the same LIDs, computed here independently);
- every other destination keeps its previous column, and `changed_lids` names exactly the columns that
  differ from the previous tables;
- a step that is not failures only (a restore) is a full recomputation, entry for entry;
- the tables verify (all pairs reachable, loop-free, deadlock-free);
- restoring everything gives back the intact fabric's tables, entry for entry.

Why not "all columns equal a full recomputation": after a failure a full ftree recomputation rebalances
every destination; the incremental path moves only the ones that must move, which is the point of it
(`test_degraded_and_incremental.py` shows how many more a full one moves).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from controller.sm.intents import ForwardingOptions
from controller.sm.lids import assign_lids
from controller.sm.manager import Computation, SubnetContext
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from tests import faultwalk
from tests.conftest import DATA
from topologies.generators import fat_tree, opensm_fat_tree
from topologies.ibnet import load_ibnet
from topologies.model import Fabric, PortRef
from topologies.relabel import relabel

OPTIONS = ForwardingOptions()


def _aligned(new: RoutingTables, old: RoutingTables) -> tuple[npt.NDArray[np.intp], list[int]]:
    """Rows of `old` in `new`'s switch order, and the destination LIDs both have for the same endpoint."""
    rows = np.array([old.subnet.switch_index[name] for name in new.subnet.switch_names], dtype=np.intp)
    common = [
        lid
        for lid in new.subnet.dest_lids.tolist()
        if old.subnet.lids.endpoints.get(lid) == new.subnet.lids.endpoints[lid]
    ]
    return rows, common


def _affected(previous: RoutingTables, down: dict[PortRef, float], live: Fabric) -> set[int]:
    """Destinations whose previous routes leave a surviving switch through a port that is now down."""
    subnet = previous.subnet
    found: set[int] = set()
    for ref in down:
        if ref.node in subnet.switch_index and ref.node in live.nodes:
            row = previous.lft[subnet.switch_index[ref.node]]
            found |= {int(lid) for lid in np.flatnonzero(row == ref.port)}
    return found


def _check_step(
    context: SubnetContext, previous: Computation, now: Computation, down: dict[PortRef, float], what: str
) -> None:
    live, _ = context.live_fabric(down)
    router = context.registry.create(now.engine)
    full = router.route(Subnet.build(live, assign_lids(live, previous=context.lids)))
    assert now.verification.ok, (what, now.verification)
    assert now.tables.subnet.switch_names == full.subnet.switch_names
    if not now.incremental:
        assert np.array_equal(now.tables.lft, full.lft), what
        return
    old, new = previous.tables, now.tables
    rows, common = _aligned(new, old)
    affected = _affected(old, down, live) & set(common)
    kept = np.array([lid for lid in common if lid not in affected], dtype=np.intp)
    assert np.array_equal(new.lft[:, kept], old.lft[np.ix_(rows, kept)]), (what, "kept columns moved")
    moved = sorted(affected)
    assert np.array_equal(new.lft[:, moved], full.lft[:, moved]), (what, "affected != full recomputation")
    fresh = [lid for lid in new.subnet.dest_lids.tolist() if lid not in set(common)]
    assert np.array_equal(new.lft[:, fresh], full.lft[:, fresh]), what
    differs = {lid for lid in common if not np.array_equal(new.lft[:, lid], old.lft[rows, lid])}
    assert now.changed_lids is not None and set(now.changed_lids) == differs, what


def _walk(fabric: Fabric, seed: int, steps: int) -> tuple[int, int]:
    """Returns (incremental steps, full steps)."""
    context = SubnetContext.build(fabric)
    intact = context.compute("ftree", OPTIONS, {}, 1)
    previous = intact
    counts = [0, 0]
    down: dict[PortRef, float] = {}
    for step, (what, down) in enumerate(faultwalk.walk(fabric, seed, steps)):
        now = context.compute("ftree", OPTIONS, down, step + 2, previous)
        _check_step(context, previous, now, down, f"step {step}: {what}")
        counts[0 if now.incremental else 1] += 1
        previous = now
    if down:
        back = context.compute("ftree", OPTIONS, {}, steps + 2, previous)
        assert not back.incremental
        assert np.array_equal(back.tables.lft, intact.tables.lft), (
            "restoring everything must give the intact tables"
        )
    return counts[0], counts[1]


K8 = [
    pytest.param(fat_tree(8), id="ft8"),
    pytest.param(opensm_fat_tree(8), id="opensm-layout-8"),
    pytest.param(relabel(fat_tree(8), 9).fabric, id="ft8-relabelled"),
]


@pytest.mark.parametrize("fabric", K8)
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_incremental_tables_match_a_full_recomputation_k8(fabric: Fabric, seed: int) -> None:
    incremental, _ = _walk(fabric, seed, steps=12)
    assert incremental >= 3  # the incremental path ran, not only full recomputations


@pytest.mark.slow
@pytest.mark.parametrize(
    "fabric",
    [
        pytest.param(fat_tree(16), id="ft16"),
        pytest.param(load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz"), id="opensm-k16"),
    ],
)
def test_incremental_tables_match_a_full_recomputation_k16(fabric: Fabric) -> None:
    incremental, _ = _walk(fabric, seed=5, steps=5)
    assert incremental >= 2
