"""`fabriclab controller` refuses bad input before starting anything (exit 2, one line naming the problem),
and exits 0 on SIGTERM after a clean shutdown."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from emulation.controlproc import ControllerProcess
from tests.conftest import ROOT

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabriclab", "controller", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology", "missing.yaml"], "missing.yaml"),
        (["--topology", str(TOPOLOGY), "--engine", "nope"], "unknown routing engine 'nope'"),
        (["--topology", str(TOPOLOGY), "--openflow", "6653"], "--openflow: expected HOST:PORT"),
        (["--topology", str(TOPOLOGY), "--api", "localhost:99999"], "--api: expected HOST:PORT"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_an_address_in_use_is_reported(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run("--topology", str(TOPOLOGY), "--api", f"127.0.0.1:{port}")
    assert done.returncode == 2 and "--api: cannot listen" in done.stderr


def test_damaged_state_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "controller-state.json").write_text('{"format": 1, "engine": 7}')
    done = run("--topology", str(TOPOLOGY), "--state-dir", str(tmp_path))
    assert done.returncode == 2 and "engine: expected str" in done.stderr


def test_sigterm_and_sigint_stop_the_controller_cleanly(tmp_path: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        ctl = ControllerProcess(TOPOLOGY, tmp_path / "state", tmp_path / "log")
        ctl.start()
        assert ctl.get("health")["switches_declared"] == 20
        assert ctl.proc is not None
        ctl.proc.send_signal(sig)
        assert ctl.proc.wait(15) == 0
    assert "stopped" in (tmp_path / "log").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--emu-api", "8081"], "--emu-api: expected HOST:PORT"),
        (["--scale", "400G-200M"], "--scale: scale '400G-200M'"),
        (["--api", "localhost"], "--api: expected HOST:PORT"),
        (["--controller-api", "127.0.0.1:8080"], "--controller-api: only with --controller"),
        (["--engine", "foo"], "unknown routing engine 'foo'"),
        (["--controller", "tcp:h:1", "--controller-api", "x"], "--controller-api: expected HOST:PORT"),
        (["--ready-timeout", "0"], "--ready-timeout: must be a positive number of seconds, not 0"),
        (["--ready-timeout", "nan"], "--ready-timeout: must be a positive number of seconds, not nan"),
    ],
)
def test_emulate_up_refuses_bad_addresses_before_building(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "emulate", "up", str(TOPOLOGY), "--no-cli", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr
