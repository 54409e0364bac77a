"""The RoCE rank agents of a scenario run (`traffic.rankagent`), one process per host, on this machine.

`emulation.rocerun` writes what each host's agent sends and receives (its plan); `LocalAgents` starts
those agents inside their hosts, tells them when to start, and reads their reports.  Across machines each
machine's `ShardHost` holds a `LocalAgents` for its own hosts and `emulation.cluster.ClusterAgents` fans
the same calls out to them, so the runner treats both alike.

Protocol of an agent (stdin/stdout): it prints `ready` once its socket is open, reads the wall-clock start
time, and prints its report (one JSON line) when it is done or its deadline passed.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol


class Fabric(Protocol):
    """What the agents need of a fabric: a process started inside a host."""

    def popen(self, host: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]: ...


class AgentSet(Protocol):
    """Rank agents wherever they run: launched with their plans, started together, their reports read."""

    def launch(self, plans: dict[str, dict[str, Any]]) -> None: ...

    def go(self, start_at: float) -> None: ...

    def finished(self) -> bool: ...

    def reports(self, timeout_s: float) -> dict[str, dict[str, Any]]: ...

    def stop(self) -> None: ...

    def __len__(self) -> int: ...


class LocalAgents:
    """The agents of this machine's hosts; each one's plan and what it said on stderr in `work`."""

    def __init__(self, net: Fabric, work: Path) -> None:
        self.net, self.work = net, work
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def __len__(self) -> int:
        return len(self.procs)

    def launch(self, plans: dict[str, dict[str, Any]]) -> None:
        """One agent per host of `plans`; returns once every one is ready (RuntimeError with the words of
        one that is not)."""
        self.work.mkdir(parents=True, exist_ok=True)
        for host, plan in sorted(plans.items()):
            path = self.work / f"rank-{host}.json"
            path.write_text(json.dumps(plan))
            argv = [sys.executable, "-m", "traffic.rankagent", str(path)]
            with open(self.work / f"rank-{host}.log", "w") as log:  # kept with the run
                self.procs[host] = self.net.popen(
                    host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
                )
        for host, proc in self.procs.items():
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                said = (self.work / f"rank-{host}.log").read_text(errors="replace").strip().splitlines()
                raise RuntimeError(
                    f"the RoCE agent of {host} did not start: {said[-1] if said else 'no output'}"
                )

    def go(self, start_at: float) -> None:
        for proc in self.procs.values():
            assert proc.stdin is not None
            proc.stdin.write(f"{start_at!r}\n")
            proc.stdin.flush()

    def finished(self) -> bool:
        """Every agent has exited (each finished its sends and receives, or met its deadline)."""
        return bool(self.procs) and all(proc.poll() is not None for proc in self.procs.values())

    def reports(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        """Each agent's report by host (an agent that said nothing readable is absent)."""
        reports: dict[str, dict[str, Any]] = {}
        for host, proc in self.procs.items():
            out = proc.communicate(timeout=timeout_s)[0]
            with contextlib.suppress(ValueError, TypeError, IndexError):
                reports[host] = json.loads(out.strip().splitlines()[-1])
        return reports

    def stop(self) -> None:
        """Kill agents still running (a run that failed before its reports were read)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)


__all__ = ["AgentSet", "LocalAgents"]
