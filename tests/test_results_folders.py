"""Results folders never destroy what fabriclab did not write (`fabriclab.cli.results`): every command that
writes a folder (`sim`, `sweep`, `scenario run`, `compare`, `route --dump-dir`) refuses a file, a folder of
other things and the current folder; replaces only an earlier result of the same command (or with
`--force`); and leaves neither half a folder nor a temporary one, whether it fails, is interrupted or is
stopped by SIGTERM.  A Dask sweep that loses its workers stops in bounded time, keeps the units that
finished, and the same command resumes from them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabriclab.cli import main
from fabriclab.cli.common import CliError
from fabriclab.cli.results import MARKER, results_dir
from tests.conftest import ROOT

TOPO = str(ROOT / "topologies" / "fat-tree-k4.yaml")
SIM = ["sim", "--topology", TOPO, "--traffic", "permutation", "--policies", "static"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))
    }


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_sim_writes_a_marked_folder_and_replaces_only_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r"
    assert _run(capsys, *SIM, "-o", str(out))[0] == 0
    assert json.loads((out / MARKER).read_text())["command"] == "sim"
    (out / "summary.json").write_text("old")
    assert _run(capsys, *SIM, "-o", str(out))[0] == 0  # an earlier `sim` result: replaced whole
    assert json.loads((out / "summary.json").read_text())["policies"]["static"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary beside it
    # Another command's result is not this command's to replace.
    dump = tmp_path / "dump"
    assert _run(capsys, "route", TOPO, "--dump-dir", str(dump))[0] == 0
    before = _tree(dump)
    code, err = _run(capsys, *SIM, "-o", str(dump))
    assert code == 2 and "(a `fabriclab route` result)" in err and _tree(dump) == before
    # A folder of the user's: refused, then replaced with --force (what --force is for).
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    code, err = _run(capsys, *SIM, "-o", str(mine))
    assert code == 2 and "not a fabriclab result" in err and (mine / "notes.txt").read_text() == "mine"
    assert _run(capsys, *SIM, "-o", str(mine), "--force")[0] == 0
    assert not (mine / "notes.txt").exists() and (mine / "summary.json").exists()


def test_route_dump_dir_replaces_its_own_dump_and_refuses_opensm_dumps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenSM's own dump folder (opensm-lfts.dump of the reference) is exactly what must not be
    overwritten by ours."""
    osm = tmp_path / "osm"
    osm.mkdir()
    (osm / "opensm-lfts.dump").write_text("OpenSM's tables\n")
    code, err = _run(capsys, "route", TOPO, "--dump-dir", str(osm))
    assert code == 2 and "--dump-dir" in err and (osm / "opensm-lfts.dump").read_text() == "OpenSM's tables\n"
    ours = tmp_path / "ours"
    for _ in range(2):
        assert _run(capsys, "route", TOPO, "--dump-dir", str(ours))[0] == 0
    assert sorted(p.name for p in ours.iterdir()) == [
        MARKER,
        "opensm-ftree-ca-order.dump",
        "opensm-lfts.dump",
        "opensm-subnet.lst",
        "report.json",
    ]


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_write_leaves_the_previous_result_and_no_temporary(
    tmp_path: Path, failure: BaseException
) -> None:
    out = tmp_path / "r"
    with results_dir(out, "sim") as folder:
        (folder / "summary.json").write_text("first")
    before = _tree(tmp_path)
    seen: list[Path] = []
    with pytest.raises(type(failure)), results_dir(out, "sim", on_failure=seen.append) as folder:
        (folder / "summary.json").write_text("half")
        raise failure
    assert _tree(tmp_path) == before and seen and not seen[0].exists()


def test_the_folder_is_checked_again_before_it_is_replaced(tmp_path: Path) -> None:
    """A user who puts a folder of their own where the results will go, while the run runs, keeps it."""
    out = tmp_path / "r"
    with pytest.raises(CliError, match="not a fabriclab result"), results_dir(out, "sim") as folder:
        (folder / "summary.json").write_text("new")
        out.mkdir()
        (out / "theirs.txt").write_text("theirs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"] and (out / "theirs.txt").exists()


