"""The controller's QoS policy at run time: one published, frozen policy; replaced whole; saved in the
state directory (`qos.json`); every change an event.

REST reads `snapshot()` (a frozen `QosSnapshot`, never the store's insides) and asks `replace()` for a
change, which is validated in full by `controller.qosfile` before anything is touched: a bad policy leaves
the running one (and the file on disk) exactly as they were.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.qosfile import QosFileError, policy_from_data, to_data
from controller.sm.intents import MAX_GENERATION
from controller.sm.qos import QosPolicy, default_policy, diff, resolve
from controller.statefile import Fields, StateError, read_json, write_json
from topologies.model import Fabric

QOS_FILE = "qos.json"
#: Events kept for GET /qos/events (a long-running controller must not grow without bound).
MAX_EVENTS = 200


@dataclass(frozen=True)
class QosSnapshot:
    generation: int
    source: str
    policy: QosPolicy
    resolved: dict[str, Any]


class QosStore:
    def __init__(self, fabric: Fabric, state_dir: Path | None = None) -> None:
        self.fabric = fabric
        self.path = state_dir / QOS_FILE if state_dir is not None else None
        self._lock = threading.Lock()
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._next_event = 1
        policy, generation, source = default_policy(), 0, "default"
        saved = self._load()
        if saved is not None:
            policy, generation, source = saved
        self._snap = QosSnapshot(generation, source, policy, resolve(policy, fabric))

    def _load(self) -> tuple[QosPolicy, int, str] | None:
        """The saved policy, checked like `controller-state.json` (`controller.statefile`): `StateError`
        naming the file and the field for anything else."""
        if self.path is None:
            return None
        data = read_json(self.path)
        if data is None:
            return None
        fields = Fields(self.path, data, {"generation", "source", "policy"})
        generation = fields.integer("generation", 0, MAX_GENERATION, required=True)
        source = fields.text("source", 200, default="saved")
        raw = fields.get("policy", (dict,), required=True)
        try:
            policy = policy_from_data(raw, str(self.path), self.fabric)
        except QosFileError as exc:
            raise fields.error(f"policy.{exc.field}" if exc.field else "policy", exc.message) from None
        return policy, generation, source

    def snapshot(self) -> QosSnapshot:
        return self._snap

    def dry_run(self, data: Any, source: str = "body") -> dict[str, Any]:
        """What `replace` would change (validated the same way; `QosFileError` if it would be refused)."""
        policy = policy_from_data(data, source, self.fabric)
        return {"dry_run": True, "changes": diff(self._snap.resolved, resolve(policy, self.fabric))}

    def replace(self, policy: QosPolicy, source: str, now: float) -> dict[str, Any]:
        """Make `policy` (already validated) the running one: saved first, then published, then an event."""
        with self._lock:
            old = self._snap
            resolved = resolve(policy, self.fabric)
            snap = QosSnapshot(old.generation + 1, source, policy, resolved)
            self._save(snap)
            self._snap = snap
            event = {
                "id": self._next_event,
                "time": now,
                "kind": "qos_policy",
                "generation": snap.generation,
                "source": source,
                "changes": sorted(diff(old.resolved, resolved)),
            }
            self._next_event += 1
            self._events.append(event)
            return event

    def replace_data(self, data: Any, source: str, now: float) -> dict[str, Any]:
        return self.replace(policy_from_data(data, source, self.fabric), source, now)

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in list(self._events) if e["id"] > since]

    def _save(self, snap: QosSnapshot) -> None:
        """Atomic and durable, or `QosNotSaved` with nothing changed (no temporary file left)."""
        if self.path is None:
            return
        body = {"generation": snap.generation, "source": snap.source, "policy": to_data(snap.policy)}
        try:
            write_json(self.path, body, indent=1)  # key order is the policy's order
        except StateError as exc:
            raise QosNotSaved(f"state not saved, nothing changed: StateError: {exc}") from None


class QosNotSaved(RuntimeError):
    """The new policy could not be saved: it was not applied either."""


__all__ = ["MAX_EVENTS", "QOS_FILE", "QosNotSaved", "QosSnapshot", "QosStore"]
