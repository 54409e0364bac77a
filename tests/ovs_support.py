"""Shared pieces of the tests that drive real Open vSwitch: prerequisites, the OVS daemon, and a controller
run as its own process (as users run it), reached over REST."""

from __future__ import annotations

import os

import pytest

from emulation.controlproc import ControllerProcess, free_port, wait_for
from emulation.ovsfabric import ovs_unavailable

__all__ = ["ControllerProcess", "free_port", "require_emulation", "wait_for"]

REQUIRE_ENV = "FABRICLAB_REQUIRE_EMULATION"


def require_emulation() -> None:
    """Skip on a machine without root/OVS, unless CI demands emulation (then fail loudly)."""
    reason = ovs_unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but emulation is unavailable: {reason}")
    pytest.skip(reason)
