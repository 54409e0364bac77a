"""What a routing engine is, and the registry that names them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables


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
