"""What each running emulation built, on disk, so that `fabriclab emulate clean` can remove exactly that.

A run writes `/run/fabriclab/runs/PREFIX.json` (its node names, interface group, own PID and controller
PID) before it creates anything, and deletes it after its teardown.  A file whose run is gone (SIGKILL, a
crash, a power cut of the process) marks leftovers: `clean` removes those names — bridges, veths, bridge
taps, host namespaces, host shells — and the controller if it still runs, and nothing else.  It never
guesses by pattern beyond a prefix the user names, and never runs `mn -c`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_DIR = Path(os.environ.get("FABRICLAB_RUN_DIR", "/run/fabriclab/runs"))


@dataclass(frozen=True)
class RunRecord:
    prefix: str
    names: list[str]
    group: int
    pid: int
    controller_pid: int | None = None
    started: float = 0.0
    #: One machine's part of a run spread over several (`emulation.shardhost`): its own record beside the
    #: run's, named after it, so that two parts on one machine (tests) do not overwrite each other.
    part: str = ""
    #: What `pid`'s command line contains while the run lives (a Dask worker's does not say fabriclab).
    marker: str = "fabriclab"


def path_of(prefix: str, part: str = "") -> Path:
    return RUN_DIR / f"{prefix or 'noprefix'}{'@' + part if part else ''}.json"


def write(record: RunRecord) -> Path:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    path = path_of(record.prefix, record.part)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(path)
    return path


def read(path: Path) -> RunRecord | None:
    try:
        data = json.loads(path.read_text())
        return RunRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def discard(prefix: str, part: str = "") -> None:
    with contextlib.suppress(FileNotFoundError):
        path_of(prefix, part).unlink()


def records() -> list[tuple[Path, RunRecord]]:
    if not RUN_DIR.is_dir():
        return []
    found = [(p, read(p)) for p in sorted(RUN_DIR.glob("*.json"))]
    return [(p, r) for p, r in found if r is not None]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def alive(pid: int, marker: str = "fabriclab") -> bool:
    """Whether `pid` still runs and is one of ours (its command line mentions `marker`): a recycled PID of
    some other program does not count."""
    return any(marker in arg for arg in _cmdline(pid))


def stop_controller(pid: int | None, wait_s: float = 10.0) -> bool:
    """SIGTERM (then SIGKILL) a controller left by a dead run, if that PID is still a fabriclab
    controller; True if one was stopped."""
    if pid is None or not (alive(pid) and "controller" in _cmdline(pid)):
        return False
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return True


def prefix_pattern(prefix: str) -> re.Pattern[str]:
    """Node names a `--name-prefix` run uses: `{prefix}s<i>` and `{prefix}h<i>`, exactly, and a sharded
    run's shard namespaces `{prefix}x<i>`, control hub `{prefix}xc` and underlay `{prefix}xu`."""
    return re.compile(rf"{re.escape(prefix)}(?:[shx]\d+|xc|xu)")


__all__ = [
    "RUN_DIR",
    "RunRecord",
    "alive",
    "discard",
    "path_of",
    "prefix_pattern",
    "read",
    "records",
    "stop_controller",
    "write",
]
