"""What the controller persists in --state-dir: operator choices that must survive a restart.

Only decisions live here (routing engine, forwarding options, routing policy and its parameters, the table
generation counter so cookies keep increasing); everything else is recomputed from the topology and read
back from the switches.  Written atomically (temp file + rename); a damaged or hand-edited file is rejected
with the field at fault rather than half-applied.  Files written before routing policies existed load
with the policy their `multipath` flag meant (true: ecmp, false: static) and default parameters.
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
    #: Routing policy and its parameters ("" = the policy `multipath` names: older files).
    policy: str = ""
    interval_ms: int = 100
    threshold: float = 0.7
    hysteresis: float = 0.1
    #: Per-DSCP policy exceptions as {"26": "static"}.
    classes: dict[str, str] | None = None


_FIELDS: dict[str, type] = {"engine": str, "fast_failover": bool, "multipath": bool, "generation": int}
#: Fields added later: optional when loading (older files), always written.
_OPTIONAL: dict[str, tuple[type, ...]] = {
    "policy": (str,),
    "interval_ms": (int,),
    "threshold": (float, int),
    "hysteresis": (float, int),
    "classes": (dict,),
}


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
        unknown = set(data) - set(_FIELDS) - set(_OPTIONAL) - {"format"}
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
        for name, kinds in _OPTIONAL.items():
            if name in data:
                value = data[name]
                if type(value) not in kinds:
                    raise StateError(f"{self.path}: {name}: expected {kinds[0].__name__}, got {value!r}")
                values[name] = value
        classes = values.get("classes")
        if classes is not None and not all(isinstance(v, str) for v in classes.values()):
            raise StateError(f"{self.path}: classes: expected {{DSCP: policy name}}")
        return SavedState(**values)

    def save(self, state: SavedState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, **{k: v for k, v in state.__dict__.items() if v is not None}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)


__all__ = ["STATE_FILE", "SavedState", "StateError", "StateStore"]