def test_sigterm_during_a_simulation_stops_it_and_keeps_the_previous_result(tmp_path: Path) -> None:
    """A k=12 all-to-all takes ~16 s here; SIGTERM once it reports progress ends it within 5 s, exit 130,
    and the earlier result in the same folder is untouched, with no temporary beside it."""
    big = tmp_path / "ft12.yaml"
    assert main(["topo", "generate", "fat-tree", "--k", "12", "-o", str(big)]) == 0
    out = tmp_path / "r"
    assert main([*SIM, "-o", str(out)]) == 0
    before = _tree(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabriclab", "sim", "--topology", str(big), "--traffic", "alltoall", "-o",
         str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    assert proc.stderr is not None
    stderr = proc.stderr
    first: list[str] = []  # the first progress line: the simulation is under way (not a fixed sleep)
    reader = threading.Thread(target=lambda: first.append(stderr.readline()), daemon=True)
    reader.start()
    reader.join(60)
    assert first and first[0].strip(), "no progress line within 60 s"
    assert proc.poll() is None, first[0] + stderr.read()
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert time.monotonic() - signalled < 5, "SIGTERM took more than 5 s"
    assert proc.returncode == 130
    assert _tree(tmp_path) == before


# --- Dask sweeps that lose their workers -------------------------------------------------------------

SWEEP = """\
fabriclab: 1
name: resume
policies: [static, ecmp]
workloads: [alltoall]
fabrics:
  - {kind: fat-tree, k: 6}
seeds: [1, 2, 3, 4, 5, 6, 7, 8]
size: 1MiB
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(*argv: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", *argv], env=ENV, cwd=cwd, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    proc = _spawn("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
                  "--no-dashboard", cwd=tmp_path)  # fmt: skip
    address = f"tcp://127.0.0.1:{port}"
    from distributed import Client

    with Client(address, timeout="60s"):  # type: ignore[no-untyped-call]
        pass  # it answers
    yield address
    _stop(proc)


def _worker(address: str, cwd: Path) -> subprocess.Popen[bytes]:
    worker = _spawn("distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard", cwd=cwd)
    from distributed import Client

    with Client(address, timeout="60s") as client:  # type: ignore[no-untyped-call]
        client.wait_for_workers(1, timeout=60)
    return worker


def test_a_dask_sweep_with_no_worker_stops_in_bounded_time(tmp_path: Path, scheduler: str) -> None:
    (tmp_path / "s.yaml").write_text(SWEEP)
    out = tmp_path / "out"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "sweep", str(tmp_path / "s.yaml"), "-o", str(out), "--dask",
         scheduler, "--dask-timeout", "2"], capture_output=True, text=True, env=ENV, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"no live worker at {scheduler} for 2 s; 0 of 8 units finished" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 60
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_a_dask_sweep_that_loses_its_last_worker_keeps_finished_units_and_resumes(
    tmp_path: Path, scheduler: str
) -> None:
    (tmp_path / "s.yaml").write_text(SWEEP)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "fabriclab", "sweep", str(tmp_path / "s.yaml"), "-o", str(out), "--dask",
            scheduler, "--dask-timeout", "2"]  # fmt: skip
    worker = _worker(scheduler, tmp_path)
    sweep = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert sweep.stderr is not None
        for line in sweep.stderr:  # the progress lines: the first unit done, then the worker dies
            if "sweep: 1/8 units" in line:
                break
        _stop(worker, signal.SIGKILL)
        _, err = sweep.communicate(timeout=120)
    finally:
        _stop(worker, signal.SIGKILL)
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 2, err
    assert f"no live worker at {scheduler} for 2 s" in err and "the same command resumes" in err
    kept = (out / "partial.jsonl").read_text().splitlines()
    assert 1 <= len(kept) < 8
    worker = _worker(scheduler, tmp_path)
    try:
        again = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300, check=False)
    finally:
        _stop(worker)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {len(kept)} of 8 units finished earlier" in again.stdout
    rows = json.loads((out / "results.json").read_text())["rows"]
    local = tmp_path / "local"
    assert main(["sweep", str(tmp_path / "s.yaml"), "-o", str(local), "--workers", "1"]) == 0
    assert rows == json.loads((local / "results.json").read_text())["rows"]  # resumed == whole
    assert not (out / "partial.jsonl").exists()


def test_sweep_seeds_are_checked_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Validation used to try seed 0 only, so `seeds: [-1, 2]` passed it and failed in NumPy."""
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP.replace("seeds: [1, 2, 3, 4, 5, 6, 7, 8]", "seeds: [2, -1]"))
    code, err = _run(capsys, "sweep", str(path), "-o", str(tmp_path / "out"))
    assert code == 2 and f"{path}:7: seeds[1]: Input should be greater than or equal to 0 (got -1)" in err
    assert not (tmp_path / "out").exists()


