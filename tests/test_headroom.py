"""The emulator's headroom verdict and the calibration's search, without a fabric: counters as the kernel
prints them, and the verdict's arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from emulation.calibrate import default_path, load, search
from emulation.headroom import (
    CLEAN_LOSS,
    Counters,
    _dev_drops,
    _qdisc_drops,
    _socket_drops,
    _udp_rcvbuf_errors,
    assess,
    capacity_ratio,
    sender_late_bound_ms,
)
from tests.conftest import ROOT

SS = """\
p_raw 0 0 *:r12s0-eth4 * skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d0)
p_raw 0 0 *:r12s0-eth2 * skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d2786)
p_raw 0 0 [0]:* * skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d7)
"""
PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes packets errs drop fifo frame compr multicast|bytes packets errs drop fifo colls carrier compr
    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
r12h0-eth0: 1000 10 0 3 0 0 0 0 2000 20 0 4 0 0 0 0
"""
SNMP = """\
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 100 0 5 100 5 0 0 0 0
"""
TC = (
    '[{"kind":"htb","dev":"r12s0-eth4","drops":3},{"kind":"noqueue","dev":"lo","drops":9},'
    '{"kind":"htb","dev":"other0","drops":50}]'
)
CAPACITY = {"per_host_pps": 350.0, "total_pps": 5600.0, "senders": 16}


def test_counters_are_read_as_the_kernel_prints_them() -> None:
    assert _socket_drops(SS) == {"r12s0-eth4": 0, "r12s0-eth2": 2786}  # unbound sockets are nobody's port
    assert _dev_drops(PROC_NET_DEV) == {
        "r12h0-eth0": 4
    }  # tx drop only (rx drop counts unwanted LLDP), not lo
    assert _udp_rcvbuf_errors(SNMP) == 5
    assert _qdisc_drops(TC, {"r12s0-eth4"}) == {"r12s0-eth4": 3}  # HTB only, our interfaces only
    assert _qdisc_drops("not json", None) == {}


def _counters(**fields: dict[str, int]) -> Counters:
    return Counters(**fields)


def test_the_verdict_separates_the_emulator_from_the_modelled_fabric_and_the_faults() -> None:
    before = _counters(socket_drops={"a": 10, "cut": 0}, shaped_drops={"b": 0}, udp_rcvbuf_errors={"h1": 1})
    after = _counters(socket_drops={"a": 30, "cut": 500}, shaped_drops={"b": 40}, udp_rcvbuf_errors={"h1": 6})
    verdict = assess(before, after, offered_packets=100_000, faulted_interfaces=["cut"])
    assert (
        verdict["emulator_drops"] == 25
        and verdict["emulator_drops_by_cause"]["ovs_port_socket_overflow"] == 20
    )
    assert verdict["modelled_congestion_drops"] == 40 and verdict["fault_drops"] == 500
    assert verdict["emulator_overloaded"] is False  # 25 of 100,000 = 0.025 %: clean ...
    verdict = assess(before, after, offered_packets=1_000)
    assert verdict["emulator_overloaded"] is True and "dropped 525 of 1000" in verdict["why"]


def test_packets_a_partition_denied_are_the_experiments_not_the_emulators() -> None:
    """A tenant writing to a host outside its partitions loses every packet to the deny flows: conserved
    packets must count those as the partitions' drops.  Before, a scenario with such a sender said
    "EMULATOR OVERLOADED: the emulator dropped 64 of 3520 packets", all of them "unaccounted"."""
    quiet = _counters()
    lost_to_partitions = assess(quiet, quiet, offered_packets=3520, received_packets=3456)
    assert lost_to_partitions["emulator_drops_by_cause"]["unaccounted"] == 64
    assert lost_to_partitions["emulator_overloaded"] is True
    verdict = assess(quiet, quiet, offered_packets=3520, received_packets=3456, partition_drops=64)
    assert verdict["emulator_drops_by_cause"]["unaccounted"] == 0 and verdict["partition_drops"] == 64
    assert verdict["emulator_overloaded"] is False
    # the deny flows explain only what they counted
    verdict = assess(quiet, quiet, offered_packets=3520, received_packets=3400, partition_drops=64)
    assert verdict["emulator_drops_by_cause"]["unaccounted"] == 56


def test_clean_means_at_most_the_calibrations_loss() -> None:
    before = _counters(socket_drops={"a": 0})
    limit = int(CLEAN_LOSS * 20_000)
    assert not assess(before, _counters(socket_drops={"a": limit}), 20_000)["emulator_overloaded"]
    assert assess(before, _counters(socket_drops={"a": limit + 1}), 20_000)["emulator_overloaded"]


def test_delay_counts_only_where_no_modelled_link_was_congested() -> None:
    quiet = _counters(shaped_drops={"b": 0})
    assert assess(quiet, quiet, 100, latency_p99_ms=250.0)["emulator_overloaded"]
    assert not assess(quiet, quiet, 100, latency_p99_ms=5.0)["emulator_overloaded"]
    congested = _counters(shaped_drops={"b": 9})
    assert not assess(quiet, congested, 100_000, latency_p99_ms=250.0)["emulator_overloaded"]


