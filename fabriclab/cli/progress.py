"""Progress of long commands: a live bar (rich) on a terminal, plain lines when the output is a log."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

Progress = Callable[[float, str], None]


@contextmanager
def console_progress(stream: TextIO | Any = None, steps: int = 10) -> Iterator[Progress]:
    """Yields `progress(fraction, what)`.  On a TTY: rich's bar with elapsed and remaining time, removed
    cleanly on any exit; otherwise one line per 1/steps of the way (CI logs stay short and readable)."""
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        from rich.console import Console  # noqa: PLC0415 - only for terminals
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: PLC0415

        bar = Progress(
            TextColumn("{task.description:<42}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=False,
        )
        task = bar.add_task("starting", total=1.0)
        with bar:

            def show(fraction: float, what: str) -> None:
                bar.update(task, completed=min(1.0, max(0.0, fraction)), description=what)

            yield show
        return
    last = [-1]

    def plain(fraction: float, what: str) -> None:
        step = int(fraction * steps)
        if step != last[0]:
            last[0] = step
            stream.write(f"{fraction * 100:5.1f}%  {what}\n")
            stream.flush()

    yield plain


__all__ = ["Progress", "console_progress"]