def test_text_files_with_nul_bytes_name_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"fabriclab: 1\nname: a\x00b\n")
    code, err = _run(capsys, "scenario", "check", str(path))
    assert (
        code == 2 and err.strip() == f"fabriclab: error: {path}:2: not a text file: a NUL byte (binary data?)"
    )
    path.write_bytes(b"fabriclab: 1\nname: a\x07b\n")
    code, err = _run(capsys, "scenario", "check", str(path))
    assert code == 2 and f"{path}:2: invalid YAML: character '\\x07' is not allowed" in err
    assert "unicode string" not in err


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a SIGTERM handler (SigCgt in /proc): from outside, no timing guessed."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize("after_s", [0.0, 0.3, 2.0])
def test_sigterm_at_any_moment_of_start_up_is_exit_130_and_writes_nothing(
    tmp_path: Path, after_s: float
) -> None:
    """The first line of `fabriclab` remembers a stop signal, so one that comes while the heavy imports run
    (seconds on a loaded machine) is not the default action (-15, no message): the command does not start,
    says so, exits 130.  Later, the command stops as on Ctrl-C (also 130).  Either way nothing is written.
    The signal is sent once the handler is in place (seen in /proc), then `after_s` later."""
    big = tmp_path / "ft12.yaml"
    assert main(["topo", "generate", "fat-tree", "--k", "12", "-o", str(big)]) == 0
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabriclab", "sim", "--topology", str(big), "--traffic", "alltoall", "-o",
         str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    if after_s == 0.0:
        assert "stopped before it started: nothing was done" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft12.yaml"]


BENCHMARKS = sorted(
    p.name for p in (ROOT / "benchmarks").glob("*.py") if 'add_argument("--out"' in p.read_text()
)


@pytest.mark.parametrize("script", BENCHMARKS)
def test_every_benchmark_checks_its_out_before_running(tmp_path: Path, script: str) -> None:
    """A benchmark runs for minutes: `--out` that cannot be written is refused first, and a folder of the
    user's (where `opensm_sim.py` would keep its work) is never written into."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "opensm-lfts.dump").write_text("OpenSM's\n")
    net = str(ROOT / "tests" / "data" / "opensm-ft3-k4" / "fabric.net")
    args = [net] if script == "opensm_sim.py" else []
    bad = "mine" if script == "opensm_sim.py" else "."
    for out, message in ((bad, "--out"), ("/proc/sys/x", "--out")):
        done = subprocess.run(
            [sys.executable, "-m", f"benchmarks.{script.removesuffix('.py')}", *args, "--out", out],
            cwd=tmp_path,
            capture_output=True, text=True, timeout=120, check=False, env=ENV,
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "mine" / "opensm-lfts.dump").read_text() == "OpenSM's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_benchmark_results_are_written_whole(tmp_path: Path) -> None:
    from benchmarks.out import out_file, write_out

    path = out_file(str(tmp_path / "new" / "figures.json"))
    write_out(path, '{"a": 1}')
    write_out(path, '{"a": 2}')
    assert path.read_text() == '{"a": 2}\n' and sorted(p.name for p in path.parent.iterdir()) == [
        "figures.json"
    ]
