"""What the controller persists in --state-dir: operator choices that must survive a restart.

Only decisions live here (routing engine, forwarding options, routing policy and its parameters, the table
generation counter so cookies keep increasing); everything else is recomputed from the topology and read
back from the switches.  Files written before routing policies existed load with the policy their
`multipath` flag meant (true: ecmp, false: static) and default parameters.

- A save is atomic and durable: a new file with a unique name in the same directory, fsync, rename over the
  old one, fsync of the directory.  Two writers never share a temporary file, a crash leaves the old state
  or the new one, and a failed save raises `StateError` and leaves the directory as it was, so the caller
  can refuse the change it was about to commit.
- One controller per directory: `lock()` takes an exclusive `flock` on `controller.lock` for as long as the
  store lives (the kernel drops it when the process dies, even on SIGKILL); a second controller is refused
  with the holder's pid.
- A damaged or hand-edited file (binary, not UTF-8, nested or oversized JSON, unknown or duplicate fields,
  a generation outside the cookie's 48 bits) is rejected whole with the field at fault, never half-applied.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.sm.intents import MAX_GENERATION
from topologies.errors import InputError, read_input_bytes

STATE_FILE = "controller-state.json"
LOCK_FILE = "controller.lock"
FORMAT = 1
#: The state is a few fields and the partitions; anything larger is not ours.
MAX_STATE_BYTES = 1024 * 1024  # partitions list their members


class StateError(ValueError):
    pass


@dataclass(frozen=True)
class SavedState:
    engine: str
    fast_failover: bool
    multipath: bool
    generation: int
    #: Routing policy and its parameters ("" = the policy `multipath` names: older files).
    policy: str = ""
    interval_ms: int = 100
    threshold: float = 0.7
    hysteresis: float = 0.1
    #: Per-DSCP policy exceptions as {"26": "static"}.
    classes: dict[str, str] | None = None
    #: Partitions set by file or REST, as `Partitions.as_dict()["partitions"]` (None: OpenSM's default).
    partitions: list[dict[str, Any]] | None = None


_FIELDS: dict[str, type] = {"engine": str, "fast_failover": bool, "multipath": bool, "generation": int}
#: Fields added later: optional when loading (older files), always written.
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "policy": (str,),
    "interval_ms": (int,),
    "threshold": (float, int),
    "hysteresis": (float, int),
    "classes": (dict,),
    "partitions": (list,),
}


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        self._lock_fd: int | None = None

    # --- one controller per directory ----------------------------------------------------------------

    def lock(self) -> None:
        """Create the directory if needed, lock it for this process and check that files can be written
        there; `StateError` (naming the directory and, if another controller holds it, that controller's
        pid) when it cannot be used."""
        if self._lock_fd is not None:
            return
        directory = self.directory
        if directory.exists() and not directory.is_dir():
            raise StateError(f"{directory}: state directory is not a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StateError(f"{directory}: cannot use as state directory: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise StateError(
                f"{directory}: state directory is in use by another controller ({who})"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StateError(f"{directory}: cannot lock state directory: {exc.strerror or exc}") from None
        with contextlib.suppress(OSError):  # the pid is for the message above; the lock is what counts
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        probe = directory / f".write-test.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:  # a directory we cannot write to fails now, before anything starts, not at the first save
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            probe.unlink()
        except OSError as exc:
            self.unlock()
            raise StateError(f"{directory}: cannot write to state directory: {exc.strerror or exc}") from None

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- reading -------------------------------------------------------------------------------------

    def load(self) -> SavedState | None:
        if not os.path.lexists(self.path):
            return None
        try:  # a regular file of at most MAX_STATE_BYTES: a FIFO or a device must not block the start
            raw = read_input_bytes(self.path, InputError, MAX_STATE_BYTES)
        except InputError as exc:
            raise StateError(f"{self.path}: not a usable state file: {exc.message}") from None
        try:
            data: Any = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except UnicodeDecodeError:
            raise StateError(f"{self.path}: not a state file: not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise StateError(
                f"{self.path}: not a state file: invalid JSON ({exc.msg}, line {exc.lineno})"
            ) from None
        except RecursionError:
            raise StateError(f"{self.path}: not a state file: JSON nested too deeply") from None
        except ValueError as exc:  # duplicate fields; integers past Python's 4,300-digit conversion limit
            raise StateError(f"{self.path}: not a state file: {exc}") from None
        return self._check(data)

    def _check(self, data: Any) -> SavedState:
        if not isinstance(data, dict):
            raise StateError(f"{self.path}: state must be a JSON object")
        if data.get("format") != FORMAT:
            raise StateError(f"{self.path}: format: expected {FORMAT}, got {_short(data.get('format'))}")
        unknown = set(data) - set(_FIELDS) - set(_OPTIONAL) - {"format"}
        if unknown:
            raise StateError(f"{self.path}: {_short(sorted(unknown)[0])}: unknown field")
        values: dict[str, Any] = {}
        for name, kind in _FIELDS.items():
            if name not in data:
                raise StateError(f"{self.path}: {name}: missing")
            value = data[name]
            if type(value) is not kind:
                raise StateError(f"{self.path}: {name}: expected {kind.__name__}, got {_short(value)}")
            values[name] = value
        check_generation(values["generation"], self.path, loading=True)
        for name, kinds in _OPTIONAL.items():
            if name in data:
                value = data[name]
                if type(value) not in kinds:
                    raise StateError(
                        f"{self.path}: {name}: expected {kinds[0].__name__}, got {_short(value)}"
                    )
                values[name] = value
        classes = values.get("classes")
        if classes is not None and not all(isinstance(v, str) for v in classes.values()):
            raise StateError(f"{self.path}: classes: expected {{DSCP: policy name}}")
        return SavedState(**values)

    # --- writing -------------------------------------------------------------------------------------

    def save(self, state: SavedState) -> None:
        """Persist `state` atomically and durably, or raise `StateError` having changed nothing on disk
        (no partial file, no temporary file left behind)."""
        check_generation(state.generation, self.path)
        data = {"format": FORMAT, **{k: v for k, v in state.__dict__.items() if v is not None}}
        text = json.dumps(data, indent=2) + "\n"
        tmp = self.directory / f".{STATE_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StateError(f"{self.path}: cannot save state: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise StateError(f"{self.path}: cannot save state: {exc.strerror or exc}") from None
        _fsync_directory(self.directory)  # the rename itself must survive a power cut


def check_generation(generation: int, where: Path | str = "state", *, loading: bool = False) -> None:
    """A generation must fit the cookie's 48 bits (`cookie_of` never wraps, so a restarted controller can
    never reuse a cookie that is on the switches); one loaded at start must leave room for the next."""
    top = MAX_GENERATION - 1 if loading else MAX_GENERATION
    if not 0 <= generation <= top:
        raise StateError(
            f"{where}: generation: must be 0..{top} (the cookie's 48 bits), got {_short(generation)}"
            + ("; start on a fresh state directory" if loading and generation > top else "")
        )


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return  # the file is in place; only its durability across a crash is not confirmed
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not fsync directories (EINVAL); the rename has happened
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) < 12 else None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{_short(key)}: field appears twice")
        out[key] = value
    return out


def _short(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["LOCK_FILE", "STATE_FILE", "SavedState", "StateError", "StateStore", "check_generation"]
