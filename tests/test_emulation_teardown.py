"""Stopping `fabriclab emulate up` at any moment leaves nothing behind, quickly; `emulate clean` removes
what a SIGKILLed run left, and only that.  A k=8 fat-tree (80 bridges, 128 host namespaces, 384 veths),
signalled at several moments of its bring-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from emulation import runfile
from emulation.controlproc import free_port
from emulation.mnfabric import leftovers, listening, mininet_available
from emulation.ovs import OvsDaemon
from tests.conftest import ROOT
from tests.emulation_support import prefix_leftovers, require_emulation, unique_prefix

K8 = ROOT / "topologies" / "fat-tree-k8.yaml"
#: What the issue demands: stopped and cleaned up within this many seconds of the signal.
STOP_BUDGET_S = 30.0


@pytest.fixture(scope="module")
def daemon() -> Iterator[OvsDaemon]:
    require_emulation(mininet_available())
    d = OvsDaemon()
    try:
        d.ensure_running()
        yield d
    finally:
        d.stop_if_started()


class Run:
    """One `emulate up` of the k=8 fat-tree in its own session (as a terminal's job would be), with
    ports of its own; its output is collected line by line."""

    def __init__(self, tmp_path: Path, prefix: str, *extra: str) -> None:
        self.prefix = prefix
        self.api, self.openflow = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fabriclab", "emulate", "up", str(K8), "--no-cli", "--name-prefix", prefix,
             "--api", f"127.0.0.1:{self.api}", "--openflow", f"127.0.0.1:{self.openflow}",
             "--emu-api", f"127.0.0.1:{free_port()}", "--ready-timeout", "300", *extra],
            cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_until(self, what: str, cond: Callable[[], bool], timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert self.proc.poll() is None, f"exited before {what}: {self.output()}"
            assert time.monotonic() < deadline, f"not {what} after {timeout_s} s: {self.output()}"
            time.sleep(0.05)

    def said(self, start: str) -> bool:
        return any(line.startswith(start) for line in self.lines)

    def record(self) -> runfile.RunRecord | None:
        return runfile.read(runfile.path_of(self.prefix))

    def stop(self, sig: int, to_group: bool = False, again_after_s: float | None = None) -> float:
        """Signal it (or its whole process group, as a terminal's Ctrl-C does); seconds until it exited."""
        started = time.monotonic()
        send = (lambda s: os.killpg(self.proc.pid, s)) if to_group else self.proc.send_signal
        send(sig)
        if again_after_s is not None:
            time.sleep(again_after_s)
            if self.proc.poll() is None:
                send(sig)
        try:
            self.proc.wait(STOP_BUDGET_S + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - started

    def assert_nothing_left(self) -> None:
        assert prefix_leftovers(self.prefix) == [], self.output()
        found = subprocess.run(["pgrep", "-f", f"fabriclab controller.*--api 127.0.0.1:{self.api}"],
                               capture_output=True, check=False)  # fmt: skip
        assert found.stdout == b"", "the controller outlived its run"
        assert not listening("127.0.0.1", self.api, 1.0) and not listening("127.0.0.1", self.openflow, 1.0)
        assert self.record() is None, "the run's record outlived it"


def _our_links(prefix: str) -> bool:
    return any(item.startswith("link ") for item in prefix_leftovers(prefix))


def _some_bridges(prefix: str) -> bool:
    return any(item.startswith("bridge ") for item in prefix_leftovers(prefix))


MOMENTS: dict[str, Callable[[Run], None]] = {
    # the controller starting, or the first `ip -batch` under way
    "after 2 s": lambda run: time.sleep(2.0),
    # veths exist, bridges being committed and applied by ovs-vswitchd, hosts being configured
    "mid-build": lambda run: run.wait_until("building", lambda: _our_links(run.prefix), 120),
    # the controller programming 80 switches
    "bridges up": lambda run: run.wait_until("bridges", lambda: _some_bridges(run.prefix), 120),
    # verified and serving
    "after ready": lambda run: run.wait_until("ready", lambda: run.said("running;")),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_sigterm_at_any_moment_of_a_k8_bring_up_leaves_nothing_within_30_s(
    daemon: OvsDaemon, tmp_path: Path, moment: str
) -> None:
    run = Run(tmp_path, unique_prefix("g"))
    try:
        MOMENTS[moment](run)
        took = run.stop(signal.SIGTERM)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        leftover = prefix_leftovers(run.prefix)
        if leftover:
            subprocess.run([sys.executable, "-m", "fabriclab", "emulate", "clean", "--prefix", run.prefix],
                           check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert run.proc.returncode in (0, 130), run.output()
    assert took < STOP_BUDGET_S, f"{moment}: took {took:.1f} s to stop: {run.output()}"
    run.assert_nothing_left()


def test_ctrl_c_to_the_whole_group_twice_mid_build_still_cleans_up(daemon: OvsDaemon, tmp_path: Path) -> None:
    """A terminal sends Ctrl-C to the whole foreground group: the controller (its own group) is not hit
    and is stopped in order; a second Ctrl-C does not abandon the teardown the first one started."""
    run = Run(tmp_path, unique_prefix("g"))
    try:
        MOMENTS["mid-build"](run)
        took = run.stop(signal.SIGINT, to_group=True, again_after_s=0.3)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert run.proc.returncode in (0, 130), run.output()
    assert took < STOP_BUDGET_S, f"took {took:.1f} s to stop"
    run.assert_nothing_left()


def test_emulate_clean_removes_what_a_sigkilled_run_left_and_nothing_else(
    daemon: OvsDaemon, tmp_path: Path
) -> None:
    run = Run(tmp_path, unique_prefix("g"))
    decoy = unique_prefix("d")  # another run's names, as clean must find them: left alone
    decoy_link, decoy_ns = f"{decoy}s0-eth1", f"{decoy}h0"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run.wait_until("tables installed", lambda: run.said("tables installed"))
        record = run.record()
        assert record is not None and record.controller_pid is not None
        assert set(record.names) >= {f"{run.prefix}s0", f"{run.prefix}h127"}
        run.proc.kill()
        run.proc.wait()
        # PR_SET_PDEATHSIG: the kernel stops the controller when its parent dies, even by SIGKILL
        deadline = time.monotonic() + 20
        while runfile.alive(record.controller_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not runfile.alive(record.controller_pid), "the controller outlived a SIGKILLed parent"
        left = prefix_leftovers(run.prefix)
        assert any(i.startswith("bridge") for i in left) and any(i.startswith("netns") for i in left), left
        subprocess.run(["ip", "link", "add", decoy_link, "type", "veth", "peer", "name", f"{decoy}s1-eth1"],
                       check=True)  # fmt: skip
        subprocess.run(["ip", "netns", "add", decoy_ns], check=True)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "fabriclab", "emulate", "clean"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert f"({run.prefix}" in done.stdout or f", {run.prefix}" in done.stdout, done.stdout
        assert prefix_leftovers(run.prefix) == []
        assert run.record() is None
        assert took < STOP_BUDGET_S, f"clean took {took:.1f} s"
        decoys = sorted(leftovers([f"{decoy}s0", f"{decoy}s1", f"{decoy}h0"]))
        assert decoys == [f"link {decoy_link}", f"link {decoy}s1-eth1", f"netns {decoy_ns}"]
        argv = [sys.executable, "-m", "fabriclab", "emulate", "clean", "--prefix", run.prefix]
        again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert again.returncode == 0 and "cleaned 0 run(s)" in again.stdout, again.stdout
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        subprocess.run(["ip", "link", "del", decoy_link], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", decoy_ns], check=False, capture_output=True)
        if prefix_leftovers(run.prefix):
            subprocess.run([sys.executable, "-m", "fabriclab", "emulate", "clean", "--prefix", run.prefix],
                           env=env, check=False)  # fmt: skip


def _shards_exist(prefix: str) -> bool:
    return any(item.startswith(f"netns {prefix}x") for item in prefix_leftovers(prefix))


SHARDED_MOMENTS: dict[str, Callable[[Run], None]] = {
    "after 2 s": lambda run: time.sleep(2.0),
    # shard namespaces and daemons exist, cables being made or bridges applied
    "shards building": lambda run: run.wait_until("shards", lambda: _shards_exist(run.prefix), 120),
    "after ready": lambda run: run.wait_until("ready", lambda: run.said("running;")),
}


@pytest.mark.parametrize("moment", list(SHARDED_MOMENTS))
def test_sigterm_at_any_moment_of_a_sharded_k8_bring_up_leaves_nothing(
    daemon: OvsDaemon, tmp_path: Path, moment: str
) -> None:
    """The same on four shards: their ovs-vswitchd and ovsdb-server, namespaces, control hub and run
    directories go too."""
    run = Run(tmp_path, unique_prefix("g"), "--shards", "4")
    try:
        SHARDED_MOMENTS[moment](run)
        took = run.stop(signal.SIGTERM)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert run.proc.returncode in (0, 130), run.output()
    assert took < STOP_BUDGET_S, f"{moment}: took {took:.1f} s to stop: {run.output()}"
    run.assert_nothing_left()
    daemons = subprocess.run(["pgrep", "-f", f"/run/fabriclab/shards/{run.prefix}x"], capture_output=True,
                             check=False)  # fmt: skip
    assert daemons.stdout == b"", "shard daemons outlived the run"


def test_emulate_clean_after_a_sigkilled_sharded_run(daemon: OvsDaemon, tmp_path: Path) -> None:
    """SIGKILL: the shard daemons die with their parent (parent-death signal); `emulate clean` removes the
    namespaces, hub and run directories from the run's record."""
    run = Run(tmp_path, unique_prefix("g"), "--shards", "4")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        run.wait_until("tables installed", lambda: run.said("tables installed"))
        record = run.record()
        assert record is not None and f"{run.prefix}x3" in record.names
        run.proc.kill()
        run.proc.wait()
        deadline = time.monotonic() + 20
        pattern = f"/run/fabriclab/shards/{run.prefix}x"
        while subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False).stdout:
            assert time.monotonic() < deadline, "shard daemons outlived a SIGKILLed parent"
            time.sleep(0.1)
        assert _shards_exist(run.prefix)
        done = subprocess.run([sys.executable, "-m", "fabriclab", "emulate", "clean"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert prefix_leftovers(run.prefix) == [], done.stdout
        assert run.record() is None
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        if prefix_leftovers(run.prefix):
            subprocess.run([sys.executable, "-m", "fabriclab", "emulate", "clean", "--prefix", run.prefix],
                           check=False, env=env)  # fmt: skip
