"""Two shortcuts of a reroute, each against the long way round on seeded walks of cuts, restores and
switch losses (k=8 fabriclab and OpenSM-layout fat-trees):

- `diff` from a switch known to hold the program a reroute patched looks only at the keys the patch
  touched (`SwitchProgram.patched(touched=...)`, `applied`): the delta must equal a full diff's;
- `SubnetContext.recent` hands back the full routing of a live fabric routed lately: the tables and the
  verification must equal those of a fresh context that never saw the fabric, and it stays bounded.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from controller.sm import intents
from controller.sm.intents import ForwardingOptions, SwitchDelta, SwitchProgram, applied, diff
from controller.sm.manager import Computation, RecentRoutings, SubnetContext
from controller.sm.subnet import Subnet
from tests import faultwalk
from topologies.generators import fat_tree, opensm_fat_tree, rail
from topologies.model import Fabric, PortRef


def _plain(program: SwitchProgram) -> SwitchProgram:
    """The same contents without lineage: what a read-back gives."""
    return SwitchProgram(program.switch, program.dpid, dict(program.flows), dict(program.groups))


def _content(delta: SwitchDelta) -> tuple[object, ...]:
    return (
        delta.add_groups,
        delta.modify_groups,
        sorted(delta.add_flows, key=repr),
        sorted(delta.delete_flows, key=repr),
        delta.delete_groups,
    )


@pytest.mark.parametrize("fabric", [fat_tree(8), opensm_fat_tree(8)], ids=lambda f: f.name)
@pytest.mark.parametrize("policy", ["static", "ecmp"])
def test_a_diff_along_the_patch_equals_a_full_diff(fabric: Fabric, policy: str) -> None:
    options = ForwardingOptions(policy=policy)
    context = SubnetContext.build(fabric)
    current: Computation = context.compute("ftree", options, {}, 1)
    installed = {n: applied(None, diff(None, p)) for n, p in current.programs.items()}
    shortcuts = 0
    for step, (what, down) in enumerate(faultwalk.walk(fabric, 11, 14)):
        current = context.compute("ftree", options, down, step + 2, current)
        for name, program in current.programs.items():
            if intents._touched_since(installed.get(name), program) is not None:
                shortcuts += 1
            delta = diff(installed.get(name), program)
            assert _content(delta) == _content(diff(_plain(installed[name]), program)), (step, what, name)
            installed[name] = applied(installed[name], delta)
            # what the switch holds now forwards as the program it was sent
            assert {k: f.actions for k, f in installed[name].flows.items()} == {
                k: f.actions for k, f in program.flows.items()
            }
            assert installed[name].groups == program.groups
    if policy == "static":
        assert shortcuts > 0  # patched programs took the short way (ecmp compiles slot tables whole)


def test_no_shortcut_from_a_read_back_or_another_program() -> None:
    fabric = fat_tree(4)
    context = SubnetContext.build(fabric)
    first = context.compute("ftree", ForwardingOptions(), {}, 1)
    name = "agg_p0_0" if "agg_p0_0" in first.programs else sorted(first.programs)[0]
    installed = applied(None, diff(None, first.programs[name]))
    cut = faultwalk.switch_links(fabric)[0]
    link = fabric.links[cut]
    second = context.compute("ftree", ForwardingOptions(), {link.a: 1.0, link.b: 1.0}, 2, first)
    patched = [n for n, p in second.programs.items() if "_patch" in p.__dict__]
    assert patched
    for n in patched:
        holds = applied(None, diff(None, first.programs[n]))
        assert intents._touched_since(holds, second.programs[n]) is not None
        assert intents._touched_since(_plain(holds), second.programs[n]) is None
        assert intents._touched_since(installed if n != name else None, second.programs[n]) is None


def _same(a: Computation, b: Computation) -> None:
    assert np.array_equal(a.tables.lft, b.tables.lft)
    assert np.array_equal(a.tables.alt, b.tables.alt)
    assert a.verification == b.verification


@pytest.mark.parametrize("engine", ["ftree", "sssp", "updn"])
def test_a_restore_takes_the_routing_a_fresh_context_computes(engine: str) -> None:
    fabric = fat_tree(8)
    options = ForwardingOptions()
    context = SubnetContext.build(fabric)
    intact = context.compute(engine, options, {}, 1)
    link = fabric.links[faultwalk.switch_links(fabric)[5]]
    down = {link.a: 1.0, link.b: 1.0}
    cut = context.compute(engine, options, down, 2, intact)
    before = context.recent.hits
    restored = context.compute(engine, options, {}, 3, cut)
    assert context.recent.hits == before + 1
    _same(restored, SubnetContext.build(fabric).compute(engine, options, {}, 3))
    # routed again after other cuts: still what a fresh context computes
    current = restored
    for step, (_what, walk_down) in enumerate(faultwalk.walk(fabric, 3, 6)):
        current = context.compute(engine, options, walk_down, step + 4, current)
        if not current.incremental:
            _same(current, SubnetContext.build(fabric).compute(engine, options, walk_down, step + 4))


def test_recent_routings_are_bounded_and_keyed_by_engine_settings() -> None:
    recent = RecentRoutings(limit=2)
    fabric = fat_tree(4)
    context = SubnetContext.build(fabric)
    tables = context.compute("ftree", ForwardingOptions(), {}, 1)
    value = (tables.tables, tables.verification)
    router = context.registry.create("dfsssp")
    keys = [RecentRoutings.key(router, (i,), True) for i in range(3)]
    for key in keys:
        recent.put(key, value)
    assert recent.get(keys[0]) is None and recent.get(keys[2]) is not None
    other = context.registry.create("dfsssp")
    other.max_layers = 4  # type: ignore[attr-defined]
    assert RecentRoutings.key(other, (2,), True) != keys[2]
    assert RecentRoutings.key(router, (2,), False) != keys[2]


def test_ports_down_map_keys_are_port_refs() -> None:
    """The walk's maps use the PortRefs the controller uses (a guard for the tests above)."""
    _, down = next(faultwalk.walk(fat_tree(4), 1, 1))
    assert all(isinstance(ref, PortRef) for ref in down)


