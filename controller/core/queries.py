"""Read-only questions about the core's state, answered without changing it (REST's dry runs, event
figures)."""

from __future__ import annotations

from typing import Any

import numpy as np

from controller.core.state import Config, FabricState
from controller.sm.intents import SwitchProgram, rollout
from controller.sm.manager import Computation, SubnetContext


def changed_destinations(previous: Computation | None, current: Computation) -> int | None:
    """How many destination LIDs have a different port on at least one switch (None: not comparable)."""
    if current.changed_lids is not None:  # incremental recompute: only destinations that used the failure
        return len(current.changed_lids)
    if previous is None:
        return None
    old, new = previous.tables, current.tables
    if old.subnet.switch_names != new.subnet.switch_names or old.lft.shape != new.lft.shape:
        return None
    return int(np.count_nonzero((old.lft != new.lft).any(axis=0)))


def dry_run(context: SubnetContext, state: FabricState, engine: str | None, options: Any) -> dict[str, Any]:
    """What a routing change would do, computed from a published state without changing anything."""
    config = Config(engine or state.config.engine, options or state.config.options,
                    partitions=state.config.partitions)  # fmt: skip
    computation = context.compute(config.engine, config.options, state.ports_down, state.generation + 1,
                                  state.current, partitions=state.config.partitions)  # fmt: skip
    installed: dict[str, SwitchProgram | None] = {
        n: p for n, p in state.installed.items() if n in state.connected
    }
    deltas = rollout(installed, computation.programs)
    return {
        "dry_run": True,
        "engine": computation.engine,
        "verification_ok": computation.verification.ok,
        "switches_changed": len(deltas),
        "flow_mods": sum(d.n_messages for d in deltas.values()),
    }


__all__ = ["changed_destinations", "dry_run"]
