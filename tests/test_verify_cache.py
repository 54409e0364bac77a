"""The per-destination-switch cache of the alternatives deadlock check gives what walking again gives.

`verify.alternative_dependencies` remembers each destination switch's dependency bitmap by a digest of what
it depends on.  After cuts and restores (alternatives change for some destination switches, the channel
numbering for all), a warm cache must give the codes a cold one gives, and the cache stays within its
byte limit.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from controller.sm import verify as verify_module
from controller.sm.engines import default_registry
from controller.sm.subnet import Subnet
from controller.sm.verify import _TargetCache, alternative_dependencies
from topologies.generators import fat_tree, opensm_fat_tree, rail
from topologies.model import Fabric


def _cold(tables: object, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(verify_module, "_TARGETS", _TargetCache(64 << 20))
        return alternative_dependencies(tables)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fabric", [fat_tree(8), opensm_fat_tree(6), rail(4, 4, groups=2)], ids=lambda f: f.name
)
@pytest.mark.parametrize("engine", ["ftree", "sssp", "updn"])
def test_a_warm_cache_gives_what_a_cold_one_gives_across_cuts(
    fabric: Fabric, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify_module, "_TARGETS", _TargetCache(64 << 20))
    router = default_registry().create(engine)
    cables = [
        i
        for i, cable in enumerate(fabric.links)
        if fabric.nodes[cable.a.node].is_switch and fabric.nodes[cable.b.node].is_switch
    ]
    rng = random.Random(7)
    for step in range(6):
        cut = sorted(rng.sample(cables, step % 3))  # 0, 1 or 2 cables cut: restores happen in between
        tables = router.route(Subnet.build(fabric.without(links=cut)))
        warm = alternative_dependencies(tables)
        assert np.array_equal(warm, _cold(tables, monkeypatch)), (engine, cut)
    # most destination switches keep their alternatives across a cut: their bitmaps were reused
    assert verify_module._TARGETS.hits > 0


def test_the_cache_drops_the_least_recently_used_past_its_limit() -> None:
    cache = _TargetCache(limit_bytes=3000)
    items = {bytes([i]): np.full(1000, i, dtype=np.uint8) for i in range(5)}
    for key, value in items.items():
        cache.put(key, value)
    assert cache.get(bytes([0])) is None and cache.get(bytes([1])) is None
    assert cache.get(bytes([2])) is not None
    cache.put(bytes([9]), np.zeros(1000, dtype=np.uint8))  # 3 was the least recently used
    assert cache.get(bytes([3])) is None and cache.get(bytes([2])) is not None
    assert cache._bytes <= 3000
    cache.put(bytes([8]), np.zeros(5000, dtype=np.uint8))  # larger than the limit: not kept
    assert cache.get(bytes([8])) is None
