"""Routing policies as the switches see them: slot tables, what each policy's packets do, failover under
every policy, per-class exceptions, and the deadlock check over every alternative path.

Packets are traced through fake switches that decode the real OpenFlow bytes (`tests.fakes`)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from controller.sm.compile import failover_ports, switch_levels
from controller.sm.intents import SLOT_TABLE, ForwardingOptions, GroupKind, rollout
from controller.sm.manager import SubnetManager
from controller.sm.policies import SLOTS, even_assignment, slot_shift
from controller.sm.tables import RoutingTables
from controller.sm.verify import verify
from tests.core_driver import CoreDriver
from tests.fakes import NotDelivered
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.loader import parse_topology
from topologies.model import Fabric
from traffic.entropy import flow_sport, spray_sport


def driven(fabric: Fabric, options: ForwardingOptions, engine: str = "ftree") -> CoreDriver:
    d = CoreDriver(fabric, engine=engine, options=options)
    d.start()
    d.connect_all()
    return d


def first_hop(d: CoreDriver, src: str, dst: str, sport: int | None, dscp: int = 0) -> list[str]:
    return d.fake.trace(src, dst, udp_src=sport, dscp=dscp)


def uplinks_used(path: list[str]) -> tuple[str, ...]:
    """The switch hops of a traced path ("in>switch>out")."""
    return tuple(p for p in path[1:-1])


def test_legacy_multipath_flag_means_ecmp() -> None:
    assert ForwardingOptions(multipath=True) == ForwardingOptions(policy="ecmp")
    assert ForwardingOptions(policy="spray").multipath
    assert not ForwardingOptions().multipath and ForwardingOptions().policy == "static"
    assert ForwardingOptions(policy="static", classes=((26, "spray"),)).slot_tables


def test_slot_tables_on_a_k4_fat_tree() -> None:
    fabric = fat_tree(4)
    sm = SubnetManager(fabric, options=ForwardingOptions(policy="spray"))
    c = sm.recompute()
    levels = dict(zip(c.tables.subnet.switch_names, switch_levels(c.tables.subnet).tolist(), strict=True))
    assert {levels[n] for n in levels if n.startswith("leaf")} == {0}
    assert {levels[n] for n in levels if n.startswith("agg")} == {1}
    assert {levels[n] for n in levels if n.startswith("core")} == {2}
    # leaves and aggregation switches have one set each (their uplinks); cores have none (one way down)
    assert set(c.weights) == {n for n in levels if not n.startswith("core")}
    for name, sets in c.weights.items():
        ((ports, assignment),) = sets.items()
        assert len(ports) == 2 and assignment == even_assignment(ports)
        slots = [f for f in c.programs[name].flows.values() if f.table == SLOT_TABLE and f.priority == 100]
        assert len(slots) == SLOTS
        mask = dict(slots[0].match)["udp_src_mask"]
        assert mask == (SLOTS - 1) << slot_shift(levels[name])  # each level reads its own window
    leaf = c.programs["leaf1"]
    kinds = Counter(g.kind for g in leaf.groups.values())
    assert kinds == {GroupKind.FAST_FAILOVER: 2, GroupKind.SELECT: 1}


def test_failover_buckets_rotate_through_the_set() -> None:
    assert failover_ports(4, (3, 4, 5, 6)) == (4, 5, 6, 3)
    assert failover_ports(3, (3, 4)) == (3, 4)


@pytest.mark.parametrize("policy", ["ecmp", "spray", "adaptive"])
def test_sprayed_packets_split_exactly_evenly_at_every_level(policy: str) -> None:
    """A sender cycling its source port (traffic.entropy.spray_sport) over 256 packets puts exactly half of
    them on each leaf uplink and, of those, half on each aggregation uplink: 64 per core path."""
    fabric = fat_tree(4)
    d = driven(fabric, ForwardingOptions(policy=policy))
    paths = Counter(uplinks_used(first_hop(d, "h1", "h16", spray_sport(i))) for i in range(256))
    assert len(paths) == 4 and set(paths.values()) == {64}


def test_ecmp_keeps_a_flow_on_one_path_and_flows_collide_like_hashing() -> None:
    fabric = fat_tree(4)
    d = driven(fabric, ForwardingOptions(policy="ecmp"))
    for flow in range(8):
        sport = flow_sport(0x100 + flow, 0x200 + flow)
        assert len({uplinks_used(first_hop(d, "h1", "h16", sport)) for _ in range(5)}) == 1
    # 64 flows of one source (RoCE source ports from QP numbers): every path used, not evenly (a hash)
    per_path = Counter(
        uplinks_used(first_hop(d, "h1", "h16", flow_sport(0x100 + q, 0x300 + q))) for q in range(64)
    )
    assert len(per_path) == 4 and max(per_path.values()) > 16 > min(per_path.values())


def test_static_ignores_the_source_port() -> None:
    d = driven(fat_tree(4), ForwardingOptions())
    assert len({uplinks_used(first_hop(d, "h1", "h16", spray_sport(i))) for i in range(64)}) == 1


@pytest.mark.parametrize("policy", ["static", "ecmp", "spray", "adaptive"])
def test_fast_failover_carries_every_slot_of_a_cut_uplink_before_the_controller_reacts(policy: str) -> None:
    fabric = fat_tree(4)
    d = driven(fabric, ForwardingOptions(policy=policy))
    cut = next(i for i, lk in enumerate(fabric.links) if {lk.a.node, lk.b.node} == {"leaf1", "agg1"})
    d.fake.set_link(cut, up=False)  # the controller has not heard of it
    sports = [spray_sport(i) for i in range(64)]
    pairs = [("h1", "h16"), ("h2", "h5"), ("h1", "h3")]
    assert d.fake.assert_delivers(pairs, (0, 1), [None, *sports]) == 3 * 2 * 65
    d.set_link(cut, up=False)  # now it has: the reroute keeps everything delivered
    d.fake.assert_delivers(pairs, (0,), sports)
    d.assert_holds_desired()


def test_adaptive_weights_are_what_the_slot_table_installs() -> None:
    fabric = fat_tree(4)
    sm = SubnetManager(fabric, options=ForwardingOptions(policy="adaptive"))
    c = sm.recompute()
    ((ports, _),) = c.weights["leaf1"].items()
    skewed = tuple([ports[0]] * 12 + [ports[1]] * 4)
    moved = sm.context.reweight(c, {"leaf1": {ports: skewed}})
    assert moved.weights["leaf1"][ports] == skewed and moved.generation == c.generation
    assert moved.programs["leaf2"] is c.programs["leaf2"]  # only the reweighted switch was compiled again
    outputs = Counter(
        f.actions[0]
        for f in moved.programs["leaf1"].flows.values()
        if f.table == SLOT_TABLE and f.priority == 100
    )
    groups = moved.programs["leaf1"].groups
    firsts = Counter(groups[gid].ports[0] for (_, gid), n in outputs.items() for _ in range(n))
    assert firsts == {ports[0]: 12, ports[1]: 4}


def test_per_class_exception_keeps_one_dscp_on_the_static_path() -> None:
    fabric = fat_tree(4)
    d = driven(fabric, ForwardingOptions(policy="spray", classes=((26, "static"),)))
    sprayed = {uplinks_used(first_hop(d, "h1", "h16", spray_sport(i), dscp=0)) for i in range(64)}
    pinned = {uplinks_used(first_hop(d, "h1", "h16", spray_sport(i), dscp=26)) for i in range(64)}
    assert len(sprayed) == 4 and len(pinned) == 1 and pinned <= sprayed
    # and the other way round: a static fabric spraying one class
    d = driven(fabric, ForwardingOptions(policy="static", classes=((10, "spray"),)))
    assert len({uplinks_used(first_hop(d, "h1", "h16", spray_sport(i), dscp=10)) for i in range(64)}) == 4
    assert len({uplinks_used(first_hop(d, "h1", "h16", spray_sport(i), dscp=0)) for i in range(64)}) == 1


@pytest.mark.parametrize("fabric", [fat_tree(6), leaf_spine(6, 3, 6, parallel=2), rail(8, 8, groups=2)],
                         ids=lambda f: f.name)  # fmt: skip
def test_every_policy_delivers_every_pair_for_every_slot(fabric: Fabric) -> None:
    for policy in ("ecmp", "adaptive"):
        d = driven(fabric, ForwardingOptions(policy=policy))
        hosts = [h.name for h in fabric.hosts][:: max(1, len(fabric.hosts) // 8)]
        pairs = [(a, b) for a in hosts for b in hosts if a != b]
        sports = [spray_sport(i) for i in range(0, 256, 7)]
        assert d.fake.assert_delivers(pairs, (0,), sports) == len(pairs) * len(sports)
        assert d.state.current is not None and d.state.current.verification.ok


def test_alternatives_deadlock_check_can_fail_where_the_tables_alone_pass() -> None:
    """A ring of four switches routed one way round is acyclic; allowing both directions as alternatives
    (what a multipath policy would use) creates the cycle the check must see."""
    nodes = "".join(f"  s{i}: {{kind: switch}}\n  h{i}: {{kind: host}}\n" for i in range(4))
    links = "".join(f'  - endpoints: ["s{i}:1", "s{(i + 1) % 4}:2"]\n' for i in range(4))
    links += "".join(f'  - endpoints: ["h{i}:1", "s{i}:3"]\n' for i in range(4))
    ring = parse_topology(f"fabriclab: 1\nname: ring4\nnodes:\n{nodes}links:\n{links}")
    tables = SubnetManager(ring, engine="updn").recompute().tables
    assert verify(tables, alternatives=False).ok
    alt = tables.alt.copy()
    width = tables.subnet.n_ports
    for s in range(tables.subnet.n_switches):
        for t in range(tables.subnet.n_switches):
            if s != t:
                bits = np.zeros(width, dtype=bool)
                bits[[1, 2]] = True  # both ring directions
                alt[s, t] = np.packbits(bits)
    loose = RoutingTables(tables.engine, tables.subnet, tables.lft, alt)
    result = verify(loose, alternatives=True)
    assert result.deadlock is not None and result.deadlock.acyclic
    assert result.deadlock_alternatives is not None and not result.deadlock_alternatives.acyclic
    assert not result.ok and result.deadlock_alternatives.cycles


def test_a_fabric_without_alternatives_cannot_spray() -> None:
    fabric = leaf_spine(2, 1, 2)
    c = SubnetManager(fabric, options=ForwardingOptions(policy="spray")).recompute()
    problem = c.policy_problem()
    assert problem is not None and problem.field == "policy" and "equal-cost" in str(problem)
    with pytest.raises(NotDelivered):  # and nothing pretends otherwise: unknown hosts are not delivered
        CoreDriver(fabric).fake.trace("h1", "h4")


@pytest.mark.parametrize("policy", ["static", "ecmp", "adaptive"])
def test_the_path_the_controller_reports_for_a_source_port_is_the_one_packets_take(policy: str) -> None:
    """`/routes?sport=` (SubnetContext.route) agrees with what the switches do, for every source port tried
    and both classes, including after adaptive routing changed weights."""
    fabric = fat_tree(4)
    classes = ((26, "static"),) if policy != "static" else ()
    d = driven(fabric, ForwardingOptions(policy=policy, classes=classes))
    current = d.state.current
    assert current is not None
    if policy == "adaptive":  # skew leaf1's weights and install them on the fake switches
        ((ports, _),) = current.weights["leaf1"].items()
        current = d.context.reweight(current, {"leaf1": {ports: (ports[0],) * 13 + (ports[1],) * 3}})
        deltas = rollout(dict(d.state.installed), current.programs)
        for phase in ("make", "break"):
            assert d.sb.push({dl.dpid: dl for dl in deltas.values()}, phase) == {}
    for src, dst in [("h1", "h16"), ("h5", "h2"), ("h1", "h2"), ("h9", "h3")]:
        for i in range(0, 256, 3):
            sport = spray_sport(i)
            for dscp in (0, 26):
                hops = d.context.route(current, src, dst, sport, dscp)
                reported = [f"{h.in_port}>{h.node}>{h.out_port}" for h in hops[1:-1]]
                assert reported == d.fake.trace(src, dst, udp_src=sport, dscp=dscp)[1:-1]