def test_a_sender_that_fell_behind_by_a_buffer_of_its_packets_is_the_emulator() -> None:
    """A stalled sender sends its backlog at once: 24 pkt/s into 4-packet buffers may fall 166 ms behind,
    2,000 pkt/s into 100-packet buffers 50 ms; never less than the delay bound."""
    assert sender_late_bound_ms(24, 4) == pytest.approx(166.67, abs=0.01)
    assert sender_late_bound_ms(2000, None) == 50.0 and sender_late_bound_ms(1e6, 4) == 20.0
    quiet = _counters(shaped_drops={"b": 0})
    on_time = assess(quiet, quiet, 100, senders_late_ms={"f1": (12.0, 166.7), "f2": (150.0, 166.7)})
    assert not on_time["emulator_overloaded"] and on_time["senders_late_max_ms"] == 150.0
    stalled = assess(quiet, quiet, 100, senders_late_ms={"f1": (12.0, 166.7), "f2": (240.0, 166.7)})
    assert stalled["emulator_overloaded"] and "1 sender(s) fell behind" in stalled["why"]
    assert "f2: 240 ms, bound 167 ms" in stalled["why"]
    assert "senders_late_max_ms" not in assess(quiet, quiet, 100)


def test_capacity_ratio_lets_fewer_senders_go_faster_but_never_past_the_total() -> None:
    assert capacity_ratio({"per_host": 350, "total": 5600, "senders": 16}, CAPACITY) == pytest.approx(1.0)
    assert capacity_ratio({"per_host": 1400, "total": 5600, "senders": 4}, CAPACITY) == pytest.approx(1.0)
    assert capacity_ratio({"per_host": 2800, "total": 2800, "senders": 1}, CAPACITY) == pytest.approx(0.5)
    assert capacity_ratio({"per_host": 700, "total": 11200, "senders": 16}, CAPACITY) == pytest.approx(2.0)
    verdict = assess(Counters(), Counters(), 1, offered_pps={"per_host": 700, "total": 11200, "senders": 16},
                     capacity=CAPACITY)  # fmt: skip
    assert verdict["offered_vs_capacity"] == 2.0 and verdict["capacity_pps"] == {
        "per_host": 350.0,
        "total": 5600.0,
    }


@pytest.mark.parametrize("true_capacity", [37.0, 350.0, 1234.0, 19000.0])
def test_the_stepped_search_finds_the_highest_clean_rate(true_capacity: float) -> None:
    def step(rate: float) -> dict[str, Any]:
        return {"rate_pps_per_host": rate, "loss": 0.0 if rate <= true_capacity else 0.05}

    rate, steps = search(step, refine=4)
    assert rate <= true_capacity  # never above: every reported rate was measured clean
    assert rate >= true_capacity * 0.85 or true_capacity > 20000 / 2  # and close below it
    assert len(steps) <= 14


def test_a_rate_the_senders_could_not_send_is_not_clean() -> None:
    """Hosts that fall short of the rate asked (the interpreter, not the fabric, is the limit there) lose
    nothing of what they did send; the capacity is still no higher than what they managed."""

    def step(rate: float) -> dict[str, Any]:
        sent_share = min(1.0, 900.0 / rate)
        return {"rate_pps_per_host": rate, "loss": 0.0, "sent_share": sent_share}

    rate, _ = search(step, refine=4)
    assert 800 <= rate <= 900 * 1.01


def test_a_fabric_that_loses_at_any_rate_has_no_capacity() -> None:
    rate, steps = search(lambda r: {"loss": 1.0}, refine=3)
    assert rate == 0.0 and steps and all(s["loss"] == 1.0 for s in steps)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--step-s", "0"], "--step-s"),
        (["--scale", "400G=9T"], "--scale"),
        (["-o", "/"], "--output"),
        (["--shards", "0"], "--shards"),
        (["--shards", "99"], "--shards"),
        (["--shard-cables", "patch", "--scale", "400G=200M"], "--shard-cables"),
        (["--shard-cables", "copper"], "--shard-cables"),
    ],
)
def test_calibrate_refuses_bad_input_before_building_anything(args: list[str], field: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "emulate", "calibrate",
         str(ROOT / "topologies" / "fat-tree-k4.yaml"), *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and "Traceback" not in done.stderr


def test_sharded_calibrations_are_kept_apart_from_the_unsharded_one() -> None:
    """Scenario runs compare with the unsharded build's calibration; a sharded one has its own file."""
    plain = default_path("fat-tree-k4")
    assert plain.name == "calibration-fat-tree-k4.json"
    assert default_path("fat-tree-k4", 1, "patch").name == "calibration-fat-tree-k4-shards1-patch.json"
    assert default_path("fat-tree-k4", 4, "auto") != plain


def test_a_calibration_that_found_no_clean_rate_is_not_used(tmp_path: Path) -> None:
    """A saved calibration of 0 pkt/s (a machine that lost packets at every rate tried) sizes nothing and
    would make "offered 6e12x the capacity": loading it gives None, as if there were none."""
    path = tmp_path / "calibration.json"
    base = {"fabric": "fat-tree-k4", "per_host_pps": 2200.0, "total_pps": 35200.0}
    path.write_text(json.dumps(base))
    assert load("fat-tree-k4", path) == base
    path.write_text(json.dumps({**base, "per_host_pps": 0.0, "total_pps": 0.0}))
    assert load("fat-tree-k4", path) is None
