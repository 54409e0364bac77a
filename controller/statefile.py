"""The files the controller reads in --state-dir (`controller-state.json`, an older controller's `qos.json`):
one reader, one writer, one set of field checks, so every file it reads at start is held to the same rules.

Reading: a regular file only (a FIFO would hang the start, `/dev/zero` would be read until memory runs
out), at most `MAX_STATE_BYTES`, UTF-8 JSON without duplicate fields, NaN or Infinity, nested at most
`MAX_DEPTH` deep (100,000 `[` is a clear error, not a RecursionError).  Checking: exact types (a boolean is
not an integer, 1.9 and "12" are not generations), bounded integers, no unknown fields.  Every problem is
one `StateError` naming the file and the field (`qos.json: generation: ...`), which the command line turns
into exit 2 before anything starts.

Writing: a new file with a unique name in the same directory, fsync, rename over the old one, fsync of the
directory; a failure raises `StateError` and leaves the directory as it was (no temporary file left).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from topologies.errors import InputError, clip, read_input_bytes

#: A state file is a few fields and the partitions (which list their members); anything larger is not ours.
MAX_STATE_BYTES = 1024 * 1024
#: Deeper nesting than any state file has (a QoS policy is 4 levels deep).
MAX_DEPTH = 32


class StateError(ValueError):
    """A state file that cannot be used, or a save that failed (nothing changed)."""


def read_json(path: Path, max_bytes: int = MAX_STATE_BYTES) -> Any | None:
    """The JSON document in `path`, None when there is no such file; `StateError` for anything else."""
    if not os.path.lexists(path):
        return None
    try:
        raw = read_input_bytes(path, InputError, max_bytes)
    except InputError as exc:
        raise StateError(f"{path}: not a usable state file: {exc.message}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StateError(f"{path}: not a state file: not UTF-8 text") from None
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise StateError(
            f"{path}: not a state file: JSON nested too deeply ({depth:,} levels, at most {MAX_DEPTH})"
        )
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise StateError(f"{path}: not a state file: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:  # pragma: no cover - _depth refuses this first
        raise StateError(f"{path}: not a state file: JSON nested too deeply") from None
    except ValueError as exc:  # duplicate fields, NaN/Infinity, integers past Python's 4,300 digits
        raise StateError(f"{path}: not a state file: {exc}") from None


def write_json(path: Path, data: Mapping[str, Any], indent: int = 2) -> None:
    """Persist `data` atomically and durably, or raise `StateError` having changed nothing on disk."""
    text = json.dumps(data, indent=indent, allow_nan=False) + "\n"
    directory = path.parent
    tmp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StateError(f"{path}: cannot save state: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StateError(f"{path}: cannot save state: {exc.strerror or exc}") from None
    except BaseException:  # interrupted: no temporary file left either
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_directory(directory)  # the rename itself must survive a power cut


class Fields:
    """Exact-type field checks of one JSON object of one file, each failure a `StateError` naming both."""

    def __init__(self, path: Path | str, data: Any, allowed: set[str], prefix: str = "") -> None:
        self.path = path
        self.prefix = prefix
        if not isinstance(data, dict):
            raise StateError(f"{path}: {prefix or 'the file'}: expected a JSON object, got {short(data)}")
        self.data = data
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise StateError(f"{path}: {prefix}{short(unknown[0])}: unknown field")

    def error(self, name: str, message: str) -> StateError:
        return StateError(f"{self.path}: {self.prefix}{name}: {message}")

    def get(self, name: str, kinds: tuple[type, ...], default: Any = ..., required: bool = False) -> Any:
        if name not in self.data:
            if required:
                raise self.error(name, "missing")
            return default
        value = self.data[name]
        if type(value) not in kinds:  # exact: True is not an int, 1.9 not an int, "12" not an int
            raise self.error(name, f"expected {' or '.join(k.__name__ for k in kinds)}, got {short(value)}")
        return value

    def integer(self, name: str, low: int, high: int, default: Any = ..., required: bool = False) -> Any:
        value = self.get(name, (int,), default, required)
        if isinstance(value, int) and not low <= value <= high:
            raise self.error(name, f"must be {low}..{high}, got {short(value)}")
        return value

    def text(self, name: str, max_chars: int = 200, default: Any = ..., required: bool = False) -> Any:
        value = self.get(name, (str,), default, required)
        if isinstance(value, str) and len(value) > max_chars:
            raise self.error(name, f"at most {max_chars} characters, got {len(value):,}")
        return value


def short(value: Any) -> str:
    """A value as an error may repeat it."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return clip(repr(value), 40)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """How deeply the JSON text nests (brackets outside strings), without parsing it."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{short(key)}: field appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


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


__all__ = ["MAX_DEPTH", "MAX_STATE_BYTES", "Fields", "StateError", "read_json", "short", "write_json"]
