"""Routing policies on the emulated k=4 fat-tree (Mininet + userspace OVS, links shaped with HTB), compared
with `emulation.compare` exactly as `fabriclab compare` runs them.

What the field knows, reproduced: per-flow hashing (ecmp) collides flows on some links while others idle,
spraying spreads evenly and so carries more, ftree's static tables are collision-free on shift
permutations, adaptive routing beats hashing under a hot spot and loses nothing beyond the failover window
when a link is cut.  Where an assertion is about what the flows received, it holds for runs the emulator
carried cleanly (`headroom.emulator_overloaded` false: every lost packet is accounted for by a shaped link):
a run the emulator overloaded (other work starving OVS on this 2-core machine, or a slower machine) is
repeated, up to `TRIES` times.  If none is clean, what holds at any load is still checked (the report,
the controller's placement, and that the simulator calls the comparison "not comparable", never "same"),
and the figures that need a clean run are skipped with the emulator's own reasons: a busy machine is never
a pass, and never a failure of the code either.
Rates are a few thousand packets per second in all (see scenarios/permutation-k4.yaml for why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulation.compare import run_compare
from emulation.mnfabric import mininet_available
from emulation.ovs import OvsDaemon
from fabriclab.cli.sim import scenario_reference
from labspec.scenario import Scenario, load_scenario
from tests.conftest import ROOT
from tests.emulation_support import require_emulation

TRIES = 2  # one retry: on the 2-core CI machine a third run was as overloaded as the second


@pytest.fixture(scope="module")
def daemon() -> Iterator[OvsDaemon]:
    require_emulation(mininet_available())
    d = OvsDaemon()
    d.ensure_running()
    yield d
    d.stop_if_started()


def scenario(name: str, **changes: Any) -> Scenario:
    loaded = load_scenario(ROOT / "scenarios" / name)
    return (
        loaded
        if not changes
        else Scenario(**{**loaded.__dict__, "spec": loaded.spec.model_copy(update=changes)})
    )


def compare_clean(
    sc: Scenario,
    policies: list[str],
    out: Path,
    clean: list[str] | None = None,
    first: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`run_compare` (or its result `first`), then each policy of `clean` (default: all) the emulator
    overloaded run again (a fresh fabric) until clean."""
    reference = scenario_reference(
        sc
    )  # what `fabriclab compare` divides by: the simulator's non-blocking run
    summary = first if first is not None else run_compare(sc, policies, out, reference=reference)
    clean = policies if clean is None else clean
    for attempt in range(1, TRIES):
        again = [p for p, f in summary["policies"].items() if f["emulator_overloaded"] and p in clean]
        if not again:
            break
        retry = run_compare(sc, again, out / f"retry{attempt}", reference=reference)
        summary["policies"].update(retry["policies"])
    summary["emulator_overloaded"] = any(f["emulator_overloaded"] for f in summary["policies"].values())
    return summary


def require_clean(summary: dict[str, Any], policies: list[str] | None = None) -> None:
    """Skip the rest of a test when the emulator stayed overloaded for any of `policies` (default: all)."""
    dirty = {
        p: [h.get("why") for h in f["headroom"]]
        for p, f in summary["policies"].items()
        if f["emulator_overloaded"] and (policies is None or p in policies)
    }
    if dirty:
        pytest.skip(f"the emulator was overloaded in {TRIES} runs of {sorted(dirty)}: {dirty}")


POLICIES = ["static", "ecmp", "spray", "adaptive"]


