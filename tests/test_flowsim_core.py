"""The simulator's core: the max-min solver against an independent reference and the definition of
max-min fairness, routes against the controller's own tables, collectives against the planners, and
lockstep extrapolation against plain simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.sm.engines import default_registry
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import SubnetManager
from controller.sm.subnet import Subnet
from flowsim.engine import SimConfig, Simulator
from flowsim.maxmin import Allocation, max_min
from flowsim.network import Network, route_fabric
from flowsim.routes import SlotPick, five_tuple_hash, spray, walk
from flowsim.slots import SlotTables
from flowsim.workload import Workload, pairwise_alltoall, ring
from topologies.generators import fat_tree, leaf_spine, rail
from traffic.patterns import allgather_ring, alltoall, reduce_scatter_ring, ring_allreduce


def naive_max_min(
    cap: list[float], paths: list[dict[int, float]], mult: list[float], caps: list[float]
) -> list[float]:
    """Textbook water-filling, one flow and one link at a time (slow, obviously right)."""
    rate = [0.0] * len(paths)
    active = set(range(len(paths)))
    while active:
        use: dict[int, float] = {}
        for f in active:
            for link, w in paths[f].items():
                use[link] = use.get(link, 0.0) + mult[f] * w
        left = {
            link: cap[link] - sum(rate[f] * mult[f] * paths[f].get(link, 0.0) for f in range(len(paths)))
            for link in use
        }
        step = min(*(left[link] / u for link, u in use.items()), *(caps[f] - rate[f] for f in active))
        for f in active:
            rate[f] += step
        done = {f for f in active if math.isfinite(caps[f]) and caps[f] - rate[f] <= 1e-9 * caps[f]}
        for link, u in use.items():
            if left[link] - step * u <= 1e-9 * cap[link]:
                done |= {f for f in active if link in paths[f]}
        active -= done
    return rate


Instance = tuple[np.ndarray, list[dict[int, float]], np.ndarray, np.ndarray]


def random_instance(rng: np.random.Generator, n_flows: int, n_links: int) -> Instance:
    cap = rng.choice([100.0, 200.0, 400.0], n_links)
    paths = []
    for _ in range(n_flows):
        links = rng.choice(n_links, size=int(rng.integers(1, 5)), replace=False)
        weights = rng.choice([1.0, 0.5, 0.25], size=links.size)
        paths.append({int(link): float(w) for link, w in zip(links, weights, strict=True)})
    mult = rng.choice([1.0, 1.0, 3.0, 32.0], n_flows)
    caps = np.where(rng.random(n_flows) < 0.2, rng.uniform(1, 50, n_flows), np.inf)
    return cap, paths, mult, caps


def solve(cap: np.ndarray, paths: list[dict[int, float]], mult: np.ndarray, caps: np.ndarray) -> Allocation:
    indptr = np.zeros(len(paths) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(p) for p in paths])
    links = np.array([link for p in paths for link in p], dtype=np.int32)
    weight = np.array([w for p in paths for w in p.values()])
    return max_min(np.asarray(cap), indptr, links, weight, np.asarray(mult), np.asarray(caps))


@pytest.mark.parametrize("seed", range(12))
def test_solver_equals_textbook_water_filling(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cap, paths, mult, caps = random_instance(
        rng, n_flows=int(rng.integers(5, 60)), n_links=int(rng.integers(5, 25))
    )
    got = solve(cap, paths, mult, caps).rate
    want = naive_max_min(cap.tolist(), paths, mult.tolist(), caps.tolist())
    assert np.allclose(got, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_solver_meets_the_definition_of_max_min(seed: int) -> None:
    """Feasible, and every flow is at its cap or crosses a saturated link on which nobody gets more."""
    rng = np.random.default_rng(100 + seed)
    cap, paths, mult, caps = random_instance(rng, 300, 40)
    alloc = solve(cap, paths, mult, caps)
    rate, load = alloc.rate, alloc.load
    assert (load <= cap * (1 + 1e-9)).all()
    saturated = load >= cap * (1 - 1e-7)
    for f, path in enumerate(paths):
        if rate[f] >= caps[f] * (1 - 1e-9):
            continue
        ok = [
            link
            for link in path
            if saturated[link]
            and all(rate[g] <= rate[f] * (1 + 1e-7) for g, q in enumerate(paths) if link in q)
        ]
        assert ok, f"flow {f} at {rate[f]} has no bottleneck"


def test_static_routes_are_the_controllers_paths() -> None:
    """Host pairs of a k=4 fat-tree: the simulator's static route is `RoutingTables.path`, link by link."""
    net = Network.build(fat_tree(4))
    routing = route_fabric(net, "ftree")
    tables = default_registry().create("ftree").route(Subnet.build(net.fabric))
    n = net.n_hosts
    src, dst = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
    keep = src != dst
    src, dst = src[keep].astype(np.int32), dst[keep].astype(np.int32)
    routes = walk(routing, src, dst, None)
    assert routes.ok.all()
    names = [e.node for e in net.subnet.endpoints]
    for i in range(0, src.size, 7):
        hops = tables.path(names[src[i]], names[dst[i]])
        expected = [
            f"{h.node}:{h.out_port}"
            for h in hops
            if h.out_port is not None and h.node.startswith(("leaf", "agg", "core"))
        ]
        got = [str(net.tail[link]) for link in routes.links[routes.indptr[i] : routes.indptr[i + 1]]]
        assert got == expected


