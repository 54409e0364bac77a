"""`fabriclab trace import kineto`: PyTorch profiler traces (built to the published Kineto schema, several
ranks, all-reduce / all-gather / reduce-scatter / all-to-all on overlapping streams) into the congestion
trace format, and back through a scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labspec.scenario import load_scenario
from tests.conftest import ROOT
from tests.kineto_fixtures import rank_trace, schedule, write_ranks
from traffic.errors import TrafficError
from traffic.kineto import collectives_of, import_kineto
from traffic.patterns import plan
from traffic.trace import read_trace

HOSTS = [f"h{i}" for i in range(1, 17)]


def fabriclab(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "fabriclab", *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT, env=env)  # fmt: skip


def test_every_rank_sends_the_planners_messages_of_its_collectives(tmp_path: Path) -> None:
    files = write_ranks(tmp_path / "k")
    got = import_kineto(files, HOSTS)
    assert len(got.collectives) == 16 * 6
    records = got.records
    # bytes: each rank's sends are exactly the planner's transfers of its collectives, nothing else
    for rank in (0, 5, 13):
        mine = [r for r in records if r.src == HOSTS[rank]]
        expected = 0
        assert len([c for c in got.collectives if c.rank == rank]) == len(schedule(rank))
        for c in [c for c in got.collectives if c.rank == rank]:
            transfers = plan(c.kind, [HOSTS[r] for r in c.group], c.size_bytes).transfers
            expected += sum(t.size_bytes for t in transfers if t.src == HOSTS[rank])
        assert sum(r.size_bytes for r in mine) == expected
    # nccl-tests sizes: all-reduce by input, all-gather by output, reduce-scatter by input
    sizes = {c.name: c.size_bytes for c in got.collectives if c.rank == 0}
    assert sizes == {"_allgather_base": 16 << 20, "allreduce": 32 << 20, "all_to_all": 8 << 20,
                     "_reduce_scatter_base": 16 << 20}  # fmt: skip
    # every record names the collective it came from; times sorted; ranks' clocks aligned to the first
    assert all("#" in r.tag and "/pg" in r.tag and "/s" in r.tag for r in records)
    times = [r.time_us for r in records]
    assert times == sorted(times) and times[0] == 0.0
    # overlapping streams: the all-reduce (data-parallel group) overlaps the all-gather (tensor-parallel)
    # and rides other connections, so the two may overtake each other; one group's collectives keep one
    dp = {(r.src, r.qp) for r in records if "allreduce" in r.tag}
    tp = {(r.src, r.qp) for r in records if "_allgather_base" in r.tag}
    assert dp and tp and not dp & tp
    first_ar = min(r.time_us for r in records if r.tag.startswith("allreduce#0"))
    last_ag = max(r.time_us for r in records if r.tag.startswith("_allgather_base#0"))
    assert first_ar < last_ag


def test_the_cli_round_trip_and_a_scenario_replays_it(tmp_path: Path) -> None:
    files = write_ranks(tmp_path / "k")
    out = tmp_path / "trace.jsonl"
    done = fabriclab("trace", "import", "kineto", *map(str, files), "--hosts", "h1..h16", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "allreduce x32" in done.stdout and "448 messages" in done.stdout
    records = read_trace(out)
    assert len(records) == 448
    shipped = read_trace(ROOT / "scenarios" / "traces" / "kineto-step-16.jsonl")
    assert records == shipped  # the shipped trace is this import of the shipped Kineto files:
    for rank, path in enumerate(files):
        assert (ROOT / "scenarios" / "traces" / "kineto" / path.name).read_text() == path.read_text(), rank
    scenario_file = str(ROOT / "scenarios" / "trace-k4.yaml")
    again = fabriclab("trace", "import", "kineto", *map(str, files), "--scenario", scenario_file, "-o",
                      str(tmp_path / "again.jsonl"))  # fmt: skip
    assert again.returncode == 0 and read_trace(tmp_path / "again.jsonl") == records
    scenario = load_scenario(ROOT / "scenarios" / "trace-k4.yaml")
    assert scenario.spec.traffic[0].kind == "trace"


def test_a_trace_without_nccl_events_is_a_clear_error(tmp_path: Path) -> None:
    doc = rank_trace(0)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["args"].get("Collective name") in (None, "send")]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "t.jsonl"
    done = fabriclab("trace", "import", "kineto", str(path), "--hosts", "h1..h16", "-o", str(out))
    assert done.returncode == 2 and not out.exists()
    assert "no NCCL collectives" in done.stderr and "send x1" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _kernel(doc: dict[str, Any]) -> dict[str, Any]:
    """The first NCCL kernel event (the importer reads kernels when the trace has them)."""
    return next(e for e in doc["traceEvents"] if e["cat"] == "kernel" and "Collective name" in e["args"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(traceEvents="x"), "traceEvents"),
        (lambda d: _kernel(d)["args"].update(dtype="Float99"), "unknown dtype 'Float99'"),
        (lambda d: _kernel(d)["args"].update({"Out msg nelems": -1}), "Out msg nelems"),  # all-gather: output
        (lambda d: d["distributedInfo"].update(rank=-1), "distributedInfo.rank"),
    ],
)
def test_bad_kineto_input_names_the_field(tmp_path: Path, change: object, message: str) -> None:
    doc = rank_trace(0)
    change(doc)  # type: ignore[operator]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TrafficError, match=message):
        import_kineto([path], HOSTS)


def test_truncated_group_ranks_and_too_few_hosts(tmp_path: Path) -> None:
    doc = rank_trace(0)
    for e in doc["traceEvents"]:
        if e.get("args", {}).get("Process Group Name") == "dp0":
            e["args"]["Process Group Ranks"] = "[0, 4, ...]"  # what PyTorch writes for long lists
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    found, _ = collectives_of(path)
    assert {c.group for c in found if c.group_name == "dp0"} == {(0, 4, 8, 12)}
    with pytest.raises(TrafficError, match="rank 12 has no host"):
        import_kineto([path], HOSTS[:8])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TrafficError, match="not JSON"):
        import_kineto([bad], HOSTS)
