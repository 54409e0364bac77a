"""The pieces of the fast build and of `emulate clean` that need no OVS: OVSDB operations, run records."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from emulation import cleanup, runfile
from emulation.mesh import check_all_pairs, first_round
from emulation.ovsdb import BridgeSpec, bridge_operations, controller_operations


def test_bridge_operations_insert_every_row_once_and_reference_them_by_name() -> None:
    specs = [
        BridgeSpec("xs0", 0x2FAB, [("xs0-eth1", 1), ("xs0-eth2", 2)], "tcp:127.0.0.1:6653", 30000),
        BridgeSpec("xs1", 0x2FAC, [("xs1-eth7", 7)], None, patches={"xs1-eth7": "xs0-eth2"}),
    ]
    ops = bridge_operations(specs)
    inserts = [op for op in ops if op["op"] == "insert"]
    by_table: dict[str, list[dict[str, Any]]] = {}
    for op in inserts:
        by_table.setdefault(str(op["table"]), []).append(op)
    # each bridge's own local port (type internal) plus its ports
    assert [op["row"]["name"] for op in by_table["Interface"]] == [
        "xs0",
        "xs0-eth1",
        "xs0-eth2",
        "xs1",
        "xs1-eth7",
    ]
    assert [op["row"].get("ofport_request") for op in by_table["Interface"]] == [None, 1, 2, None, 7]
    assert by_table["Interface"][0]["row"]["type"] == "internal"
    assert [op["row"].get("type") for op in by_table["Interface"]] == [
        "internal",
        None,
        None,
        "internal",
        "patch",
    ]
    assert by_table["Interface"][4]["row"]["options"] == ["map", [["peer", "xs0-eth2"]]]
    assert [op["row"]["target"] for op in by_table["Controller"]] == ["tcp:127.0.0.1:6653"]
    bridges = by_table["Bridge"]
    assert [b["row"]["name"] for b in bridges] == ["xs0", "xs1"]
    assert bridges[0]["row"]["datapath_type"] == "netdev" and bridges[0]["row"]["fail_mode"] == "secure"
    assert ["datapath-id", "0000000000002fab"] in bridges[0]["row"]["other_config"][1]
    assert "controller" not in bridges[1]["row"]
    names = {op["uuid-name"] for op in inserts}
    assert len(names) == len(inserts)  # no uuid-name used twice
    for bridge in bridges:  # every port a bridge lists was inserted in this transaction
        assert {ref[1] for ref in bridge["row"]["ports"][1]} <= names
    (last,) = [op for op in ops if op["op"] == "mutate"]
    assert last is ops[-1] and last["table"] == "Open_vSwitch"
    assert {ref[1] for ref in last["mutations"][0][2][1]} == {b["uuid-name"] for b in bridges}
    assert last["mutations"][1] == ["next_cfg", "+=", 1]


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(runfile, "RUN_DIR", tmp_path / "runs")
    return tmp_path / "runs"


def test_run_records_round_trip_and_are_discarded(run_dir: Path) -> None:
    record = runfile.RunRecord("e1ab", ["e1abs0", "e1abh0"], 70000, os.getpid(), None, 1.0)
    path = runfile.write(record)
    assert path == run_dir / "e1ab.json"
    assert runfile.read(path) == record
    assert runfile.records() == [(path, record)]
    runfile.discard("e1ab")
    assert runfile.records() == []
    (run_dir / "junk.json").write_text("{not json")
    assert runfile.records() == []  # a damaged record is ignored, not a crash


def test_clean_leaves_a_run_that_is_still_alive_alone(run_dir: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fabriclab-stand-in"])
    try:
        record = runfile.RunRecord("e2cd", ["e2cds0"], 70001, child.pid, None, 1.0)
        runfile.write(record)
        deadline = time.monotonic() + 10  # until the child has exec'd (its command line is set)
        while not runfile.alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runfile.alive(child.pid)
        done = cleanup.clean(None)
        assert done.running == [f"e2cd (pid {child.pid})"] and done.runs == [] and done.removed == []
        assert runfile.read(runfile.path_of("e2cd")) == record  # its record stays: its teardown is its own
    finally:
        child.kill()
        child.wait()
    assert not runfile.alive(child.pid)


def test_a_recycled_pid_of_another_program_is_not_our_run() -> None:
    assert not runfile.alive(1, marker="fabriclab-no-such-marker")
    assert not runfile.alive(2**22 + 12345)  # no such process
    assert runfile.prefix_pattern("ab").fullmatch("abs12") and not runfile.prefix_pattern("ab").fullmatch(
        "ab1s2"
    )


@pytest.mark.parametrize(("n", "burst"), [(2, 1), (5, 1), (16, 32), (17, 4), (64, 7), (1024, 32)])
def test_the_checkers_first_round_sends_every_pair_once_a_burst_per_host(n: int, burst: int) -> None:
    order = list(first_round(n, burst))
    assert len(order) == len(set(order)) == n * (n - 1)
    assert all(s != d and 0 <= s < n and 0 <= d < n for s, d in order)
    # a host's frames of one burst go back to back, to consecutive shifts
    head = order[: min(burst, n - 1)]
    assert {s for s, _ in head} == {0} and [d for _, d in head] == list(range(1, len(head) + 1))
    if n - 1 > burst:
        assert order[burst] == (1, 2)


def test_the_checker_refuses_an_empty_burst() -> None:
    with pytest.raises(ValueError, match="burst 0"):
        check_all_pairs([], burst=0)


def test_controllers_can_be_given_after_the_bridges_in_a_second_transaction() -> None:
    specs = [
        BridgeSpec("xs0", 0x2FAB, [("xs0-eth1", 1)], "tcp:127.0.0.1:6653", 15000),
        BridgeSpec("xs1", 0x2FAC, [("xs1-eth7", 7)], None),
    ]
    first = bridge_operations(specs, controllers=False)
    assert not any(op.get("table") == "Controller" for op in first)
    assert all("controller" not in op["row"] for op in first if op.get("table") == "Bridge")
    second = controller_operations(specs)
    assert [(op["op"], op["table"]) for op in second] == [
        ("insert", "Controller"), ("update", "Bridge"), ("mutate", "Open_vSwitch"),
    ]  # fmt: skip
    insert, update, bump = second
    assert insert["row"] == {"target": "tcp:127.0.0.1:6653", "inactivity_probe": 15000, "max_backoff": 1000}
    assert update["where"] == [["name", "==", "xs0"]]
    assert update["row"]["controller"] == ["named-uuid", insert["uuid-name"]]
    assert bump["mutations"] == [["next_cfg", "+=", 1]]  # so cur_cfg tells when it is applied