def test_the_controller_diffs_along_patches_and_its_switches_hold_what_it_wants() -> None:
    """Through the controller's core and executor against fake switches that decode the OpenFlow bytes:
    cuts, restores and switch losses; after each, every switch holds its program, every pair is delivered,
    and the diffs took the short way for switches that needed no change as well (`intents.holding`)."""
    from tests.core_driver import CoreDriver

    fabric = fat_tree(8)
    driver = CoreDriver(fabric)
    driver.start()
    driver.connect_all()
    taken: list[bool] = []
    original = intents._touched_since

    def counting(installed: SwitchProgram | None, desired: SwitchProgram) -> tuple[object, ...] | None:
        found = original(installed, desired)
        taken.append(found is not None)
        return found

    intents._touched_since = counting  # type: ignore[assignment]
    try:
        links = faultwalk.switch_links(fabric)
        for step, index in enumerate([links[3], links[40], links[3], links[40], links[77], links[77]]):
            driver.now = 10.0 + step
            driver.set_link(index, up=step in (2, 3, 5))
            driver.assert_holds_desired()
            driver.fake.assert_delivers(driver.fake.all_pairs())
    finally:
        intents._touched_since = original
    assert taken.count(True) > taken.count(False) > 0


@pytest.mark.parametrize("fabric", [fat_tree(8), opensm_fat_tree(6)], ids=lambda f: f.name)
def test_kept_ports_are_added_to_the_alternatives_as_entry_by_entry(fabric: Fabric) -> None:
    """`incremental._with_kept_ports` (only where the previous alternatives lost a bit) against the walk
    over every kept entry, with alternatives thinned at random so that bits are missing."""
    import random

    from controller.sm import incremental
    from controller.sm.engines import default_registry
    from controller.sm.subnet import Subnet

    tables = default_registry().create("ftree").route(Subnet.build(fabric))
    subnet = tables.subnet
    rng = np.random.default_rng(3)
    pick = random.Random(3)
    for _ in range(4):
        thinned = tables.alt & rng.integers(0, 256, tables.alt.shape, dtype=np.uint8)
        kept = np.array(sorted(pick.sample(subnet.dest_lids.tolist(), subnet.dest_lids.size // 2)))
        fast = incremental._with_kept_ports(
            subnet, thinned, tables.lft, kept, tables.alt, subnet.renumbering(subnet.switch_index)
        )
        walk = incremental._with_kept_ports_walk(subnet, thinned.copy(), tables.lft, kept)
        assert np.array_equal(fast, walk)
        assert not np.array_equal(fast, thinned)  # bits were missing and were set
    # nothing lost: the alternatives are returned as they are
    same = incremental._with_kept_ports(
        subnet, tables.alt, tables.lft, kept, tables.alt, subnet.renumbering(subnet.switch_index)
    )
    assert same is tables.alt


@pytest.mark.parametrize(
    "fabric",
    [fat_tree(8), opensm_fat_tree(8), rail(4, 4, groups=2)],
    ids=lambda f: f.name,
)
def test_ftree_routes_some_destinations_as_it_routes_them_all(fabric: Fabric) -> None:
    """`route_some` (what an incremental reroute asks for) gives `route`'s entries toward the LIDs asked
    for and the same alternatives, on intact and damaged fabrics, for few and many destinations."""
    from controller.sm.engines import default_registry
    from controller.sm.subnet import Subnet
    from topologies.faults import degrade

    engine = default_registry().create("ftree")
    rng = np.random.default_rng(7)
    for seed in range(4):
        live = fabric if seed == 0 else degrade(fabric, 3 * seed, seed % 2, seed=seed).fabric
        subnet = Subnet.build(live)
        whole = engine.route(subnet)
        for share in (0.02, 0.3, 1.0):
            size = max(1, int(share * subnet.dest_lids.size))
            lids = np.sort(rng.choice(subnet.dest_lids, size, replace=False))
            some = engine.route_some(subnet, lids)
            assert np.array_equal(some.lft[:, lids], whole.lft[:, lids]), (seed, share)
            assert np.array_equal(some.alt, whole.alt)


def _verification_walk(fabric: Fabric, engine: str, seed: int, steps: int) -> tuple[int, int]:
    """Cuts, restores and switch losses; after each, the incremental verification (from the previous
    one's per-column figures) equals one from scratch, field by field.  Returns how often it was
    incremental, and how often of those across a lost switch."""
    from controller.sm import verify as verify_module

    context = SubnetContext.build(fabric)
    current: Computation = context.compute(engine, ForwardingOptions(), {}, 1)
    calls: list[bool] = []
    original = verify_module.ColumnFigures.carry

    def counting(self: verify_module.ColumnFigures, *args: object) -> verify_module.ColumnFigures | None:
        found = original(self, *args)  # type: ignore[arg-type]
        if found is not None:  # carried over; True when across a lost switch (the others renumbered)
            calls.append(self.subnet.n_switches != found.subnet.n_switches)
        return found

    verify_module.ColumnFigures.carry = counting  # type: ignore[method-assign,assignment]
    try:
        for step, (what, down) in enumerate(faultwalk.walk(fabric, seed, steps)):
            following = context.compute(engine, ForwardingOptions(), down, step + 2, current)
            for alternatives in (False, True):
                for vls in (1, 2):
                    fresh = verify_module.verify(following.tables, vls=vls, alternatives=alternatives)
                    again = verify_module.verify(
                        following.tables, vls=vls, alternatives=alternatives, previous=current.verification
                    )
                    assert again == fresh, (step, what, alternatives, vls)
            current = following
    finally:
        verify_module.ColumnFigures.carry = original  # type: ignore[method-assign]
    return len(calls), calls.count(True)


@pytest.mark.parametrize(
    "fabric", [fat_tree(8), opensm_fat_tree(8), rail(4, 4, groups=2)], ids=lambda f: f.name
)
@pytest.mark.parametrize("engine", ["ftree", "sssp", "updn"])
def test_an_incremental_verification_equals_one_from_scratch(
    fabric: Fabric, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controller.sm import verify as verify_module

    # every change carried over, however many columns it redoes (a k=8 switch loss moves ~half of them,
    # above the share where the controller walks everything instead): equal all the same
    monkeypatch.setattr(verify_module, "INCREMENTAL_MAX_SHARE", 1.0)
    carried, across_a_lost_switch = _verification_walk(fabric, engine, seed=5, steps=10)
    assert carried > 0
    if fabric.name == "fat-tree-k8":
        assert across_a_lost_switch > 0


def test_an_incremental_verification_sees_a_route_into_a_cut_cable() -> None:
    """The same tables on a fabric with one of their cables cut: the columns routed over it are walked
    again (their entries did not change) and come out dead; from scratch says the same."""
    from controller.sm.engines import default_registry
    from controller.sm.subnet import Subnet
    from controller.sm.tables import RoutingTables
    from controller.sm.verify import verify

    fabric = fat_tree(4)
    tables = default_registry().create("ftree").route(Subnet.build(fabric))
    before = verify(tables)
    cut = Subnet.build(fabric.without(links=[faultwalk.switch_links(fabric)[0]]), tables.subnet.lids)
    stale = RoutingTables(tables.engine, cut, tables.lft, tables.alt)
    again = verify(stale, previous=before)
    assert again == verify(stale) and not again.ok and again.dead_entries > 0


@pytest.mark.slow
def test_an_incremental_verification_equals_one_from_scratch_on_opensms_k16() -> None:
    from tests.conftest import DATA
    from topologies.ibnet import load_ibnet

    fabric = load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz")
    assert _verification_walk(fabric, "ftree", seed=2, steps=3)[0] > 0


def test_an_incremental_verification_follows_shortest_distances_that_grew() -> None:
    """Up*/down* on a torus is not minimal: a route may avoid a cable whose cut still lengthens the
    shortest path it is compared with.  Each cable of a 5x5 torus cut under the same tables: incremental
    equals from scratch (the 'longer than shortest' figures change without any entry changing)."""
    from controller.sm.engines import default_registry
    from controller.sm.subnet import Subnet
    from controller.sm.tables import RoutingTables
    from controller.sm.verify import verify
    from topologies.direct import torus

    fabric = torus(5, 5)
    tables = default_registry().create("updn").route(Subnet.build(fabric))
    before = verify(tables, vls=2)
    grew = 0
    for index in faultwalk.switch_links(fabric):
        cut = Subnet.build(fabric.without(links=[index]), tables.subnet.lids)
        stale = RoutingTables(tables.engine, cut, tables.lft, tables.alt)
        fresh = verify(stale, vls=2)
        assert verify(stale, vls=2, previous=before) == fresh, index
        grew += fresh.mean_shortest_hops > before.mean_shortest_hops
    assert grew > 0


def test_forgetting_ports_drops_every_sighting_to_or_from_them() -> None:
    """`Discovery.forget_ports` (an index of receivers) against the plain definition, on random sightings
    (including two senders seen toward one port, which `links_seen` never keeps but a state may hold)."""
    import random

    from controller.sm.validation import Discovery

    rng = random.Random(4)
    refs = [PortRef(f"s{i}", p) for i in range(6) for p in (1, 2, 3)]
    for _ in range(200):
        seen = {src: (rng.choice(refs), float(i)) for i, src in enumerate(rng.sample(refs, 10))}
        discovery = Discovery(seen=seen)
        gone = rng.sample(refs, rng.randint(0, 4))
        want = {k: v for k, v in seen.items() if k not in gone and v[0] not in gone}
        got = discovery.forget_ports(gone)
        assert dict(got.seen) == want
        assert (got is discovery) == (want == seen)


@pytest.mark.parametrize("policy", ["static", "ecmp"])
def test_group_users_counted_at_compile_equal_a_count_over_the_flows(policy: str) -> None:
    from collections import Counter

    context = SubnetContext.build(fat_tree(8))
    computation = context.compute("ftree", ForwardingOptions(policy=policy), {}, 1)
    for program in computation.programs.values():
        counted = Counter(int(a[1]) for f in program.flows.values() for a in f.actions if a[0] == "group")
        assert "group_users" in program.__dict__ and program.group_users == counted


@pytest.mark.parametrize(
    "fabric", [fat_tree(8), opensm_fat_tree(8), rail(4, 4, groups=2)], ids=lambda f: f.name
)
def test_ftree_routes_the_same_with_and_without_the_last_routings_candidates(fabric: Fabric) -> None:
    """`candidate_reuse` takes the candidates of switches a change did not reach from the last routing:
    along walks of cuts, restores and switch losses every routing equals one made with no memo."""
    from controller.sm.engines import candidate_reuse, default_registry
    from controller.sm.lids import LidMap, assign_lids
    from controller.sm.subnet import Subnet

    engine = default_registry().create("ftree")
    context = SubnetContext.build(fabric)
    for seed in range(3):
        candidate_reuse.forget()
        lids: LidMap | None = None
        for step, (what, down) in enumerate(faultwalk.walk(fabric, seed, 12)):
            live, _ = context.live_fabric(down)
            lids = assign_lids(live, previous=lids)
            subnet = Subnet.build(live, lids)
            remembered = engine.route(subnet)
            kept = list(candidate_reuse._recent)
            candidate_reuse.forget()
            fresh = engine.route(subnet)
            candidate_reuse._recent.extend(kept)
            assert np.array_equal(remembered.lft, fresh.lft), (seed, step, what)
            assert np.array_equal(remembered.alt, fresh.alt), (seed, step, what)


def _slots_one_switch_at_a_time(
    subnet: Subnet, rank: npt.NDArray[np.int32], up: npt.NDArray[np.bool_], pos: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """`hostorder.uplink_slots` by its definition: per group, its members' (parent position, k-th
    parallel cable) pairs, sorted; each uplink's slot is its pair's index among them."""
    from controller.sm.hostorder import _group_labels

    n, width = subnet.n_switches, subnet.n_ports
    far = np.where(subnet.nbr >= 0, subnet.nbr, n)
    padded = np.append(pos, n)
    slots = np.full((n, width), -1, dtype=np.int64)
    group_uplinks = np.zeros(n, dtype=np.int64)
    for r in range(1, int(rank.max(initial=0)) + 1):
        members = np.flatnonzero(rank == r)
        label = _group_labels(np.where(up[members], far[members], n), n)
        for group in set(label.tolist()):
            keyed = {}
            for s in members[label == group].tolist():
                seen: dict[int, int] = {}
                row = []
                for p in sorted(np.flatnonzero(up[s]).tolist(), key=lambda p: (int(padded[far[s, p]]), p)):
                    parent = int(padded[far[s, p]])
                    seen[parent] = seen.get(parent, -1) + 1
                    row.append((p, (parent, seen[parent])))
                keyed[s] = row
            index = {
                key: i for i, key in enumerate(sorted({key for row in keyed.values() for _, key in row}))
            }
            for s, row in keyed.items():
                group_uplinks[s] = len(index)
                for p, key in row:
                    slots[s, p] = index[key]
    return slots, group_uplinks


@pytest.mark.parametrize(
    "fabric", [fat_tree(8), opensm_fat_tree(8), rail(4, 4, groups=2)], ids=lambda f: f.name
)
def test_uplink_slots_match_their_definition_on_intact_and_damaged_fabrics(fabric: Fabric) -> None:
    from controller.sm.hostorder import switch_positions, uplink_slots
    from controller.sm.orientation import orient
    from controller.sm.subnet import Subnet
    from topologies.faults import degrade

    for seed in range(5):
        live = fabric if seed == 0 else degrade(fabric, 2 * seed, seed % 2, seed=seed).fabric
        subnet = Subnet.build(live)
        o = orient(subnet, "exclude")
        pos = switch_positions(subnet, o.rank, o.ud.up)
        slots, counts = uplink_slots(subnet, o.rank, o.ud.up, pos)
        want_slots, want_counts = _slots_one_switch_at_a_time(subnet, o.rank, o.ud.up, pos)
        assert np.array_equal(slots, want_slots), seed
        assert np.array_equal(counts, want_counts), seed


def _cut_flow_mods(
    fabric: Fabric, link: int
) -> tuple[int, dict[str, SwitchProgram], dict[str, SwitchProgram]]:
    """Flow-mods of cutting `link` through the controller's core against fake switches (which must then
    hold what it wants and deliver every pair), and the programs before and after."""
    from tests.core_driver import CoreDriver

    driver = CoreDriver(fabric)
    driver.start()
    driver.connect_all()
    assert driver.state.current is not None
    before = dict(driver.state.current.programs)
    driver.now = 10.0
    steps = driver.set_link(link, up=False)
    driver.assert_holds_desired()
    driver.fake.assert_delivers(driver.fake.all_pairs())
    assert driver.state.current is not None
    records = [r for s in steps for r in s.records if r.kind == "port_down"]
    return sum(r.flow_mods or 0 for r in records), before, dict(driver.state.current.programs)


def test_a_leaf_that_loses_an_uplink_modifies_its_groups_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leaf's uplink cut changes its alternatives toward every destination: compiled whole, each new
    fast-failover group takes the id of the group it replaces (`compile._keep_group_ids`), so the entries
    that kept their port are not rewritten.  Fewer flow-mods than with content-addressed ids only, the
    same forwarding (every pair delivered, the switches hold what the controller wants)."""
    from controller.sm import compile as compiler

    fabric = fat_tree(8)
    link = next(
        i for i in faultwalk.switch_links(fabric) if "leaf" in fabric.links[i].a.node + fabric.links[i].b.node
    )
    leaf = next(end.node for end in (fabric.links[link].a, fabric.links[link].b) if "leaf" in end.node)
    renamed, before, after = _cut_flow_mods(fabric, link)
    kept = {
        key
        for key, flow in after[leaf].flows.items()
        if key in before[leaf].flows and before[leaf].flows[key].actions == flow.actions
    }
    modified = {
        gid
        for gid, g in after[leaf].groups.items()
        if gid in before[leaf].groups and before[leaf].groups[gid] != g
    }
    assert modified and len(kept) > len(after[leaf].flows) // 2
    monkeypatch.setattr(compiler, "_keep_group_ids", lambda new, old: new)
    addressed, _, _ = _cut_flow_mods(fabric, link)
    assert renamed < addressed