def test_pinned_flows_take_the_path_the_controller_gives_their_source_port() -> None:
    """Under a multipath policy a flow that keeps its UDP source port sits in one slot of every slot table
    it crosses: the simulator's route is, link by link, the path the controller itself reports for that
    port (`SubnetContext.route(..., sport)`, what the emulated switches do) — so both instruments see the
    same ECMP collisions."""
    fabric = fat_tree(8)
    net = Network.build(fabric)
    routing = route_fabric(net, "ftree")
    tables = SlotTables(routing, {})
    manager = SubnetManager(fabric, "ftree", ForwardingOptions(policy="ecmp"))
    computation = manager.compute()
    rng = np.random.default_rng(3)
    src = rng.integers(0, net.n_hosts, 400).astype(np.int32)
    dst = ((src + rng.integers(1, net.n_hosts, 400)) % net.n_hosts).astype(np.int32)
    sport = (0xC000 | rng.integers(0, 1 << 14, 400)).astype(np.int32)
    pinned = walk(routing, src, dst, SlotPick(tables, sport, five_tuple_hash(routing, src, dst, sport, 7)))
    names = [e.node for e in net.subnet.endpoints]
    for i in range(400):
        hops = manager.context.route(computation, names[src[i]], names[dst[i]], int(sport[i]))
        expected = [
            f"{h.node}:{h.out_port}"
            for h in hops
            if h.out_port is not None and h.node in net.subnet.switch_index
        ]
        got = [str(net.tail[link]) for link in pinned.links[pinned.indptr[i] : pinned.indptr[i + 1]]]
        assert got == expected, (names[src[i]], names[dst[i]], int(sport[i]))
    spread = {len({pinned.links[pinned.indptr[i]] for i in range(400) if src[i] == s}) for s in range(8)}
    assert max(spread) > 1  # different ports of one host take different uplinks


def test_sprayed_flows_split_as_the_slots_do() -> None:
    """A sprayed flow splits over a set's ports in proportion to their slots: 16 slots over 3 ports are
    6/5/5, not thirds; over 2 ports, halves at every level."""
    net = Network.build(fat_tree(8))
    routing = route_fabric(net, "ftree")
    tables = SlotTables(routing, {})
    rng = np.random.default_rng(4)
    src = rng.integers(0, net.n_hosts, 300).astype(np.int32)
    dst = ((src + rng.integers(1, net.n_hosts, 300)) % net.n_hosts).astype(np.int32)
    sprayed = spray(routing, src, dst, tables)
    static = walk(routing, src, dst, None)
    hops = np.diff(static.indptr)
    for i in range(300):  # fractions sum to 1 per hop level, over as many levels as the shortest path
        w = sprayed.weight[sprayed.indptr[i] : sprayed.indptr[i + 1]]
        assert w.sum() == pytest.approx(hops[i])
    three = leaf_spine(2, 3, 1)  # 3 spines: leaf sets of 3 ports
    net3 = Network.build(three)
    routing3 = route_fabric(net3, "ftree")
    one = spray(routing3, net3.hosts(["h1"]), net3.hosts(["h2"]), SlotTables(routing3, {}))
    up = sorted(np.round(one.weight[:3] * 16).astype(int).tolist())
    assert up == [5, 5, 6]


