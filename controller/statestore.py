"""What the controller persists in --state-dir: operator choices that must survive a restart.

Only decisions live here (routing engine, forwarding options, routing policy and its parameters, partitions,
the QoS policy, the table generation counter so cookies keep increasing); everything else is recomputed from
the topology and read back from the switches.  Files written before routing policies existed load with the
policy their `multipath` flag meant (true: ecmp, false: static) and default parameters.

- A save is atomic and durable: a new file with a unique name in the same directory, fsync, rename over the
  old one, fsync of the directory.  Two writers never share a temporary file, a crash leaves the old state
  or the new one, and a failed save raises `StateError` and leaves the directory as it was, so the caller
  can refuse the change it was about to commit.
- One controller per directory: `lock()` takes an exclusive `flock` on `controller.lock` for as long as the
  store lives (the kernel drops it when the process dies, even on SIGKILL); a second controller is refused
  with the holder's pid.
- A damaged or hand-edited file (binary, not UTF-8, nested or oversized JSON, unknown or duplicate fields,
  a generation outside the cookie's 48 bits, a partition listed twice) is rejected whole with the file and
  the field at fault, never half-applied.  Reading, writing and the field checks are `controller.statefile`,
  shared with the `qos.json` of older controllers (read once when this file has no QoS policy).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controller.sm.intents import MAX_GENERATION
from controller.sm.partitions import PartitionError
from controller.sm.partitions_conf import rule_from_dict
from controller.statefile import Fields, StateError, read_json, short, write_json

STATE_FILE = "controller-state.json"
LOCK_FILE = "controller.lock"
FORMAT = 1


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
    #: The QoS policy as file data (`controller.sm.qos.policy_data`; None: OpenSM's default) and where it
    #: came from ("rest", "file PATH").  Checked against the fabric where it is used, not here.
    qos: dict[str, Any] | None = None
    qos_source: str | None = None


_FIELDS: dict[str, type] = {"engine": str, "fast_failover": bool, "multipath": bool, "generation": int}
#: Fields added later: optional when loading (older files), always written.
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "policy": (str,),
    "interval_ms": (int,),
    "threshold": (float, int),
    "hysteresis": (float, int),
    "classes": (dict,),
    "partitions": (list,),
    "qos": (dict,),
    "qos_source": (str,),
}
#: Where controllers before the QoS policy joined this file kept it (read once, if this file has none).
LEGACY_QOS_FILE = "qos.json"


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        #: The file the loaded QoS policy came from (this one, or a legacy `qos.json`): errors name it.
        self.qos_path = self.path
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
        data = read_json(self.path)
        if data is None:
            return None
        state = self._check(data)
        if state.qos is None:
            state = self._legacy_qos(state)
        return state

    def _legacy_qos(self, state: SavedState) -> SavedState:
        """A state directory from before QoS was saved here: its `qos.json` (held to the same rules), once;
        the next save writes the policy into this file and `qos.json` is not read again."""
        path = self.directory / LEGACY_QOS_FILE
        data = read_json(path)
        if data is None:
            return state
        fields = Fields(path, data, {"generation", "source", "policy"})
        fields.integer("generation", 0, MAX_GENERATION, required=True)
        source = fields.text("source", 200, default="saved")
        policy = fields.get("policy", (dict,), required=True)
        self.qos_path = path
        return replace(state, qos=policy, qos_source=source)

    def _check(self, data: Any) -> SavedState:
        fields = Fields(self.path, data, set(_FIELDS) | set(_OPTIONAL) | {"format"})
        if data.get("format") != FORMAT:
            raise fields.error("format", f"expected {FORMAT}, got {short(data.get('format'))}")
        values: dict[str, Any] = {
            name: fields.get(name, (kind,), required=True) for name, kind in _FIELDS.items()
        }
        check_generation(values["generation"], self.path, loading=True)
        for name, kinds in _OPTIONAL.items():
            if name in data:
                values[name] = fields.get(name, kinds)
        fields.text("policy", 40)
        fields.text("qos_source", 200)
        fields.integer("interval_ms", 1, 3_600_000)
        classes = values.get("classes")
        if classes is not None and not all(isinstance(v, str) for v in classes.values()):
            raise fields.error("classes", "expected {DSCP: policy name}")
        if values.get("partitions") is not None:
            check_partitions(self.path, values["partitions"])
        return SavedState(**values)

    # --- writing -------------------------------------------------------------------------------------

    def save(self, state: SavedState) -> None:
        """Persist `state` atomically and durably, or raise `StateError` having changed nothing on disk
        (no partial file, no temporary file left behind)."""
        check_generation(state.generation, self.path)
        data = {"format": FORMAT, **{k: v for k, v in state.__dict__.items() if v is not None}}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"{self.path}: cannot save state: {exc.strerror or exc}") from None
        write_json(self.path, data)


def check_partitions(path: Path, entries: list[Any]) -> None:
    """Saved partitions as the REST body and the partitions file are checked (`rule_from_dict`), each
    error naming the file and the entry; and each partition once: 0x0001 and 0x8001 are the same
    partition (bit 15 is membership), which a file written by the controller never lists twice."""

    def fail(message: str, *sub: str | int) -> StateError:
        return StateError(f"{path}: partitions[{index}]" + "".join(f".{s}" for s in sub) + f": {message}")

    seen: dict[int, int] = {}
    for index, entry in enumerate(entries):
        try:
            rule = rule_from_dict(entry, 0, fail)
        except PartitionError as exc:  # pragma: no cover - `fail` makes StateErrors
            raise StateError(f"{path}: partitions[{index}]: {exc.message}") from None
        assert rule.pkey is not None
        if rule.pkey in seen:
            raise fail(
                f"P_Key {short(entry.get('pkey'))} is partition 0x{rule.pkey:04x} again (partitions["
                f"{seen[rule.pkey]}]): each partition is saved once",
                "pkey",
            )
        seen[rule.pkey] = index


def check_generation(generation: int, where: Path | str = "state", *, loading: bool = False) -> None:
    """A generation must fit the cookie's 48 bits (`cookie_of` never wraps, so a restarted controller can
    never reuse a cookie that is on the switches); one loaded at start must leave room for the next."""
    top = MAX_GENERATION - 1 if loading else MAX_GENERATION
    if not 0 <= generation <= top:
        raise StateError(
            f"{where}: generation: must be 0..{top} (the cookie's 48 bits), got {short(generation)}"
            + ("; start on a fresh state directory" if loading and generation > top else "")
        )


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) < 12 else None


__all__ = [
    "LEGACY_QOS_FILE",
    "LOCK_FILE",
    "STATE_FILE",
    "SavedState",
    "StateError",
    "StateStore",
    "check_generation",
    "check_partitions",
]
