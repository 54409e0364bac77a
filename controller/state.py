"""What the controller persists in --state-dir: operator choices that must survive a restart.

Only decisions live here (routing engine, forwarding options, the table generation counter so cookies keep
increasing); everything else is recomputed from the topology and read back from the switches.  Written
atomically (temp file + rename); a damaged or hand-edited file is rejected with the field at fault rather
than half-applied.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "controller-state.json"
FORMAT = 1


class StateError(ValueError):
    pass


@dataclass(frozen=True)
class SavedState:
    engine: str
    fast_failover: bool
    multipath: bool
    generation: int


_FIELDS: dict[str, type] = {"engine": str, "fast_failover": bool, "multipath": bool, "generation": int}


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE

    def load(self) -> SavedState | None:
        if not self.path.exists():
            return None
        try:
            data: Any = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise StateError(f"{self.path}: cannot read state: {exc}") from exc
        if not isinstance(data, dict):
            raise StateError(f"{self.path}: state must be a JSON object")
        if data.get("format") != FORMAT:
            raise StateError(f"{self.path}: format: expected {FORMAT}, got {data.get('format')!r}")
        unknown = set(data) - set(_FIELDS) - {"format"}
        if unknown:
            raise StateError(f"{self.path}: {sorted(unknown)[0]}: unknown field")
        values: dict[str, Any] = {}
        for name, kind in _FIELDS.items():
            if name not in data:
                raise StateError(f"{self.path}: {name}: missing")
            value = data[name]
            if type(value) is not kind:
                raise StateError(f"{self.path}: {name}: expected {kind.__name__}, got {value!r}")
            values[name] = value
        if values["generation"] < 0:
            raise StateError(f"{self.path}: generation: must be >= 0")
        return SavedState(**values)

    def save(self, state: SavedState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, **state.__dict__}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)


__all__ = ["STATE_FILE", "SavedState", "StateError", "StateStore"]
