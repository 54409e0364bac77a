"""The `fabriclab` program's first lines, before anything heavy is imported.

Importing the command line (numpy, pydantic, os-ken, Mininet...) takes a second or more on a loaded
machine; a SIGTERM that arrives meanwhile would kill the process by the default action, halfway through
nothing, with no message (seen on a busy CI machine: `emulate up` exited -15).  So a stop signal is
remembered from the first line on, and the command line says what it means: the command did not start,
nothing was done, exit 130.  From then on each command handles stop signals itself.
"""

from __future__ import annotations

import signal
import sys

_stopped: list[int] = []


def _remember(signum: int, _frame: object) -> None:
    _stopped.append(signum)


def stopped_early() -> bool:
    """A stop signal arrived before the command line took over."""
    return bool(_stopped)


def run() -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _remember)
    from fabriclab.cli import main  # noqa: PLC0415 - the heavy imports, after the handler is in place

    return main(early_stop=stopped_early)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
