"""Shared fixtures: paths of shipped data and a factory of many generated (and degraded) fabrics."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.emulation_support import fabric_prefix_fixture, k4_capacity_fixture
from topologies.faults import degrade
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.model import Fabric

# Registered here, once: a session-scoped fixture imported into several modules would be a separate fixture
# (and a separate ~40 s calibration) in each.
__all__ = ["fabric_prefix_fixture", "k4_capacity_fixture"]

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
REFERENCE = DATA / "opensm-ft3-k4"


def pristine_fabrics() -> list[Fabric]:
    """Full-bisection fabrics on which ftree must be shift-congestion-free, plus oversubscribed ones."""
    return [
        *(fat_tree(k) for k in (2, 4, 6, 8)),
        leaf_spine(4, 4, 4),
        leaf_spine(6, 3, 6, parallel=2),
        leaf_spine(8, 4, 16, parallel=2),  # 2:1 oversubscribed
        leaf_spine(5, 2, 3, parallel=3, uplink_bw_gbps=200),
        rail(4, 4),
        rail(8, 8, groups=2),
        rail(8, 4, groups=3, spines=4, parallel=2),
    ]


def full_bisection_fabrics() -> list[Fabric]:
    """Fabrics where every leaf has as many uplinks as hosts (so flows, not just bandwidth, balance)."""
    return [
        *(fat_tree(k) for k in (2, 4, 6, 8)),
        leaf_spine(4, 4, 4),
        leaf_spine(6, 3, 6, parallel=2),
        rail(4, 4),
        rail(8, 8, groups=2),
        rail(8, 4, groups=3, spines=4, parallel=2),
    ]


def degraded_fabrics() -> list[tuple[Fabric, str]]:
    """Seeded random failures of links and switches on the fabrics above."""
    cases: list[tuple[Fabric, str]] = []
    for base in (
        fat_tree(4),
        fat_tree(6),
        fat_tree(8),
        leaf_spine(6, 3, 6, parallel=2),
        rail(8, 8, groups=2),
    ):
        for seed in range(4):
            links = 1 + seed * 3
            switches = seed % 2
            result = degrade(base, fail_links=links, fail_switches=switches, seed=seed)
            cases.append((result.fabric, f"{base.name}-l{links}-s{switches}-seed{seed}"))
    return cases


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's own `XDG_CACHE_HOME` (inherited by every command a test starts): a calibration made by
    a test — a documented command run on a busy machine, a deliberately tiny one — must not become the
    user's (`fabriclab emulate calibrate` saves to ~/.cache/fabriclab, and later runs size from it)."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    assert (REFERENCE / "fabric.net").exists(), f"missing reference data in {REFERENCE}"
    return REFERENCE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `emulation` every test of a module that needs Open vSwitch (it calls `require_emulation` or
    requests the OVS daemon), so `pytest -m "not emulation"` runs the fast suite.  Marked at collection,
    where `-m` looks; `require_emulation` still decides at run time whether the test can run."""
    for item in items:
        module = getattr(item, "module", None)
        fixtures = getattr(item, "fixturenames", ())
        if "ovs_daemon" in fixtures or (module is not None and hasattr(module, "require_emulation")):
            item.add_marker(pytest.mark.emulation)
