"""Shared pieces of the tests that drive real Open vSwitch: prerequisites (skip where emulation cannot run,
fail instead when CI demands it), one OVS daemon for the session, and the controller run as its own process
(as users run it) and reached over REST.

Import the fixture into a test module (`from tests.emulation_support import ovs_daemon_fixture`) and request
it as `ovs_daemon`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from controller.rest.client import wait_for
from emulation.controlproc import ControllerProcess, free_port
from emulation.ovs import OvsDaemon, ovs_available

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
    daemon.ensure_running()
    try:
        yield daemon
    finally:
        daemon.stop_if_started()


__all__ = [
    "REQUIRE_ENV",
    "ControllerProcess",
    "free_port",
    "ovs_daemon_fixture",
    "require_emulation",
    "wait_for",
]
