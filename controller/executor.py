"""The one executor of the decision core: an event in, the core's commands carried out, their outcomes fed
back depth first until nothing is left — synchronously, with the clock it is given.

`controller.service.FabricService` runs it on its worker thread against the real southbound and state
store; the tests' `CoreDriver` runs the same loop against fake switches with a clock they set.  What differs
between them is only what a command does (`Effects`), and whether several reads of one step are made at
once and handed back as one `SwitchesRead` (`batch_reads`: the service, where round trips to different
switches overlap) or one by one (the driver).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from controller.core.events import (
    Command,
    Event,
    Log,
    ProbeLinks,
    Push,
    ReadSwitch,
    Reply,
    Save,
    Saved,
    SwitchesRead,
    SwitchRead,
)
from controller.core.fabric import FabricCore, Step
from controller.core.state import FabricState

LOG = logging.getLogger(__name__)

#: At most this many switch reads in flight at once (`batch_reads`).
MAX_CONCURRENT_READS = 32


class Effects(Protocol):
    """What each command does where the executor runs."""

    def read(self, command: ReadSwitch) -> Event: ...  # SwitchRead, or SwitchReadFailed

    def push(self, command: Push) -> Event: ...  # PushDone (one phase)

    def probe(self, command: ProbeLinks) -> None: ...

    def save(self, command: Save) -> Saved: ...

    def log(self, command: Log) -> None: ...

    def reply(self, command: Reply) -> None: ...

    def drain(self) -> list[Event]:
        """Events the commands of a step caused on the side (the fakes' LLDP answers), after its outcomes."""
        ...


class Executor:
    def __init__(
        self,
        core: FabricCore,
        effects: Effects,
        clock: Callable[[], float],
        batch_reads: bool = False,
        on_step: Callable[[Step], None] | None = None,
        on_error: Callable[[Event, Exception], None] | None = None,
    ) -> None:
        """`on_step`: called with every step (publish it, keep it); `on_error`: a core that raised on an
        event (a bug) keeps its old state and goes on with the next, after `on_error` — without it the
        error propagates (tests want to see it)."""
        self.core, self.effects, self.clock = core, effects, clock
        self.batch_reads = batch_reads
        self.on_step, self.on_error = on_step, on_error

    def run(self, state: FabricState, event: Event) -> FabricState:
        """Handle `event` and everything it causes; the state after."""
        pending: deque[Event] = deque([event])
        while pending:
            current = pending.popleft()
            try:
                step = self.core.handle(state, self.clock(), current)
            except Exception as exc:
                if self.on_error is None:
                    raise
                LOG.exception("handling %s failed", type(current).__name__)
                self.on_error(current, exc)
                continue
            state = step.state
            if self.on_step is not None:
                self.on_step(step)
            outcomes = self.execute_all(step.commands) + self.effects.drain()
            pending.extendleft(reversed(outcomes))  # depth first: a command's outcome before anything else
        return state

    def execute_all(self, commands: Sequence[Command]) -> list[Event]:
        """Every command's outcome, in order.  With `batch_reads`, several `ReadSwitch` of one step are made
        concurrently and come back as one `SwitchesRead`, after the other commands' outcomes, with the
        failed reads' `SwitchReadFailed` after it."""
        reads = list(dict.fromkeys(c for c in commands if isinstance(c, ReadSwitch)))
        if not self.batch_reads or len(reads) < 2:
            return [o for o in map(self.execute, commands) if o is not None]
        others = [c for c in commands if not isinstance(c, ReadSwitch)]
        outcomes = [o for o in map(self.execute, others) if o is not None]
        with ThreadPoolExecutor(min(MAX_CONCURRENT_READS, len(reads)), "read-switch") as pool:
            results = list(pool.map(self.effects.read, reads))
        done = tuple(r for r in results if isinstance(r, SwitchRead))
        if done:
            outcomes.append(SwitchesRead(done))
        outcomes += [r for r in results if not isinstance(r, SwitchRead)]
        return outcomes

    def execute(self, command: Command) -> Event | None:
        effects = self.effects
        if isinstance(command, ReadSwitch):
            return effects.read(command)
        if isinstance(command, Push):
            return effects.push(command)
        if isinstance(command, ProbeLinks):
            effects.probe(command)
            return None
        if isinstance(command, Save):
            return effects.save(command)
        if isinstance(command, Log):
            effects.log(command)
            return None
        if isinstance(command, Reply):
            effects.reply(command)
            return None
        raise TypeError(f"unknown command {command!r}")


__all__ = ["MAX_CONCURRENT_READS", "Effects", "Executor"]
