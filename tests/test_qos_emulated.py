"""QoS on real packets: a k=4 fat-tree on Mininet + userspace OVS with the policy's queues on every switch
port (`emulation.qosqueues`), two or three DSCP-marked classes into one bottleneck (h3's downlink).

The links are scaled from this machine's calibrated capacity (`k4_capacity`) so the load stays within what
the emulator carries; every run's headroom verdict says whether the emulator kept up.  What holds at any
load (shares between backlogged classes at the bottleneck, a cap) is checked always; totals only when clean.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.formats.qosload import load_policy
from emulation.mnfabric import mininet_available
from emulation.ovs import OvsDaemon
from emulation.qosrun import ClassFlow, QosBench, link_scale
from tests.conftest import ROOT
from tests.emulation_support import LOAD_SHARE, prefix_leftovers, require_emulation, unique_prefix

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
POLICY = ROOT / "scenarios" / "qos-tenants.yaml"
DURATION_S = 6.0
#: training (SL1 -> VL1, weight 192), kvcache (SL2 -> VL2, weight 64), bulk (SL3, 100 of 400 Gb/s),
#: control (SL7 -> VL7, strict): the DSCPs the policy's SL -> DSCP map gives them.
TRAIN, KV, BULK, CONTROL = 4, 8, 12, 28


def link_pps_for(capacity: dict[str, Any]) -> float:
    """A link rate (probe packets/s) the machine forwards with room: two senders fill a bottleneck twice
    over, each packet crosses up to five switches; at most LOAD_SHARE of the calibrated total."""
    return max(60.0, min(150.0, LOAD_SHARE * float(capacity["total_pps"]) / 10))


@pytest.fixture(scope="module", name="bench")
def bench_fixture(
    k4_capacity: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    require_emulation(mininet_available())
    daemon = OvsDaemon()
    daemon.ensure_running()
    link_pps = link_pps_for(k4_capacity)
    prefix = unique_prefix("q")
    bench = QosBench(TOPOLOGY, link_scale(link_pps), tmp_path_factory.mktemp("qos"), prefix)
    bench.start()
    try:
        # the same strict-priority run without QoS first (plain FIFO links), then the policy's queues
        baseline = bench.run(latency_flows(link_pps), DURATION_S)
        bench.apply_qos(load_policy(POLICY, bench.fabric))
        yield {"bench": bench, "link_pps": link_pps, "baseline": baseline}
    finally:
        bench.stop()
        daemon.stop_if_started()
        assert prefix_leftovers(prefix) == []  # the IFBs went with the fabric


def latency_flows(link_pps: float) -> list[ClassFlow]:
    """Two default-class senders fill h3's downlink twice over; a small control flow crosses it."""
    return [
        ClassFlow("load1", "h1", "h3", 0, link_pps),
        ClassFlow("load2", "h4", "h3", 0, link_pps),
        ClassFlow("control", "h2", "h3", CONTROL, 50, 200),
    ]


def test_two_classes_share_a_bottleneck_by_weight(bench: dict[str, Any]) -> None:
    link = bench["link_pps"]
    result = bench["bench"].run(
        [ClassFlow("training", "h1", "h3", TRAIN, link), ClassFlow("kvcache", "h2", "h3", KV, link)],
        DURATION_S,
    )
    flows, headroom = result["flows"], result["headroom"]
    ratio = flows["training"]["rate_pps"] / max(flows["kvcache"]["rate_pps"], 1e-9)
    print(f"\nweighted 192:64, {link:.0f} pps link: {flows} ratio {ratio:.2f}; {headroom['why']}")
    print(headroom["emulator_drops_by_cause"], result["interface_drops"])
    assert 3 * 0.85 <= ratio <= 3 * 1.15, (ratio, flows)
    total = flows["training"]["rate_pps"] + flows["kvcache"]["rate_pps"]
    assert total <= link * 1.05, (total, link)  # never more than the link
    if not headroom["emulator_overloaded"]:
        assert total >= link * 0.85, (total, link, headroom)  # work-conserving: the link stays full
        assert headroom["modelled_congestion_drops"] > 0  # the bottleneck dropped, in the queues


def test_rate_limited_class_stays_under_its_limit(bench: dict[str, Any]) -> None:
    link = bench["link_pps"]
    cap_pps = link * 100 / 400  # bulk: rate_limit_gbps 100 on 400 Gb/s links
    result = bench["bench"].run([ClassFlow("bulk", "h1", "h3", BULK, link)], DURATION_S)
    bulk = result["flows"]["bulk"]
    print(f"\nbulk capped at {cap_pps:.1f} pps: {bulk}")
    assert bulk["rate_pps"] <= cap_pps * 1.05, (bulk, cap_pps)
    # every packet, from first to last arrival (queued ones drain at the cap after the sender stops): no
    # more than the cap, plus the class's two-packet bucket
    assert bulk["received"] <= cap_pps * bulk["arrivals_s"] * 1.05 + 2, bulk
    if not result["headroom"]["emulator_overloaded"]:
        assert bulk["rate_pps"] >= cap_pps * 0.8, bulk  # capped, not starved


def test_strict_priority_class_keeps_its_latency_under_load(bench: dict[str, Any]) -> None:
    result = bench["bench"].run(latency_flows(bench["link_pps"]), DURATION_S)
    with_qos = result["flows"]["control"]
    without = bench["baseline"]["flows"]["control"]
    print(f"\ncontrol p99: {with_qos['latency_ms']} with QoS, {without['latency_ms']} without")
    assert with_qos["received"] >= 0.99 * with_qos["sent"], with_qos  # strict: nothing of it dropped
    # the control packets no longer wait behind the bottleneck's queue: at the median always; at the 99th
    # percentile when the emulator kept up (an overloaded OVS delays every class before any queue sees it)
    assert with_qos["latency_ms"]["p50"] <= 0.25 * without["latency_ms"]["p50"], (with_qos, without)
    if not result["headroom"]["emulator_overloaded"]:
        assert with_qos["latency_ms"]["p99"] <= 0.25 * without["latency_ms"]["p99"], (with_qos, without)
    else:
        print(f"emulator overloaded, p99 not judged: {result['headroom']['why']}")
    loads = [result["flows"][n]["rate_pps"] for n in ("load1", "load2")]
    assert sum(loads) <= bench["link_pps"] * 1.05  # the load still fills the link around it


def test_per_port_per_queue_counters(bench: dict[str, Any]) -> None:
    """Per-port per-queue counters: h3's downlink (leaf2:1) sent every class in its own queue, and the
    weighted run's excess was dropped in the classes' queues where the two flows first met."""
    counters = bench["bench"].net.qos_counters()
    port = counters["leaf2:1"]
    assert set(port) >= {"q0", "q1", "q2", "q3/sl3", "q7"}, port
    assert all(port[q]["packets"] > 0 for q in ("q0", "q1", "q2", "q3/sl3", "q7")), port
    drops = sum(queues[q]["drops"] for queues in counters.values() for q in ("q1", "q2") if q in queues)
    assert drops > 0, counters
    assert sum(queues["q7"]["drops"] for queues in counters.values()) == 0  # strict: never dropped
