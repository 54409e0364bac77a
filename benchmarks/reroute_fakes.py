"""Reroute latency of the controller's own code at k=8 and k=16, on fake switches that decode the real
OpenFlow bytes (`tests.fakes`): detection -> tables installed on every affected switch (the make phase
confirmed), for switch-to-switch cable cuts, their restores, and whole switch losses; and how many
flow-mods each sent beside a full reinstall of the fabric.  `restore` brings back the cable just cut: the
fabric returns to a state the controller routed moments ago, and the routing comes from its recent ones
(`SubnetContext.recent`); `restore_unseen` brings back the first of two cut cables, a fabric not routed
lately (routed and verified in full).

No Open vSwitch: `installed_ms` is the controller's computation, rollout diff and OpenFlow encoding plus
the fakes' decoding of every message with os-ken's parser (~70 us each), on one core;
`installed_ms_less_fake_decoding` leaves the decoding out — the controller's own share.  A real fabric
adds the switches' own time instead (`flow_rate` of `benchmarks.controlplane`: ~130,000 flow-mods/s per
switch, in parallel across switches).

Each fabric runs under the interpreter's own garbage-collection policy (`k16_gc_cpython`: the baseline)
and under the controller's (`k16`: `controller.heap`, what `fabriclab controller` runs by default: the
heap frozen after every event, port changes handled `hurried`).

    python -m benchmarks.reroute_fakes --out benchmarks/results/reroute-fakes.json [--ks 8,16] [--n 20]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import time
from collections.abc import Callable
from typing import Any

from benchmarks.out import emit, out_file, percentiles
from controller.core.events import Event, Phase, PortChange, PortsChanged, Push
from controller.heap import Heap
from tests import fakes
from tests.core_driver import CoreDriver
from topologies.generators import fat_tree
from topologies.model import Fabric, Link


class _Timed(CoreDriver):
    """The driver, noting when each rollout's make phase was confirmed (wall clock: its last wave) and how
    long the fake switches spent decoding and applying until then (os-ken's parser: ~70 us a flow-mod, a
    cost of the test bench, not of the controller)."""

    made_at: float | None = None
    #: Called once an event is handled (the controller's heap policy, when benchmarked with it).
    after_feed: Callable[[], None] = staticmethod(lambda: None)
    #: Around each event (the heap policy's `hurried`, as the controller's worker does for port changes).
    around_feed: Callable[[], contextlib.AbstractContextManager[None]] = staticmethod(contextlib.nullcontext)
    made_decoding_s = 0.0
    #: The break phase has started (later make pushes belong to another rollout).
    broken = False

    def push(self, command: Push) -> Event:
        outcome = super().push(command)
        if command.phase is Phase.BREAK:
            self.broken = True
        if command.phase is Phase.MAKE and not self.broken:
            self.made_at = time.perf_counter()
            self.made_decoding_s = _decoding[0]
        return outcome


_decoding = [0.0]
_receive = fakes.FakeSwitch.receive


def _timed_receive(self: fakes.FakeSwitch, data: bytes) -> int:
    started = time.perf_counter()
    try:
        return _receive(self, data)
    finally:
        _decoding[0] += time.perf_counter() - started


fakes.FakeSwitch.receive = _timed_receive  # type: ignore[method-assign]


def _changes(driver: CoreDriver, links: list[Link], live: bool, at: float) -> PortsChanged:
    dpids = driver.sb.dpids
    ends = [end for link in links for end in (link.a, link.b) if end.node in dpids]
    return PortsChanged(tuple(PortChange(dpids[e.node], e.port, live, at) for e in ends))


def _feed(driver: _Timed, event: PortsChanged, at: float) -> tuple[float, float, int, int]:
    """(ms until the make phase was confirmed; the same less the fakes' decoding: the controller's share;
    flow-mods sent; switches updated)."""
    driver.made_at = None
    driver.broken = False
    _decoding[0] = 0.0
    driver.made_decoding_s = 0.0
    started = time.perf_counter()
    with driver.around_feed():
        steps = driver.feed(event, now=at)
        driver.after_feed()  # as the controller's worker does once an event is handled (not timed)
    made = driver.made_at if driver.made_at is not None else time.perf_counter()
    if driver.made_at is None:
        driver.made_decoding_s = _decoding[0]
    records = [r for s in steps for r in s.records if r.kind in ("port_down", "port_up")]
    wall_ms = (made - started) * 1000
    return (
        wall_ms,
        wall_ms - driver.made_decoding_s * 1000,
        sum(r.flow_mods or 0 for r in records),
        max((r.switches_updated or 0 for r in records), default=0),
    )


def run(k: int, n: int, seed: int, gc_policy: str = "frozen") -> dict[str, Any]:
    """`gc_policy`: "frozen" is what `fabriclab controller` runs with by default (`controller.heap`: the
    live heap frozen after every event the worker handles, no automatic full collections); "cpython" is
    the interpreter's own policy, the baseline."""
    heap = Heap() if gc_policy == "frozen" else None
    if heap is not None:
        heap.install()
    try:
        return _run(k, n, seed, heap) | {"gc": gc_policy}
    finally:
        if heap is not None:
            heap.uninstall()
        gc.collect()


