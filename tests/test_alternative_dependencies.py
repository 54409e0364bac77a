"""The alternatives deadlock check (`verify.alternative_dependencies`) against a plain definition.

The controller computes every destination switch's dependencies at once with array products; the
reference here walks one destination switch at a time, the way the definition reads: the switches host
traffic toward it can reach over allowed ports, then every (incoming channel, outgoing alternative) pair at
each switch reached.  Both must give the same codes on fat-trees, OpenSM-layout and rail fabrics, tori,
whole and with cables cut, under every engine that records alternatives.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from controller.sm.engines import default_registry
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import alternative_dependencies, verify
from topologies.direct import torus
from topologies.generators import fat_tree, opensm_fat_tree, rail
from topologies.model import Fabric


def _reference(tables: RoutingTables) -> np.ndarray:
    subnet = tables.subnet
    chan, n_chan = subnet.switch_channels
    width, nbr = subnet.n_ports, subnet.nbr
    codes: set[int] = set()
    for t in sorted(set(subnet.ep_switch.tolist())):
        allowed = np.unpackbits(tables.alt[:, t, :], axis=1, count=width).astype(bool) & (nbr >= 0)
        allowed[t] = False
        used = set(np.flatnonzero(subnet.has_hosts).tolist())
        frontier = list(used)
        while frontier:
            s = frontier.pop()
            for p in np.flatnonzero(allowed[s]).tolist():
                m = int(nbr[s, p])
                if m not in used:
                    used.add(m)
                    frontier.append(m)
        for s in used:
            for p in np.flatnonzero(allowed[s]).tolist():
                m = int(nbr[s, p])
                for q in np.flatnonzero(allowed[m]).tolist():
                    codes.add(int(chan[s, p]) * n_chan + int(chan[m, q]))
    return np.array(sorted(codes), dtype=np.int64)


def _cables(fabric: Fabric) -> list[int]:
    return [
        i
        for i, cable in enumerate(fabric.links)
        if fabric.nodes[cable.a.node].is_switch and fabric.nodes[cable.b.node].is_switch
    ]


@pytest.mark.parametrize(
    "fabric",
    [fat_tree(4), fat_tree(8), opensm_fat_tree(6), rail(4, 4, groups=2), torus(4, 4)],
    ids=lambda f: f.name,
)
@pytest.mark.parametrize("engine", ["ftree", "sssp", "updn", "minhop"])
def test_all_destinations_at_once_equal_one_at_a_time(fabric: Fabric, engine: str) -> None:
    router = default_registry().create(engine)
    rng = random.Random(7)
    cables = _cables(fabric)
    checked = 0
    for step in range(4):
        cut = sorted(rng.sample(cables, step % 3))
        try:
            tables = router.route(Subnet.build(fabric.without(links=cut)))
        except Exception:  # an engine that refuses this fabric (ftree on a torus) has nothing to check
            continue
        got = alternative_dependencies(tables)
        assert np.array_equal(got, _reference(tables)), (engine, cut)
        checked += 1
    if engine != "ftree" or "torus" not in fabric.name:
        assert checked > 0


def test_it_finds_the_cycle_a_loose_alternative_closes() -> None:
    """An alternative that sends traffic back up from an aggregation switch closes a cycle the table's own
    ports do not: the check must see it (and the reference agrees on the codes)."""
    fabric = fat_tree(4)
    tables = default_registry().create("ftree").route(Subnet.build(fabric))
    subnet = tables.subnet
    alt = tables.alt.copy()
    width = subnet.n_ports
    bits = np.unpackbits(alt, axis=2, count=width)
    # every switch may use every link toward every destination: up*/down* no longer holds
    bits[:, :, :] = (subnet.nbr >= 0)[:, None, :]
    loose = RoutingTables(**{**tables.__dict__, "alt": np.packbits(bits, axis=2)})
    got = alternative_dependencies(loose)
    assert np.array_equal(got, _reference(loose))
    result = verify(loose, alternatives=True)
    assert result.deadlock_alternatives is not None and not result.deadlock_alternatives.acyclic
    assert verify(tables, alternatives=True).deadlock_alternatives.acyclic  # type: ignore[union-attr]