@pytest.mark.parametrize(
    ("native", "planner", "n"),
    [
        ("allreduce-ring", ring_allreduce, 8),
        ("allgather", allgather_ring, 7),
        ("reduce-scatter", reduce_scatter_ring, 5),
    ],
)
def test_native_ring_steps_equal_the_planners(native: str, planner: object, n: int) -> None:
    ranks = np.arange(n, dtype=np.int32)
    size = 1_000_003  # not divisible: chunk sizes differ by a byte, exactly as the planner splits them
    made = ring("x", native, ranks, size)
    plan = planner([f"h{i}" for i in range(n)], size)  # type: ignore[operator]
    assert made.n_steps == plan.n_steps
    for s, step in enumerate(plan.steps):
        src, dst, nbytes = made.step(s)
        assert sorted(zip(src.tolist(), dst.tolist(), nbytes.astype(int).tolist(), strict=True)) == sorted(
            (int(t.src[1:]), int(t.dst[1:]), t.size_bytes) for t in step
        )


def test_native_pairwise_alltoall_equals_the_planner() -> None:
    n, size = 6, 600_001
    made = pairwise_alltoall("x", np.arange(n, dtype=np.int32), size)
    plan = alltoall([f"h{i}" for i in range(n)], size)
    for s, step in enumerate(plan.steps):
        src, dst, nbytes = made.step(s)
        assert list(zip(src.tolist(), dst.tolist(), nbytes.astype(int).tolist(), strict=True)) == [
            (int(t.src[1:]), int(t.dst[1:]), t.size_bytes) for t in step
        ]


@pytest.mark.parametrize("policy", ["static", "spray"])
def test_lockstep_extrapolation_is_exact(policy: str) -> None:
    """A ring simulated step by step and one extrapolated over its lockstep runs end at the same time with
    the same flow completion times."""
    fab = rail(servers=8, gpus=4, groups=2)
    net = Network.build(fab)
    hosts = net.hosts([h.name for h in fab.hosts])
    work = Workload(collectives=(ring("ar", "allreduce-ring", hosts, 2**26),))
    fast = Simulator(net, work, SimConfig(policy=policy, seed=2)).run()
    slow = Simulator(net, work, SimConfig(policy=policy, seed=2, lockstep=False)).run()
    assert fast.stats["skipped_steps"] > 0 and slow.stats["skipped_steps"] == 0
    assert fast.end_s == pytest.approx(slow.end_s, rel=1e-9)
    assert fast.flows.mult.sum() == slow.flows.mult.sum() == 64 * 2 * 63
    for q in (1, 50, 99):
        a = np.percentile(np.repeat(fast.flows.fct_s, fast.flows.mult.astype(int)), q)
        b = np.percentile(np.repeat(slow.flows.fct_s, slow.flows.mult.astype(int)), q)
        assert a == pytest.approx(b, rel=1e-9)


def test_collective_steps_wait_for_both_ranks() -> None:
    """Pairwise all-to-all on a single switch: every step is a line-rate shift, so n-1 steps take exactly
    (n-1) chunk times under any policy; per-rank dependencies never let a step overlap the previous one."""
    net = Network.build(leaf_spine(1, 1, 8))
    size = 8 * 10**6
    work = Workload(collectives=(pairwise_alltoall("a2a", net.hosts([f"h{i}" for i in range(1, 9)]), size),))
    result = Simulator(net, work, SimConfig(policy="ecmp")).run()
    chunk_s = size / 8 / (400e9 / 8)
    assert result.end_s == pytest.approx(7 * chunk_s, rel=1e-9)
    assert result.groups[0].end_s == pytest.approx(result.end_s)
