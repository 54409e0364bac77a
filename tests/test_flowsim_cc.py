"""`cc: dcqcn` in the flow-level simulator (`flowsim.ccsim`): the k=4 incast with and without the
controller, two flows converging as DCQCN's parameters predict, bad `--cc` input, `cc: none` unchanged, and
UDP traffic (open-loop) untouched by DCQCN.  Pure: no network interfaces, no emulator."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabriclab.cli import main
from flowsim.ccmodel import convergence_s, waterfill
from flowsim.ccresult import run_cc
from flowsim.ccsim import CcSimulator
from flowsim.converge import ConvergeCase, judge, simulated_rates
from flowsim.engine import SimConfig
from flowsim.fluidmodel import predicted_convergence_s
from flowsim.network import Network
from flowsim.scenario import cc_setup, workload_of
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from topologies.generators import fat_tree
from topologies.loader import dump_yaml

K4 = (ROOT / "topologies" / "fat-tree-k4.yaml").as_posix()
FRAME = 1024 + 58  # an RDMA WRITE packet of 1024 bytes on the wire
BUFFER_PACKETS = 256
#: 400 Gb/s links at 2 Mb/s; 8 senders each paced at 58 packets/s (0.50 Mb/s): 2.0x the receiver's link.
INCAST = f"""fabriclab: 1
name: incast-k4
topology: {K4}
scale: 400G=2M
buffer_packets: {BUFFER_PACKETS}
controller: {{engine: ftree, policy: ecmp}}
duration_s: 60
seed: 1
traffic:
  - {{kind: roce-incast, senders: h1..h8, receiver: h16, size: 16MiB, rate_pps: 58}}
"""


def sim(tmp_path: Path, *args: str, name: str = "out") -> tuple[int, dict[str, Any]]:
    out = tmp_path / name
    code = main(["sim", *args, "-o", str(out)])
    summary = json.loads((out / "summary.json").read_text()) if code == 0 else {}
    return code, summary


@pytest.fixture(scope="module")
def incast_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("incast") / "incast.yaml"
    path.write_text(INCAST)
    return path


def test_dcqcn_makes_the_k4_incast_lossless_fair_and_keeps_the_queue_below_the_buffer(
    incast_file: Path, tmp_path: Path
) -> None:
    code, summary = sim(tmp_path, str(incast_file), "--cc", "dcqcn")
    assert code == 0
    assert summary["cc"]["cc"] == "dcqcn" and summary["cc"]["line_rates_gbps"] == [0.002]
    row = summary["policies"]["ecmp"]
    cc = row["cc"]
    assert cc["cc"] == "dcqcn" and cc["cnps_sent"] > 0 and cc["rate_cuts"] > 0
    assert cc["loss_pct"] < 1.0 and row["loss_pct"] < 1.0
    assert cc["bottleneck"]["link"] == "leaf8:2->h16:1"  # the receiver's link
    assert cc["bottleneck"]["utilisation"] >= 0.90
    assert cc["jain_senders"] >= 0.9
    assert 0 < cc["peak_queue_bytes"] < BUFFER_PACKETS * FRAME == cc["buffer_bytes"]
    assert row["goodput_gbps"] >= 0.90 * 0.002 * 1024 / FRAME  # payload: 90 % of what the link carries


def test_without_a_controller_the_incast_loses_half_at_the_receivers_buffer(incast_file: Path) -> None:
    """`cc: none` leaves the emulator's senders open-loop at their pace: the same fluid model with the
    controllers off loses what the receiver's link cannot carry."""
    scenario = load_scenario(incast_file)
    network = Network.build(scenario.fabric, scenario.scale)
    workload = workload_of(scenario, network)
    setup = cc_setup(scenario, network, enabled=False)
    _, stats = run_cc(CcSimulator(network, workload, SimConfig(policy="ecmp", seed=1), setup))
    block = stats.block()
    assert block["loss_pct"] >= 40.0 and block["cnps_sent"] == 0
    assert block["peak_queue_link"] == "leaf8:2->h16:1"
    assert block["peak_queue_bytes"] == pytest.approx(BUFFER_PACKETS * FRAME)  # full


def test_cc_none_keeps_max_min_and_says_nothing_of_cc(incast_file: Path, tmp_path: Path) -> None:
    """Max-min is an ideal controller: no loss, nothing queued; `fabriclab sim` under `cc: none` is what it
    was (no `cc` block)."""
    code, summary = sim(tmp_path, str(incast_file), "--cc", "none")
    assert code == 0
    assert "cc" not in summary and "cc" not in summary["policies"]["ecmp"]
    assert summary["policies"]["ecmp"]["loss_pct"] == 0


