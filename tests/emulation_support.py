"""Prerequisites of the tests that drive real Open vSwitch (emulation/ovs.py): skip where emulation cannot
run, fail instead when CI demands it, and one OVS daemon for the whole session.

Import the fixture into a test module (`from tests.emulation_support import ovs_daemon_fixture`) and request
it as `ovs_daemon`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from emulation.ovs import OvsDaemon, ovs_available

REQUIRE_ENV = "FABRICLAB_REQUIRE_EMULATION"


def require_emulation(reason: str | None) -> None:
    """Return if `reason` is None (emulation can run); otherwise skip the test, or fail it when the
    environment sets FABRICLAB_REQUIRE_EMULATION=1 (CI on a machine that is supposed to emulate must not
    quietly skip everything)."""
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but emulation is unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", name="ovs_daemon")
def ovs_daemon_fixture() -> Iterator[OvsDaemon]:
    """Open vSwitch running for the session; stopped at the end only if this fixture started it."""
    require_emulation(ovs_available())
    daemon = OvsDaemon()
    daemon.ensure_running()
    try:
        yield daemon
    finally:
        daemon.stop_if_started()


__all__ = ["REQUIRE_ENV", "ovs_daemon_fixture", "require_emulation"]
