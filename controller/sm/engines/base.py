"""What a routing engine is, and the registry that names them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from topologies.errors import InputError


class RoutingEngine(ABC):
    """Computes forwarding tables for a whole subnet.

    Engines are pure: same subnet in, byte-identical tables out.  They see only the cabling and GUIDs (via
    `Subnet`), never names or generator metadata.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    #: Where the engine promises one-VL deadlock freedom: "any topology", "trees" or "no promise".
    deadlock_free: ClassVar[str]

    @abstractmethod
    def route(self, subnet: Subnet) -> RoutingTables: ...

    def route_some(self, subnet: Subnet, lids: npt.NDArray[np.integer]) -> RoutingTables:
        """Tables whose entries toward the destination LIDs `lids` are `route`'s (the others unspecified),
        with all of `route`'s alternatives: what an incremental reroute needs when only a few destinations
        move.  Engines that cannot route part of the destinations route them all."""
        return self.route(subnet)

    def with_lanes(self, vls: int) -> RoutingEngine:
        """This engine allowed `vls` virtual lanes for deadlock freedom (one-lane engines: itself)."""
        return self

    def problem(self, subnet: Subnet) -> str | None:
        """Why this engine should not route `subnet` (None: it can).  `route` still returns valid tables
        where it can (ftree on a ring falls back to a single root), but callers that honour the engine's
        contract check first: see `select_engine`."""
        return None


class EngineNotApplicable(InputError):
    """The engine cannot route this fabric (ftree on a non-tree): bad input naming the `engine` field, one
    line with the reason and what to use instead — what the CLI prints before exiting 2, and what a caller
    with a fallback engine logs before using it (as OpenSM does when its configured engine fails)."""

    def __init__(self, engine: str, reason: str, suggestion: str | None = None) -> None:
        hint = f"; {suggestion}" if suggestion else ""
        super().__init__(f"{engine} cannot route this fabric: {reason}{hint}", field="engine")
        self.engine = engine
        self.reason = reason
        self.suggestion = suggestion

    def located(self, file: str | None = None, line: int | None = None) -> EngineNotApplicable:
        return self


class UnknownEngine(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class EngineRegistry:
    """name -> engine class.  Filled explicitly (see `default_registry`), never by import side effects."""

    def __init__(self) -> None:
        self._engines: dict[str, type[RoutingEngine]] = {}

    def register(self, engine: type[RoutingEngine]) -> type[RoutingEngine]:
        if engine.name in self._engines and self._engines[engine.name] is not engine:
            raise ValueError(f"routing engine {engine.name!r} is already registered")
        self._engines[engine.name] = engine
        return engine

    def create(self, name: str) -> RoutingEngine:
        try:
            return self._engines[name]()
        except KeyError:
            raise UnknownEngine(
                f"unknown routing engine {name!r} (available: {', '.join(self.names())})"
            ) from None

    def names(self) -> list[str]:
        return list(self._engines)

    def __iter__(self) -> Iterator[type[RoutingEngine]]:
        return iter(self._engines.values())

    def __contains__(self, name: object) -> bool:
        return name in self._engines


def select_engine(
    registry: EngineRegistry, name: str, subnet: Subnet, fallback: str | None = None
) -> tuple[RoutingEngine, str | None]:
    """The engine to route `subnet` with, and the fallback note if it is not `name`.

    `name` when it can route the fabric; otherwise `fallback` (logged by the caller with the note), or
    `EngineNotApplicable` when there is none.  Unknown names raise `UnknownEngine` before anything runs.
    """
    engine = registry.create(name)
    backup = registry.create(fallback) if fallback is not None else None
    problem = engine.problem(subnet)
    if problem is None:
        return engine, None
    if backup is None:
        raise EngineNotApplicable(name, problem, _suggestion(registry, name))
    return backup, f"{name} cannot route this fabric ({problem}); falling back to {backup.name}"


def _suggestion(registry: EngineRegistry, name: str) -> str:
    general = [n for n in ("sssp", "dfsssp") if n in registry and n != name]
    if not general:
        return "choose another engine"
    return f"use --engine {' or '.join(general)} (any topology), or --fallback {general[0]}"
