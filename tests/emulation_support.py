"""Shared pieces of the tests that drive real Open vSwitch: prerequisites (skip where emulation cannot run,
fail instead when CI demands it), one OVS daemon for the session, and the controller run as its own process
(as users run it) and reached over REST.

Import the fixture into a test module (`from tests.emulation_support import ovs_daemon_fixture`) and request
it as `ovs_daemon`.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.rest.client import wait_for
from emulation import calibrate
from emulation.controlproc import ControllerProcess, free_port
from emulation.mnfabric import Scale, leftovers, mininet_available, remove
from emulation.ovs import OvsDaemon, ovs_available
from topologies.loader import load_topology

K4 = Path(__file__).resolve().parents[1] / "topologies" / "fat-tree-k4.yaml"
#: Tests offer at most this share of the calibrated clean capacity.
LOAD_SHARE = 0.5
T = TypeVar("T")

REQUIRE_ENV = "FABRICLAB_REQUIRE_EMULATION"


def require_emulation(reason: str | None = None) -> None:
    """Return if emulation can run here (`reason`, default: `ovs_available()`, is None); otherwise skip the
    test, or fail it when FABRICLAB_REQUIRE_EMULATION=1 (CI on a machine that is supposed to emulate must not
    quietly skip everything)."""
    if reason is None:
        reason = ovs_available()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but emulation is unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", name="ovs_daemon")
def ovs_daemon_fixture() -> Iterator[OvsDaemon]:
    """Open vSwitch running for the session; stopped at the end only if this fixture started it."""
    require_emulation()
    daemon = OvsDaemon()
    try:
        daemon.ensure_running()
        yield daemon
    finally:
        daemon.stop_if_started()


_serial = itertools.count()
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int, width: int) -> str:
    return "".join(_ALPHABET[n // 36**i % 36] for i in reversed(range(width)))


def unique_prefix(kind: str = "t") -> str:
    """A node-name prefix for one Mininet fabric that no other test of this run, and (almost surely) no
    other test run on this machine, uses: `kind`, this process's id and a serial, 6 characters at most —
    so `{prefix}s79-eth8` still fits a Linux interface name."""
    return f"{kind}{_base36(os.getpid(), 3)}{_base36(next(_serial), 2)}"


def prefix_names(prefix: str, count: int = 256) -> list[str]:
    """Every node name a `MininetFabric(..., name_prefix=prefix)` of up to `count` switches and hosts has
    (and a sharded one's shard namespaces, control hub and underlay)."""
    shards = [f"{prefix}x{i}" for i in range(64)] + [f"{prefix}xc", f"{prefix}xu"]
    return [f"{prefix}{kind}{i}" for kind in "sh" for i in range(count)] + shards


def prefix_leftovers(prefix: str) -> list[str]:
    """Bridges, interfaces and host shells of the fabric named with `prefix`: only its own, never another
    test's or another engineer's."""
    return leftovers(prefix_names(prefix))


@pytest.fixture(name="fabric_prefix")
def fabric_prefix_fixture() -> Iterator[str]:
    """A fresh name prefix for the test's fabric.  Afterwards — passed, failed or interrupted — whatever is
    left under that prefix is removed, and if anything was left the test fails, naming it: a test cleans up
    after itself, and no test inherits another's leftovers."""
    prefix = unique_prefix()
    left: list[str] = []
    try:
        yield prefix
    finally:
        left = prefix_leftovers(prefix)
        if left:
            remove(prefix_names(prefix))
    assert left == [], f"the test left {left[:5]} behind (removed now)"


@pytest.fixture(scope="session", name="k4_capacity")
def k4_capacity_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The k=4 fat-tree's clean capacity on this machine, now: measured once per test session
    (`emulation.calibrate`, ~40 s) and shared by every test that sizes traffic from it."""
    require_emulation(mininet_available())
    daemon = OvsDaemon()
    try:
        daemon.ensure_running()
        result = calibrate.calibrate(
            K4, load_topology(K4), tmp_path_factory.mktemp("calibration"), Scale.parse("400G=200M"),
            step_s=1.5, name_prefix=unique_prefix("c"),
        )  # fmt: skip
    finally:
        daemon.stop_if_started()
    if result["per_host_pps"] <= 0:
        # No rate was clean: this machine is too busy to emulate faithfully right now.  The tests still run,
        # at the lowest rate tried; each run's own headroom check then reports the emulator overloaded, and
        # the tests check what holds at any load (and that the run said so) instead of delivery.
        lowest = min(float(s["rate_pps_per_host"]) for s in result["steps"])
        result = {
            **result,
            "per_host_pps": lowest,
            "total_pps": lowest * result["senders"],
            "no_clean_rate": True,
        }
    return result


def scale_rates(text: str, factor: float) -> str:
    """A scenario's text with every `rate_pps: N` multiplied by `factor`."""
    return re.sub(r"rate_pps: ([\d.]+)", lambda m: f"rate_pps: {float(m[1]) * factor:.1f}", text)


def overloaded_runs(summaries: Iterable[dict[str, Any]]) -> str | None:
    """Why the emulator was overloaded in any repetition of these scenario summaries (None: it was not)."""
    whys = [
        r["headroom"]["why"]
        for summary in summaries
        for r in summary["repetitions"]
        if r["headroom"]["emulator_overloaded"]
    ]
    return "; ".join(whys) or None


def until_clean(
    run: Callable[[float], T], overloaded: Callable[[T], str | None], attempts: int = 2
) -> tuple[T, str | None]:
    """`run(factor)` with factor 1, then halved while the run itself reports that the emulator was
    overloaded (`overloaded` returns why, else None): a measurement the emulator spoiled is repeated at a
    lower load.  Returns the last result and, if even that was overloaded, why — then the caller can check
    only what holds whatever the load (and that the run said so), not delivery."""
    factor = 1.0
    for attempt in range(attempts):
        result = run(factor)
        why = overloaded(result)
        if why is None or attempt == attempts - 1:
            return result, why
        factor /= 2
    raise AssertionError("unreachable")


__all__ = [
    "K4",
    "LOAD_SHARE",
    "REQUIRE_ENV",
    "ControllerProcess",
    "fabric_prefix_fixture",
    "free_port",
    "k4_capacity_fixture",
    "overloaded_runs",
    "ovs_daemon_fixture",
    "prefix_leftovers",
    "prefix_names",
    "require_emulation",
    "scale_rates",
    "unique_prefix",
    "until_clean",
    "wait_for",
]
