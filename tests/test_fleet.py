"""The probe fleet (`emulation.fleet`): every flow of a calibration step from two processes, with the
probes' own records.  Here on loopback, each flow's two ends "in" this process's own namespace (the fleet
enters whatever namespace each flow names); on a fabric they are the hosts'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

FLEET = [sys.executable, "-m", "emulation.fleet"]
HERE = "/proc/self/ns/net"


def _run(spec: dict[str, object]) -> tuple[int, str, str]:
    proc = subprocess.Popen(FLEET, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec) + "\n")
    proc.stdin.flush()
    if proc.stdout.readline().strip() != "ready":
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err
    out, err = proc.communicate(f"{time.time() + 0.2!r}\n", timeout=60)
    return proc.returncode, out, err


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_every_flow_sends_its_rate_and_each_receiver_counts_only_its_own() -> None:
    flows = [{"src_netns": HERE, "dst_netns": HERE, "dst": "127.0.0.1", "port": 47400 + i} for i in range(3)]
    rates = 400
    code, out, err = _run({"flows": flows, "rate_pps": rates, "seconds": 1.0, "size": 512, "grace_s": 0.5})
    assert code == 0, err
    got = json.loads(out)
    assert len(got["senders"]) == len(got["receivers"]) == 3
    for sent, received in zip(got["senders"], got["receivers"], strict=True):
        assert 0.9 * rates <= sent["sent"] <= rates + 1, sent
        assert received["received"] == sent["sent"] and received["max_seq"] == sent["sent"] - 1, received
        assert received["bytes"] == 512 * sent["sent"] and received["gaps"] == []
        assert received["latency_ms"]["p50"] < 50, received["latency_ms"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"flows": []}, "no flows"),
        (
            {
                "flows": [
                    {"src_netns": "/nonexistent", "dst_netns": HERE, "dst": "127.0.0.1", "port": 47410}
                ],
                "rate_pps": 10,
                "seconds": 1,
                "size": 64,
            },
            "nonexistent",
        ),
    ],
)
def test_a_bad_specification_is_refused_in_one_line_with_exit_2(
    spec: dict[str, object], message: str
) -> None:
    code, _, err = _run(spec)
    assert code == 2 and message in err and "Traceback" not in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_a_scenarios_flows_keep_their_own_rate_window_size_entropy_and_marking() -> None:
    """A scenario run sends its flows through one fleet: each flow's own rate, start and duration, size,
    fixed source port and DSCP, the spec's values only where a flow says nothing."""
    base = {"src_netns": HERE, "dst_netns": HERE, "dst": "127.0.0.1"}
    plan = [
        {**base, "port": 47420},  # the defaults: 200 pkt/s for the whole second, 256 bytes
        {**base, "port": 47421, "rate_pps": 500, "start_s": 0.5, "duration_s": 0.4, "size": 1000},
        {**base, "port": 47422, "sport": 49200, "dscp": 26, "duration_s": 0.5},
    ]
    spec = {"flows": plan, "rate_pps": 200, "seconds": 1.0, "size": 256, "grace_s": 0.5}
    code, out, err = _run(spec)
    assert code == 0, err
    sent, received = json.loads(out)["senders"], json.loads(out)["receivers"]
    assert 190 <= sent[0]["sent"] <= 201 and sent[0]["size"] == 256, sent[0]
    assert 190 <= sent[1]["sent"] <= 201 and sent[1]["size"] == 1000, sent[1]  # 500 pkt/s for 0.4 s
    assert 95 <= sent[2]["sent"] <= 101 and sent[2]["dscp"] == 26 and sent[2]["entropy"] == "fixed", sent[2]
    # the late flow started half a second after the others, and ended 0.1 s before the run did
    assert sent[1]["start"] - sent[0]["start"] == pytest.approx(0.5, abs=1e-6)
    late = received[1]
    assert late["first"] - sent[0]["start"] >= 0.5 and late["last"] - sent[0]["start"] <= 0.95
    for tx, rx in zip(sent, received, strict=True):
        assert rx["received"] == tx["sent"] and rx["gaps"] == [], rx
        assert rx["bytes"] == tx["size"] * tx["sent"]


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_a_flow_split_over_two_fleets_is_sent_by_one_and_received_by_the_other() -> None:
    """Across machines a flow's sender runs where its source is and its receiver where its destination
    is: a fleet given only one side of a flow opens only that side and reports None for the other."""
    both = [{"dst": "127.0.0.1", "port": 47440 + i, "rate_pps": 300} for i in range(2)]
    senders = [{**f, "src_netns": HERE, "dst_netns": None} for f in both]
    receivers = [{**f, "src_netns": None, "dst_netns": HERE} for f in both]
    start = time.time() + 0.5
    procs = []
    for flows in (receivers, senders):  # receivers first: their sockets are open before a packet leaves
        proc = subprocess.Popen(FLEET, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"flows": flows, "seconds": 1.0, "size": 256, "grace_s": 0.5}) + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ready"
        procs.append(proc)
    for proc in procs:  # both told when to start before either is waited for
        assert proc.stdin is not None
        proc.stdin.write(f"{start!r}\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    received, sent = results
    assert sent["receivers"] == [None, None] and received["senders"] == [None, None]
    for tx, rx in zip(sent["senders"], received["receivers"], strict=True):
        assert 0.9 * 300 <= tx["sent"] <= 301, tx
        assert rx["received"] == tx["sent"] and rx["bytes"] == 256 * tx["sent"], rx


def test_the_records_of_several_machines_merge_into_one_per_flow() -> None:
    """`ClusterFleet.collect`: each side from the machine that has it; a side nobody reported is an error
    naming the flows, not a silent zero."""
    from emulation.cluster import ClusterFleet

    class Done:
        def __init__(self, value: object) -> None:
            self.value = value

        def result(self, timeout: float) -> object:
            return self.value

    class Actor:
        def __init__(self, records: dict[str, list[object]]) -> None:
            self.records = records

        def fleet_collect(self, timeout_s: float) -> Done:
            return Done(self.records)

    class Cluster:
        def __init__(self, actors: dict[str, Actor]) -> None:
            self.actors = actors

        def _wait_all(self, futures: list[Done], what: str, timeout_s: float = 1.0) -> list[object]:
            return [f.result(timeout_s) for f in futures]

    a = Actor({"senders": [{"sent": 5}, None], "receivers": [None, {"received": 7}]})
    b = Actor({"senders": [None, {"sent": 8}], "receivers": [{"received": 4}, None]})
    merged = ClusterFleet(Cluster({"a": a, "b": b}), ["a", "b"], 2).collect(1.0)  # type: ignore[arg-type]
    assert merged == {"senders": [{"sent": 5}, {"sent": 8}], "receivers": [{"received": 4}, {"received": 7}]}
    with pytest.raises(RuntimeError, match=r"sender of flows \[1\]"):
        ClusterFleet(Cluster({"a": a}), ["a"], 2).collect(1.0)  # type: ignore[arg-type]