def _run(k: int, n: int, seed: int, heap: Heap | None) -> dict[str, Any]:
    fabric: Fabric = fat_tree(k)
    driver = _Timed(fabric)
    started = time.perf_counter()
    driver.start()
    driver.connect_all()
    bring_up_s = time.perf_counter() - started
    if heap is not None:
        driver.after_feed = heap.settled
        driver.around_feed = heap.hurried
    current = driver.state.current
    assert current is not None
    full = sum(len(p.flows) + len(p.groups) for p in current.programs.values())
    rng = random.Random(seed)
    cables = [
        lk for lk in fabric.links if fabric.nodes[lk.a.node].is_switch and fabric.nodes[lk.b.node].is_switch
    ]
    switches = [s.name for s in fabric.switches if not any(
        fabric.nodes[lk.a.node].is_host or fabric.nodes[lk.b.node].is_host
        for lk in fabric.links if s.name in (lk.a.node, lk.b.node))]  # fmt: skip
    rows: dict[str, list[tuple[float, float, int, int]]] = {
        "cut": [],
        "restore": [],
        "restore_unseen": [],
        "switch_loss": [],
        "switch_back": [],
    }
    leaves = {lk.b.node if fabric.nodes[lk.a.node].is_host else lk.a.node for lk in fabric.links
              if fabric.nodes[lk.a.node].is_host or fabric.nodes[lk.b.node].is_host}  # fmt: skip
    cut_at: dict[str, list[float]] = {"leaf_uplink": [], "above_leaves": []}  # controller's share, ms
    clock = 100.0
    for _ in range(n):
        link = rng.choice(cables)
        clock += 1.0
        rows["cut"].append(_feed(driver, _changes(driver, [link], False, clock), clock))
        at_leaf = link.a.node in leaves or link.b.node in leaves
        cut_at["leaf_uplink" if at_leaf else "above_leaves"].append(rows["cut"][-1][1])
        clock += 1.0
        rows["restore"].append(_feed(driver, _changes(driver, [link], True, clock), clock))
    # A restore that leads to a fabric not routed lately (two cables down, the first comes back): its
    # routing cannot come from the controller's recent routings, unlike the restore of the cable just cut.
    for _ in range(n):
        first, second = rng.sample(cables, 2)
        clock += 1.0
        _feed(driver, _changes(driver, [first], False, clock), clock)
        clock += 1.0
        _feed(driver, _changes(driver, [second], False, clock), clock)
        clock += 1.0
        rows["restore_unseen"].append(_feed(driver, _changes(driver, [first], True, clock), clock))
        clock += 1.0
        _feed(driver, _changes(driver, [second], True, clock), clock)
    for _ in range(n):
        name = rng.choice(switches)
        theirs = [lk for lk in fabric.links if name in (lk.a.node, lk.b.node)]
        clock += 1.0
        rows["switch_loss"].append(_feed(driver, _changes(driver, theirs, False, clock), clock))
        clock += 1.0
        rows["switch_back"].append(_feed(driver, _changes(driver, theirs, True, clock), clock))
    return {
        "fabric": fabric.summary(),
        "switches": "fake switches decoding the real OpenFlow 1.3 bytes (tests.fakes), one process",
        "bring_up_s": round(bring_up_s, 1),
        "full_reinstall_messages": full,
        **{
            kind: {
                "installed_ms": percentiles([r[0] for r in got], digits=1),
                "installed_ms_less_fake_decoding": percentiles([r[1] for r in got], digits=1),
                "flow_mods": percentiles([float(r[2]) for r in got], digits=1),
                "switches_updated": percentiles([float(r[3]) for r in got], digits=1),
                "flow_mods_vs_full_reinstall_max": round(max(r[2] for r in got) / full, 4),
            }
            for kind, got in rows.items()
        },
        # the cuts by where the cable was: a leaf's uplink changes the leaf's whole table (it is compiled
        # whole) and every other leaf's alternatives toward it; higher up, fewer switches change
        "cut_by_place_ms_less_fake_decoding": {
            place: percentiles(got, digits=1) if got else None for place, got in cut_at.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="8,16")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gc", default="cpython,frozen", help="heap policies to run, in this order")
    parser.add_argument("--out", type=out_file)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "benchmark": "reroute_fakes",
        "machine": {"cpus": os.cpu_count(), "load_before": list(os.getloadavg())},
        "results": {
            f"k{k}" + ("" if policy == "frozen" else "_gc_cpython"): run(int(k), args.n, args.seed, policy)
            for k in args.ks.split(",")
            for policy in args.gc.split(",")
        },
    }
    report["machine"]["load_after"] = list(os.getloadavg())
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
