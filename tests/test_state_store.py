"""The controller's state directory: atomic saves that never collide, a failed save that changes nothing,
one controller per directory, damaged files refused whole before anything starts, and a generation
counter that can never wrap the 48-bit cookie."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from controller.sm.intents import MAX_GENERATION, GenerationExhausted, cookie_of, generation_of
from controller.sm.manager import SubnetManager
from controller.statestore import STATE_FILE, SavedState, StateError, StateStore
from emulation.controlproc import ControllerProcess, free_port
from tests.conftest import ROOT
from topologies.generators import fat_tree

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
STATE = SavedState("ftree", True, False, 7)


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_save_then_load_round_trips_and_leaves_only_the_state_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.save(STATE)
    assert store.load() == STATE
    assert listing(tmp_path / "state") == [STATE_FILE]


def test_concurrent_writers_never_collide(tmp_path: Path) -> None:
    """Writers used to share one temporary name: the loser's rename raised FileNotFoundError."""
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        store = StateStore(tmp_path)
        try:
            for i in range(150):
                store.save(SavedState("sssp", False, True, offset + i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    loaded = StateStore(tmp_path).load()
    assert loaded is not None and loaded.generation % 1000 == 149
    assert listing(tmp_path) == [STATE_FILE]


def test_a_failed_rename_raises_and_changes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    (tmp_path / STATE_FILE / "x").mkdir(parents=True)  # the state "file" is a non-empty directory
    with pytest.raises(StateError, match=f"{STATE_FILE}: cannot save state"):
        store.save(STATE)
    assert listing(tmp_path) == [STATE_FILE] and listing(tmp_path / STATE_FILE) == ["x"]


def test_a_write_that_fails_half_way_keeps_the_old_state(tmp_path: Path) -> None:
    """A full disk, simulated with a file-size limit: the new text cannot be written whole."""
    StateStore(tmp_path).save(STATE)
    before = (tmp_path / STATE_FILE).read_bytes()
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from controller.statestore import SavedState, StateError, StateStore\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20, 20))\n"
        "try:\n"
        f"    StateStore(Path({str(tmp_path)!r})).save(SavedState('sssp', False, True, 8))\n"
        "except StateError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3 and "cannot save state: File too large" in done.stdout, done.stderr
    assert (tmp_path / STATE_FILE).read_bytes() == before
    assert listing(tmp_path) == [STATE_FILE]


def test_a_generation_outside_the_cookie_is_never_saved(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(SavedState("ftree", True, False, MAX_GENERATION))  # the last one a cookie can carry
    with pytest.raises(StateError, match=r"generation: must be 0\.\."):
        store.save(SavedState("ftree", True, False, MAX_GENERATION + 1))
    assert json.loads((tmp_path / STATE_FILE).read_text())["generation"] == MAX_GENERATION


def test_one_store_per_directory_holds_the_lock(tmp_path: Path) -> None:
    first = StateStore(tmp_path / "state")
    first.lock()
    second = StateStore(tmp_path / "state")
    with pytest.raises(StateError) as info:
        second.lock()
    assert str(info.value) == (
        f"{tmp_path / 'state'}: state directory is in use by another controller (pid {os.getpid()})"
    )
    first.unlock()
    second.lock()  # released: the next one gets it
    second.unlock()


def run_controller(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabriclab", "controller", "--topology", str(TOPOLOGY),
         "--openflow", f"127.0.0.1:{free_port()}", "--api", f"127.0.0.1:{free_port()}", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def assert_refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2 with one line: nothing was logged, so no listener was started."""
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("fabriclab: error: --state-dir: "), (
        done.stderr
    )
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_a_second_controller_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = ControllerProcess(TOPOLOGY, state, tmp_path / "first.log")
    first.start()
    try:
        assert first.proc is not None
        done = run_controller("--state-dir", str(state))
        assert_refused(
            done, f"{state}: state directory is in use by another controller (pid {first.proc.pid})"
        )
        assert first.get("health")["switches_declared"] == 20  # the first one is untouched
    finally:
        first.stop()


def damaged_states() -> dict[str, tuple[bytes, str]]:
    valid = {"format": 1, "engine": "ftree", "fast_failover": True, "multipath": False}

    def with_generation(text: str) -> bytes:
        return json.dumps(valid)[:-1].encode() + b', "generation": ' + text.encode() + b"}"

    return {
        "binary": (bytes(range(256)), "not UTF-8 text"),
        "not-utf8": (b'{"format": 1, "engine": "\xff"}', "not UTF-8 text"),
        "nested": (b"[" * 20_000 + b"]" * 20_000, "nested too deeply"),
        "5000-digits": (with_generation("9" * 5000), "not a state file: Exceeds the limit"),
        "1e30": (with_generation("1e30"), "generation: expected int, got 1e+30"),
        "48-bit": (with_generation(str(1 << 48)), f"generation: must be 0..{MAX_GENERATION - 1}"),
        "exhausted": (with_generation(str(MAX_GENERATION)), "start on a fresh state directory"),
        "negative": (with_generation("-1"), "generation: must be 0.."),
        "duplicate": (b'{"format": 1, "format": 1}', "'format': field appears twice"),
        "huge": (b" " * 1_100_000 + b"{}", "too large: 1,100,002 bytes (at most 1,048,576)"),
    }


@pytest.mark.parametrize("kind", sorted(damaged_states()))
def test_damaged_state_is_refused_whole(tmp_path: Path, kind: str) -> None:
    content, message = damaged_states()[kind]
    (tmp_path / STATE_FILE).write_bytes(content)
    with pytest.raises(StateError) as info:
        StateStore(tmp_path).load()
    assert str(info.value).startswith(f"{tmp_path / STATE_FILE}: ") and message in str(info.value), info.value


@pytest.mark.parametrize("kind", ["binary", "nested", "5000-digits", "1e30", "48-bit"])
def test_the_controller_refuses_damaged_state_before_starting(tmp_path: Path, kind: str) -> None:
    content, message = damaged_states()[kind]
    (tmp_path / STATE_FILE).write_bytes(content)
    assert_refused(run_controller("--state-dir", str(tmp_path)), f"{tmp_path / STATE_FILE}: ", message)


def test_a_state_dir_that_cannot_be_used_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("not a directory\n")
    assert_refused(
        run_controller("--state-dir", str(a_file)), f"{a_file}: state directory is not a directory"
    )
    assert_refused(
        run_controller("--state-dir", str(a_file / "sub")), f"{a_file / 'sub'}: cannot use as state directory"
    )
    assert_refused(run_controller("--state-dir", "/proc/no-such/dir"), "/proc/no-such/dir: cannot use")
    fifo = tmp_path / "state"
    fifo.mkdir()
    os.mkfifo(fifo / STATE_FILE)  # a state file that would block the start forever
    assert_refused(run_controller("--state-dir", str(fifo)), "not a regular file (a named pipe)")
    assert a_file.read_text() == "not a directory\n"


def test_the_generation_never_wraps_the_cookie() -> None:
    assert generation_of(cookie_of(MAX_GENERATION)) == MAX_GENERATION
    with pytest.raises(GenerationExhausted):
        cookie_of(MAX_GENERATION + 1)
    manager = SubnetManager(fat_tree(2), generation=MAX_GENERATION - 1)
    assert manager.recompute().generation == MAX_GENERATION
    with pytest.raises(GenerationExhausted, match="last the 48-bit cookie can carry"):
        manager.compute()
    assert manager.generation == MAX_GENERATION  # refused: nothing changed