def test_two_flows_converge_as_dcqcns_parameters_predict(tmp_path: Path) -> None:
    """h1 and h3 into h2 on a 100G k=4 fat-tree at 1/100 speed, the second starting 1 s later: their rates
    (averages over 20 timer periods) come within 10 % and stay there for 100 periods, within 1.5x of what
    the DCQCN paper's fluid model predicts (`flowsim.fluidmodel`; 8.6 s).  At 100G one run suffices:
    CNPs come often enough per unit of rate that a run stays near the model (at 10G see the next test)."""
    (tmp_path / "ft.yaml").write_text(dump_yaml(fat_tree(4, bw_gbps=100.0)))
    (tmp_path / "two.yaml").write_text(
        "fabriclab: 1\nname: two-flows\ntopology: ft.yaml\nscale: 100G=1G\ncc: dcqcn\nduration_s: 60\n"
        "seed: 1\ncontroller: {engine: ftree, policy: static}\ntraffic:\n"
        "  - {kind: roce-incast, senders: h1, receiver: h2, size: 40GiB, start_s: 0}\n"
        "  - {kind: roce-incast, senders: h3, receiver: h2, size: 40GiB, start_s: 1}\n"
    )
    scenario = load_scenario(tmp_path / "two.yaml")
    network = Network.build(scenario.fabric, scenario.scale)
    setup = cc_setup(scenario, network)
    p = setup.params
    period = p.increase_period_s
    capacity = 1e9  # 100 Gb/s at 1/100
    predicted = predicted_convergence_s(p, capacity, head_start_s=1.0, horizon_periods=3000)
    assert predicted is not None
    run = CcSimulator(network, workload_of(scenario, network), SimConfig(policy="static", seed=1), setup,
                      sample_every_s=period / 4)  # fmt: skip
    _, stats = run_cc(run, until_s=1.0 + 2 * predicted)
    first = stats.row_job == 0
    rates = stats.sample_rate_bps
    took = convergence_s(stats.sample_t_s, rates[:, first][:, 0], rates[:, ~first][:, 0], 1.0, 20 * period,
                         100 * period)  # fmt: skip
    print(f"converged {took} s after the second flow started; predicted {predicted:.3g} s")
    assert took is not None
    assert predicted / 1.5 <= took <= 1.5 * predicted
    late = stats.sample_t_s > 1.0 + took
    assert rates[late].sum(axis=1).mean() == pytest.approx(capacity, rel=0.1)  # and they fill the link


def test_at_10g_the_mean_of_runs_converges_as_the_fluid_model_predicts() -> None:
    """scenarios/converge-k4.yaml (10G at 10G=14M, the second flow 182 timer periods late): one run's rates
    wander tens of percent around equal (a cut is 15-25 % of a rate, one or two a second), so the
    prediction of a mean-field model is judged on the mean of 16 seeds: their 100-period averages come
    within 10 % for good within 1.5x of the model's time (the same judge, `flowsim.converge`), and are
    far apart at first (the check can fail both ways)."""
    case = ConvergeCase.of(load_scenario(ROOT / "scenarios" / "converge-k4.yaml"))
    predicted = case.fluid()
    # the seeds are independent runs: one per core (the suite's slowest pure test otherwise)
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1), mp_context=get_context("fork")) as pool:
        runs = list(pool.map(simulated_rates, [case] * 16, range(1, 17)))
    mean = judge(case, np.array([r["a"] for r in runs]), np.array([r["b"] for r in runs]))
    print(
        f"mean of 16 runs settled {mean['settled_s']} s, the model {predicted['settled_s']} s; gaps "
        f"{mean['gaps']} vs {predicted['gaps']}"
    )
    assert predicted["settled_s"] is not None and mean["settled_s"] is not None
    assert predicted["settled_s"] / 1.5 <= mean["settled_s"] <= 1.5 * predicted["settled_s"]
    assert mean["gaps"][0] > 0.3 and predicted["gaps"][0] > 0.3
    assert all(r["cnps"] > 0 for r in runs)