@pytest.fixture(scope="module")
def permutation_compare(daemon: OvsDaemon, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`fabriclab compare` on the permutation, as the docs run it, every policy clean (runs the emulator
    overloaded are repeated); the clean summary replaces the first one in the results folder."""
    out = tmp_path_factory.mktemp("cmp")
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "compare", "scenarios/permutation-k4.yaml",
         "--policies", ",".join(POLICIES), "-o", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line.split()[0] for line in done.stdout.splitlines()[:4]] == POLICIES, done.stdout
    first = json.loads((out / "summary.json").read_text())
    summary = compare_clean(scenario("permutation-k4.yaml"), POLICIES, out, first=first)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out


def test_permutation_ecmp_collides_spray_spreads_and_the_report_is_complete(
    permutation_compare: Path,
) -> None:
    """`fabriclab compare` as users run it (docs/policies.md), then its figures."""
    tmp_path = permutation_compare
    summary = json.loads((tmp_path / "summary.json").read_text())
    f = summary["policies"]
    assert list(f) == POLICIES
    for name in (
        "summary.json",
        "report.md",
        "report.html",
        "utilisation.png",
        "fct-cdf.png",
        "bandwidth.png",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    assert all((tmp_path / p / "summary.json").exists() for p in f)
    report = (tmp_path / "report.md").read_text()
    assert "| ecmp |" in report and "utilisation.png" in report
    for figures in f.values():
        for key in ("slowdown", "completion_s", "goodput_gbps", "fct_slowdown_p50", "fct_slowdown_p99",
                    "throughput_ratio", "aggregate_goodput_mbps", "max_link_util", "mean_link_util",
                    "reordered_packets", "lost_packets"):  # fmt: skip
            assert figures[key] is not None, key
    ecmp, spray, static = f["ecmp"], f["spray"], f["static"]
    # hash collisions: the controller placed two or more flows on some links, and others carried nothing
    assert ecmp["flows_per_link"]["links_with_2plus_flows"] >= 1 and ecmp["idle_links"] >= 1
    assert static["flows_per_link"]["links_with_2plus_flows"] >= 1  # a random permutation is not a shift
    # spraying: no flow placed on one path, no idle link, an even load, and the receivers saw reordering
    assert spray["flows_per_link"]["placed_flows"] == 0
    require_clean(summary)  # what the flows received needs runs the emulator carried cleanly
    assert spray["idle_links"] == 0
    assert spray["max_link_util"] < ecmp["max_link_util"]
    # one path per flow never reorders; spraying may (how much depends on queue differences between the
    # paths at that moment, so only that it is counted is asserted)
    assert ecmp["reordered_packets"] == 0 and static["reordered_packets"] == 0
    assert isinstance(spray["reordered_packets"], int) and spray["reordered_packets"] >= 0
    # and so spraying carries measurably more than hashing, which loses on its collided links: the job
    # (every flow's bytes delivered) takes longer, as the slowdown against the non-blocking run says
    assert spray["aggregate_goodput_mbps"] > 1.1 * ecmp["aggregate_goodput_mbps"], (spray, ecmp)
    assert ecmp["slowdown"] > 1.1 * spray["slowdown"] and spray["slowdown"] == pytest.approx(1.0, abs=0.05)
    assert (
        ecmp["headroom"][0]["modelled_congestion_drops"] > spray["headroom"][0]["modelled_congestion_drops"]
    )


def test_the_simulator_gives_the_emulators_answer_on_the_same_scenario(
    permutation_compare: Path, tmp_path: Path
) -> None:
    """One scenario, one answer: `fabriclab sim SCENARIO --compare EMU/summary.json` (docs/flowsim.md) on
    the emulated permutation: comparable (same scenario, same link speeds, the emulator clean), the same
    ordering of the policies by job slowdown, and slowdown, completion and goodput within 15 %."""
    out = tmp_path / "sim"
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "sim", "scenarios/permutation-k4.yaml", "--policies",
         ",".join(POLICIES), "--compare", str(permutation_compare / "summary.json"), "-o", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    comparison = json.loads((out / "comparison.json").read_text())
    summary = json.loads((permutation_compare / "summary.json").read_text())
    if summary["emulator_overloaded"]:
        assert not comparison["comparable"] and "overloaded" in comparison["why_not"], comparison
        require_clean(summary)
    assert comparison["comparable"] and comparison["why_not"] is None, comparison["why_not"]
    assert comparison["same_order"] and comparison["agree"], json.dumps(comparison["policies"], indent=1)
    assert comparison["max_rel_diff"] <= 0.15
    assert set(comparison["policies"]) == set(POLICIES)
    for name, row in comparison["policies"].items():
        for field in ("slowdown", "completion_s", "goodput_gbps"):
            assert row[field]["rel_diff"] <= 0.15, (name, field, row[field])
    assert comparison["sim_order"][-1] == "ecmp"  # both instruments: hashing is the slowest here
    assert "agree" in done.stdout and "Simulation vs emulation" in (out / "report.md").read_text()


def test_static_ftree_is_collision_free_on_a_shift_permutation(daemon: OvsDaemon, tmp_path: Path) -> None:
    summary = compare_clean(scenario("shift-k4.yaml"), ["static"], tmp_path)
    static = summary["policies"]["static"]
    assert static["flows_per_link"] == {"max": 1, "links_with_2plus_flows": 0, "placed_flows": 16,
                                        "sprayed_flows": 0}  # fmt: skip
    require_clean(summary)
    (headroom,) = static["headroom"]
    # One flow per link at 70 % of it: a shaped link overflows only when a sender delayed by the busy
    # machine catches up in a burst longer than the 8-packet buffer -- scattered over flows, never
    # systematic.  A collision puts 140 % on one link and drops ~30 % of *both* flows on it, so the test
    # is per flow: every flow loses under 5 % (CI on a slow machine saw 30 scattered drops in 5,376, 0.56 %)
    flows = [f for rep in latest_run(tmp_path, "static")["repetitions"] for f in rep["flows"]]
    assert len(flows) == 16
    worst = max(flows, key=lambda f: int(f["lost"]) / max(1, int(f["sent"])))
    assert int(worst["lost"]) < 0.05 * int(worst["sent"]), worst
    assert headroom["modelled_congestion_drops"] <= 0.02 * headroom["offered_packets"], headroom
    assert static["loss_pct"] < 2.0 and static["max_link_util"] < 0.85


def test_adaptive_beats_ecmp_under_a_hot_spot(daemon: OvsDaemon, tmp_path: Path) -> None:
    summary = compare_clean(scenario("hotspot-k4.yaml"), ["ecmp", "adaptive"], tmp_path)
    ecmp, adaptive = summary["policies"]["ecmp"], summary["policies"]["adaptive"]
    assert ecmp["flows_per_link"]["max"] == 3  # the hot spot: three flows hashed onto one uplink
    require_clean(summary)
    assert adaptive["adaptive_moves"] >= 1
    assert adaptive["aggregate_goodput_mbps"] > 1.15 * ecmp["aggregate_goodput_mbps"], (adaptive, ecmp)
    assert adaptive["lost_packets"] < ecmp["lost_packets"] / 2
    events = run_events(tmp_path, "adaptive")
    moves = [e for e in events if e["kind"] == "adaptive_move"]
    assert any("leaf1:3 at" in e["reason"] for e in moves), [e["reason"] for e in moves]


def test_adaptive_loses_nothing_beyond_the_failover_window_when_a_link_is_cut(
    daemon: OvsDaemon, tmp_path: Path
) -> None:
    summary = compare_clean(scenario("adaptive-failure-k4.yaml"), ["adaptive"], tmp_path)
    run = latest_run(tmp_path, "adaptive")
    kinds = [e["kind"] for rep in run["repetitions"] for e in rep["events"]]
    assert "port_down" in kinds and "port_up" in kinds  # the controller saw the cut and the restore
    require_clean(summary)
    (rep,) = run["repetitions"]
    down, up = (f["wall"] for f in rep["faults"])
    window_s = 0.5  # fast failover on this userspace datapath, measured by benchmarks/controlplane.py
    for flow in rep["flows"]:
        late = [g for g in flow["gaps"] if down + window_s < g["from"] and g["missing"] > 0]
        assert not late, (flow["name"], late)  # nothing lost once failover took over: reroute, adaptive
        lost = sum(g["missing"] for g in flow["gaps"] if down - 0.05 <= g["from"] <= down + window_s)
        assert lost <= flow["rate_pps"] * window_s, (flow["name"], lost)
        assert not [g for g in flow["gaps"] if up - 0.05 <= g["from"]], flow["name"]  # link back: no loss
    offered_pps = sum(f["rate_pps"] for f in rep["flows"])
    assert summary["policies"]["adaptive"]["lost_packets"] <= offered_pps * window_s


def latest_run(out: Path, policy: str) -> dict[str, Any]:
    """The policy's run the comparison kept (the last retry, if it needed one)."""
    paths = sorted(out.glob(f"**/{policy}/summary.json"), key=lambda p: p.stat().st_mtime)
    data: dict[str, Any] = json.loads(paths[-1].read_text())
    return data


def run_events(out: Path, policy: str) -> list[dict[str, Any]]:
    return [e for rep in latest_run(out, policy)["repetitions"] for e in rep["events"]]
