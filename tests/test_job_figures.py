"""Job-level figures (`traffic.figures`), the open-loop drop model and the one expansion of a scenario's
traffic that both instruments realise (`labspec.workplan`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowsim.engine import SimConfig, Simulator
from flowsim.maxmin import max_min, open_loop
from flowsim.network import Network
from flowsim.scenario import workload_of
from labspec import workplan
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from traffic.entropy import flow_sport, flow_sports, pair_qp
from traffic.figures import Flows, JobInfo, fct_slowdowns, job_completion, summarise


def flows(**cols: list[float]) -> Flows:
    n = len(next(iter(cols.values())))
    base = {"job": [0] * n, "step": [0] * n, "offered": [1.0] * n, "delivered": [1.0] * n,
            "start_s": [0.0] * n, "fct_s": [1.0] * n, "alone_s": [1.0] * n, "mult": [1.0] * n}  # fmt: skip
    base.update(cols)
    return Flows(*(np.array(base[k], dtype=np.int64 if k in ("job", "step") else float) for k in base))


def test_a_flow_that_lost_packets_counts_as_if_the_rest_came_at_its_goodput() -> None:
    f = flows(offered=[100.0, 100.0], delivered=[100.0, 50.0], fct_s=[2.0, 2.0])
    assert f.effective_fct_s.tolist() == [2.0, 4.0]
    nothing = flows(offered=[100.0], delivered=[0.0])
    assert math.isinf(float(nothing.effective_fct_s[0]))


def test_job_completion_by_kind() -> None:
    # messages posted at their times: the last effective delivery
    posted = flows(start_s=[0.0, 1.0], fct_s=[2.0, 0.5])
    assert job_completion(posted, 0, stepped=False) == pytest.approx(2.0)
    # steps: the sum of each step's slowest (effective) flow
    stepped = flows(step=[0, 0, 1, 1], fct_s=[1.0, 3.0, 2.0, 1.0], delivered=[1.0, 1.0, 0.5, 1.0])
    assert job_completion(stepped, 0, stepped=True) == pytest.approx(3.0 + 4.0)
    # no barrier between flows (timed, posted): span x offered / delivered of the whole job
    timed = flows(offered=[10.0, 10.0], delivered=[10.0, 5.0], fct_s=[8.0, 8.0])
    assert job_completion(timed, 0, stepped=False, aggregate=True) == pytest.approx(8.0 * 20 / 15)
    assert job_completion(timed, 1, stepped=False) is None


def test_fct_slowdown_by_size_bucket() -> None:
    sizes = [5e3, 5e3, 5e5, 5e7]
    f = flows(offered=sizes, delivered=sizes, fct_s=[1.0, 3.0, 2.0, 10.0], alone_s=[1.0, 1.0, 1.0, 2.0])
    got = fct_slowdowns(f)
    assert set(got["by_size"]) == {"<10KB", "100KB-1MB", ">=10MB"}
    assert got["by_size"]["<10KB"]["flows"] == 2 and got["by_size"]["<10KB"]["p99"] == pytest.approx(3.0)
    assert got["by_size"][">=10MB"]["p50"] == pytest.approx(5.0)
    assert got["p50"] == pytest.approx(2.0)


def test_summary_leads_with_the_slowest_job_and_needs_its_reference() -> None:
    f = flows(job=[0, 1], offered=[1e6, 1e6], delivered=[1e6, 1e6], fct_s=[1.0, 4.0], alone_s=[1.0, 1.0])
    jobs = [JobInfo(0, "a", False), JobInfo(1, "b", False, ("allreduce-ring", 4, 1_000_000), 1.5)]
    got = summarise(f, jobs, {"jobs": {"0": 1.0, "1": 2.0}, "aggregate_rate": 1.25e6})
    assert got["slowdown"] == pytest.approx(2.0) and got["completion_s"] == pytest.approx(4.0)
    assert got["busbw_GBps"] == pytest.approx(1e6 / 4.0 / 1e9 * 1.5)
    assert got["throughput_ratio"] == pytest.approx((1e6 / 1 + 1e6 / 4) / 1.25e6)
    alone = summarise(f, jobs, None)  # no reference run: no slowdown, no ratio (never a made-up 1.0)
    assert alone["slowdown"] is None and alone["throughput_ratio"] is None


def test_open_loop_flows_lose_in_proportion_and_compound_along_their_path() -> None:
    """Drop-tail with unsynchronised open-loop senders: equal flows share equally, unequal ones in
    proportion to what they offer (not max-min), and what one hop dropped does not load the next."""
    cap = np.array([1.0, 1.0, np.inf])
    indptr = np.array([0, 1, 3, 4])
    links = np.array([0, 0, 1, 1], dtype=np.int32)
    hop = np.array([0, 0, 1, 0], dtype=np.int32)
    delivered, carried = open_loop(cap, indptr, links, np.ones(4), hop, np.ones(3), np.array([0.7, 0.7, 0.7]))
    assert delivered == pytest.approx([0.5, 0.5 * 1 / (0.5 + 0.7), 0.7 / (0.5 + 0.7)])
    assert carried[:2] == pytest.approx([1.0, 1.0])
    # unequal demands on one link: proportional (max-min would give the small one all it asks)
    small_big = open_loop(np.array([1.0]), np.array([0, 1, 2]), np.array([0, 0], dtype=np.int32), np.ones(2),
                          np.zeros(2, dtype=np.int32), np.ones(2), np.array([0.25, 1.25]))[0]  # fmt: skip
    assert small_big == pytest.approx([0.25 / 1.5, 1.25 / 1.5])
    one_link = (np.array([1.0]), np.array([0, 1, 2]), np.array([0, 0], dtype=np.int32), np.ones(2))
    fair = max_min(*one_link, np.ones(2), np.array([0.25, 1.25])).rate
    assert fair == pytest.approx([0.25, 0.75])


def test_the_emulator_and_the_simulator_number_qps_alike() -> None:
    """One QP per ordered pair of ranks; its source port is Linux's for the QP: the emulator's agents and
    the simulator's flows carry the same entropy, so ECMP places them alike."""
    scenario = load_scenario(ROOT / "scenarios" / "alltoall-k4.yaml")
    messages = workplan.messages(scenario)
    assert len(messages) == 16 * 15 and len({m.qp for m in messages}) == 240
    for m in messages[:40]:
        i, j = int(m.src[1:]) - 1, int(m.dst[1:]) - 1
        assert m.qp == pair_qp(0, i, j, 16)
        assert m.packets == math.ceil(480 * 1024 / 16 / 1024)
    qps = np.arange(0x100, 0x100 + 5000, dtype=np.int64)
    assert flow_sports(qps).tolist() == [flow_sport(int(q), int(q)) for q in qps]


