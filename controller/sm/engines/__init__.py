"""Routing engines (OpenSM's names and intents) and their registry."""

from __future__ import annotations

from controller.sm.engines.base import (
    EngineNotApplicable,
    EngineRegistry,
    RoutingEngine,
    UnknownEngine,
    select_engine,
)
from controller.sm.engines.ftree import FatTreeEngine
from controller.sm.engines.minhop import MinHopEngine
from controller.sm.engines.sssp import DfssspEngine, SsspEngine
from controller.sm.engines.updn import UpDownEngine


def default_registry() -> EngineRegistry:
    """The engines fabriclab ships, registered explicitly in the order they are listed to users."""
    registry = EngineRegistry()
    for engine in (MinHopEngine, UpDownEngine, FatTreeEngine, SsspEngine, DfssspEngine):
        registry.register(engine)
    return registry


__all__ = [
    "DfssspEngine",
    "EngineNotApplicable",
    "EngineRegistry",
    "FatTreeEngine",
    "MinHopEngine",
    "RoutingEngine",
    "SsspEngine",
    "UnknownEngine",
    "UpDownEngine",
    "default_registry",
    "select_engine",
]
