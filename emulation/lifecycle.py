"""Stopping an emulation cleanly on SIGINT/SIGTERM, whatever it is doing.

A signal raises `Stopped`, which unwinds through every `finally` so that what was built is torn down —
except inside `deferred()`: Mininet half-way through building its network cannot be torn down cleanly, so
there the signal is remembered and raised at the block's end.  After the first signal both are ignored, so
a second Ctrl-C cannot interrupt the teardown the first one started.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Stopped(Exception):
    """SIGINT/SIGTERM arrived: unwind through every `finally`, so what was built is torn down."""


_state = {"defer": False, "pending": False, "stopped": False}


def _ignore_further_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def stop_on_signals() -> None:
    """From now on SIGINT/SIGTERM raise `Stopped` in the main thread (see `deferred`)."""

    def stop(*_: object) -> None:
        if _state["defer"]:
            _state["pending"] = True
            return
        _ignore_further_signals()
        _state["stopped"] = True
        raise Stopped

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block that a signal must not interrupt; a signal that arrived meanwhile is raised at its end."""
    _state["defer"] = True
    try:
        yield
    finally:
        _state["defer"] = False
    if _state["pending"]:
        _ignore_further_signals()
        raise Stopped


def raise_if_stopped() -> None:
    """Raise `Stopped` if a signal came: the one its handler raised can be swallowed when it lands in code
    that ignores exceptions (seen inside `logging`'s lock release: "Exception ignored in ..."), and the
    run must not carry on as if nothing had been asked.  Called between the steps of a bring-up."""
    if _state["stopped"]:
        raise Stopped


__all__ = ["Stopped", "deferred", "raise_if_stopped", "stop_on_signals"]