def test_one_scenario_is_one_workload_on_both_instruments() -> None:
    """The simulator runs what the emulator sends: the same pairs, source ports and sizes on the wire."""
    scenario = load_scenario(ROOT / "scenarios" / "permutation-k4.yaml")
    network = Network.build(scenario.fabric, scenario.scale)
    assert network.cap_gbps.max() == pytest.approx(5e-3)  # 400G=5M: the emulator's shaped speed
    (batch,) = workload_of(scenario, network).batches
    emulated = scenario.with_policy("ecmp").flows(0)
    assert [network.subnet.endpoints[e].node for e in batch.src] == [f.src for f in emulated]
    assert batch.sport.tolist() == [f.sport for f in emulated]
    assert batch.rate_cap_gbps == pytest.approx([420 * (1000 + 42) * 8 / 1e9] * 16)
    trace = load_scenario(ROOT / "scenarios" / "trace-k4.yaml")
    posted = workplan.messages(trace)
    (replay,) = workload_of(trace, Network.build(trace.fabric, trace.scale)).batches
    assert replay.n == len(posted) == 448
    assert replay.start_s == pytest.approx([m.post_s for m in posted])
    assert replay.size_bytes == pytest.approx([m.packets * 1082 for m in posted])


def test_simulated_collectives_run_step_by_step_at_the_paced_rate() -> None:
    """A stepped all-to-all under static ftree (every step a shift: no collision): each of the 15 steps
    takes its 30 packets at the pacer's 140 packets/s, as the emulator's ranks send them."""
    scenario = load_scenario(ROOT / "scenarios" / "alltoall-k4.yaml")
    network = Network.build(scenario.fabric, scenario.scale)
    result = Simulator(network, workload_of(scenario, network), SimConfig(policy="static")).run()
    assert result.end_s == pytest.approx(15 * 30 / 140, rel=1e-6)
