"""The emulator's processes run at OVS's priority (`emulation.priority`): the session's autogroup as well
as each thread, and never the session of unrelated work."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.priority import EMULATOR_NICE, prioritise_ovs, prioritise_pid, prioritised

AUTOGROUP = Path("/proc/self/autogroup")
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="raising priority needs root")


def autogroup_nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading a session of its own, as a daemon or a Mininet host's agent does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_a_daemon_in_its_own_session_gets_the_priority_with_its_session(
    sleeper: subprocess.Popen[bytes],
) -> None:
    if not AUTOGROUP.exists():
        pytest.skip("kernel without autogroup scheduling")
    assert prioritise_pid(sleeper.pid)
    assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == EMULATOR_NICE
    assert autogroup_nice(sleeper.pid) == EMULATOR_NICE


def test_a_process_sharing_our_session_is_lifted_alone_never_its_session() -> None:
    if not AUTOGROUP.exists():
        pytest.skip("kernel without autogroup scheduling")
    ours = autogroup_nice(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        prioritise_pid(proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == EMULATOR_NICE
        assert autogroup_nice(os.getpid()) == ours  # the test's (and its neighbours') session untouched
    finally:
        proc.kill()
        proc.wait()


def test_a_gone_process_or_missing_pidfiles_say_not_done(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not prioritise_pid(proc.pid)
    assert not prioritise_ovs(tmp_path)  # no pidfiles there
    (tmp_path / "ovsdb-server.pid").write_text("not a pid\n")
    assert not prioritise_ovs(tmp_path, ["ovsdb-server"])


def test_an_agent_command_keeps_its_pid_and_runs_at_the_priority() -> None:
    proc = subprocess.Popen(prioritised([sys.executable, "-c", "import os; print(os.getpid(), os.nice(0))"]),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = proc.communicate(timeout=30)
    assert out.split() == [str(proc.pid), str(EMULATOR_NICE)]
