"""`fabriclab` command line: the composition root that ties files, the routing core and (later) the
controller and emulator together.

Bad input of any kind ends in one line on stderr naming file, line and field, and exit code 2; a traceback
only with --debug.  A routing that fails verification exits 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence

from controller.sm.engines.base import UnknownEngine
from fabriclab.cli import emulate as emulate_cmd
from fabriclab.cli import partitions as partitions_cmd
from fabriclab.cli import policy as policy_cmd
from fabriclab.cli import qos as qos_cmd
from fabriclab.cli import route as route_cmd
from fabriclab.cli import scenario as scenario_cmd
from fabriclab.cli import serve as serve_cmd
from fabriclab.cli import sim as sim_cmd
from fabriclab.cli import topo as topo_cmd
from fabriclab.cli import trace as trace_cmd
from fabriclab.cli import traffic as traffic_cmd
from fabriclab.cli.common import CliError, OneLineParser
from topologies.errors import InputError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fabriclab",
        description="AI-cluster fabric controller and testbed: topologies, routing, verification.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    topo_cmd.register(commands)
    route_cmd.register(commands)
    serve_cmd.register(commands)
    emulate_cmd.register(commands)
    scenario_cmd.register(commands)
    traffic_cmd.register(commands)
    trace_cmd.register(commands)
    sim_cmd.register(commands)
    partitions_cmd.register(commands)
    qos_cmd.register(commands)
    engines = commands.add_parser("engines", help="list routing engines")
    engines.set_defaults(handler=route_cmd.list_engines)
    policies = commands.add_parser("policies", help="list routing policies")
    policies.set_defaults(handler=policy_cmd.list_policies)
    return parser


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None, early_stop: Callable[[], bool] | None = None) -> int:
    """Parse, then run the command.  `early_stop` says whether a stop signal arrived while the program was
    still starting (`fabriclab.launch`): then nothing runs and the exit code is 130.  From here on SIGTERM
    ends a command as Ctrl-C does (its `finally` blocks run: no temporary left); the emulator's commands
    install their own handling (`emulation.lifecycle`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if early_stop is not None:
        if early_stop():
            print("fabriclab: stopped before it started: nothing was done", file=sys.stderr)
            return 130
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        result: int = args.handler(args)
        return result
    except (InputError, CliError, UnknownEngine) as exc:
        if args.debug:
            raise
        print(f"fabriclab: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # e.g. `fabriclab ... | head`
        return 0
    except KeyboardInterrupt:
        print("fabriclab: stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