def test_a_bad_cc_is_one_line_naming_it_and_exit_2(
    incast_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["sim", str(incast_file), "--cc", "cubic", "-o", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert "--cc" in capsys.readouterr().err
    stepped = ROOT / "scenarios" / "alltoall-k4.yaml"  # roce-collective in steps: not modelled, refused
    assert main(["sim", str(stepped), "--cc", "dcqcn", "-o", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "cc: dcqcn" in err and "steps" in err and err.count("\n") == 1
    assert (
        main(["sim", str(incast_file), "--cc", "dcqcn", "--policies", "adaptive", "-o", str(tmp_path / "z")])
        == 2
    )
    assert "cc: dcqcn: policy adaptive" in capsys.readouterr().err
    assert (
        main(
            ["sim", "--topology", K4, "--traffic", "permutation", "--cc", "dcqcn", "-o", str(tmp_path / "w")]
        )
        == 2
    )
    assert "--cc" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "xyzw")


def test_cc_none_results_are_unchanged(tmp_path: Path) -> None:
    """The file's default, an explicit `--cc none`, and `--cc none` over a file saying `cc: dcqcn` give the
    same summary, byte for byte."""
    scenario = ROOT / "scenarios" / "permutation-k4.yaml"
    with_dcqcn = tmp_path / "perm-dcqcn.yaml"
    text = scenario.read_text().replace("topology: ../topologies", f"topology: {ROOT.as_posix()}/topologies")
    with_dcqcn.write_text(text + "cc: dcqcn\n")
    policies = ("--policies", "static,ecmp,spray")
    assert sim(tmp_path, str(scenario), *policies, name="plain")[0] == 0
    assert sim(tmp_path, str(scenario), *policies, "--cc", "none", name="none")[0] == 0
    assert sim(tmp_path, str(with_dcqcn), *policies, "--cc", "none", name="over")[0] == 0
    plain = (tmp_path / "plain" / "summary.json").read_text()
    assert (tmp_path / "none" / "summary.json").read_text() == plain
    over = json.loads((tmp_path / "over" / "summary.json").read_text())
    assert over["policies"] == json.loads(plain)["policies"]


def test_udp_stays_open_loop_under_dcqcn(tmp_path: Path) -> None:
    """The permutation's UDP flows do not react to marks: under `--cc dcqcn` nothing is cut, and the fluid
    queues give the max-min run's open-loop figures (slowdown and loss within a few percent)."""
    scenario = str(ROOT / "scenarios" / "permutation-k4.yaml")
    policies = ("--policies", "static,ecmp,spray")
    _, dcqcn = sim(tmp_path, scenario, *policies, "--cc", "dcqcn", name="dcqcn")
    _, none = sim(tmp_path, scenario, *policies, name="none")
    for name in ("static", "ecmp", "spray"):
        a, b = dcqcn["policies"][name], none["policies"][name]
        assert a["cc"]["cnps_sent"] == 0 and a["cc"]["rate_cuts"] == 0
        assert a["slowdown"] == pytest.approx(b["slowdown"], rel=0.03)
        assert a["loss_pct"] == pytest.approx(b["loss_pct"], abs=1.0)
    order = sorted(dcqcn["policies"], key=lambda n: dcqcn["policies"][n]["slowdown"])
    assert order == ["spray", "static", "ecmp"]


def test_the_same_seed_gives_the_same_run(incast_file: Path, tmp_path: Path) -> None:
    a = sim(tmp_path, str(incast_file), "--cc", "dcqcn", name="a")[1]["policies"]
    b = sim(tmp_path, str(incast_file), "--cc", "dcqcn", name="b")[1]["policies"]
    c = sim(tmp_path, str(incast_file), "--cc", "dcqcn", "--seed", "2", name="c")[1]["policies"]
    assert a == b
    assert a != c  # marks are drawn from the run's seed


def test_waterfill_is_round_robin_max_min_on_each_nic() -> None:
    """A NIC's QPs: those asking less than the fair level get what they ask, the rest share the remainder
    equally; classes count their members; QPs of an idle NIC keep their demand."""
    demand = np.array([1.0, 5.0, 5.0, 2.0, 9.0, 3.0])
    mult = np.array([1.0, 1.0, 2.0, 1.0, 1.0, 1.0])
    group = np.array([0, 0, 0, 1, 1, -1])
    cap = np.array([10.0, 20.0])
    out = waterfill(demand, mult, group, cap, 2)
    assert out[0] == 1.0 and out[1] == pytest.approx(3.0) and out[2] == pytest.approx(3.0)  # 1 + 3 + 2x3
    assert out[3] == 2.0 and out[4] == 9.0 and out[5] == 3.0  # under capacity: untouched
    rng = np.random.default_rng(5)
    demand = rng.uniform(0.1, 10.0, 500)
    group = rng.integers(0, 7, 500)
    cap = rng.uniform(5.0, 400.0, 7)
    out = waterfill(demand, np.ones(500), group, cap, 7)
    assert (out <= demand + 1e-12).all()
    for g in range(7):
        mine = group == g
        served = out[mine].sum()
        assert served <= cap[g] * (1 + 1e-9)
        if demand[mine].sum() > cap[g]:  # saturated: everyone short of its demand gets the same level
            assert served == pytest.approx(cap[g], rel=1e-6)
            short = out[mine][out[mine] < demand[mine] - 1e-9]
            assert np.ptp(short) < 1e-6 * cap[g]


def test_the_dcqcn_benchmark_runs_and_reports_json() -> None:
    """`benchmarks/flowsim_dcqcn.py` keeps working (its figures come from running it, not from tests)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.flowsim_dcqcn", "--quick", "--parts", "alltoall,incast",
         "--policies", "spray"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    row = report["alltoall_1024"]["policies"]["spray"]
    assert row["dcqcn_run"]["n"] == 1 and row["cli_command_s"] is not None and len(row["load_before"]) == 3
    incast = report["incast_k4"]["rows"]
    assert incast["dcqcn"]["loss_pct"] < 1.0 < incast["none (open-loop senders, fluid)"]["loss_pct"]
