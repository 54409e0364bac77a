"""Run `fabriclab controller` as its own process (as users run it) and talk to it over REST.

Used by integration tests, benchmarks and (later) the emulator when it starts its own controller.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

from controller.rest.client import ControllerClient, WaitTimeout, wait_for
from emulation.priority import raise_priority


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


PR_SET_PDEATHSIG = 1


def _child_setup(parent: int) -> None:
    """In the child, before exec: its own process group, so that a terminal's Ctrl-C (sent to the whole
    foreground group) reaches only the parent, which then stops the controller in order (it is still
    needed while the fabric is torn down); and SIGTERM from the kernel when the parent dies — even by
    SIGKILL — so a controller never outlives the run that started it.  It runs at the emulator's priority
    (`emulation.priority`)."""
    os.setsid()  # its own session (so its own process group), which `raise_priority` can lift alone
    raise_priority()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl: nobody would send the signal
        os._exit(1)


def _tail(path: Path, n_bytes: int = 4096) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - n_bytes))
            return handle.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


class ControllerProcess(ControllerClient):
    def __init__(
        self,
        topology: Path,
        state_dir: Path,
        log: Path,
        *extra: str,
        host: str = "127.0.0.1",
        of_port: int | None = None,
        api_port: int | None = None,
        of_host: str | None = None,
    ) -> None:
        """Free ports on `host` unless given (a user's --openflow/--api).  `of_host`: the OpenFlow
        listener's address, if not `host` (a sharded fabric's switches dial it from their namespaces)."""
        super().__init__(host, api_port or free_port())
        self.of_host = of_host or host
        self.of_port = of_port or free_port()
        self.topology, self.state_dir, self.log, self.extra = topology, state_dir, log, extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def openflow(self) -> str:
        return f"tcp:{self.of_host}:{self.of_port}"

    def start(self, env: dict[str, str] | None = None) -> None:
        argv = [
            sys.executable, "-m", "fabriclab", "controller",
            "--topology", str(self.topology), "--state-dir", str(self.state_dir),
            "--openflow", f"{self.of_host}:{self.of_port}", "--api", f"{self.host}:{self.api_port}",
            *self.extra,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                preexec_fn=partial(_child_setup, os.getpid()),  # noqa: PLW1509
            )
        try:
            wait_for(self._health_unless_exited, 30, "controller REST")
        except BaseException:  # not ready, or interrupted while waiting: no controller left behind
            if self.proc is not None:
                self.stop()
            raise

    def _health_unless_exited(self) -> Any:
        """A controller that refused to start (bad input, a state directory in use) is reported at once with
        its own last words, not after the whole wait."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            lines = _tail(self.log).splitlines()
            self.proc = None
            raise WaitTimeout(
                f"the controller exited with code {code}: {lines[-1] if lines else '(no output)'}"
            )
        return self.get("health")

    def stop(self) -> int:
        """SIGTERM (as systemd or docker would) and the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


__all__ = ["ControllerProcess", "free_port"]
