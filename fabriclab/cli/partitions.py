"""`fabriclab partitions check FILE --topology T`: a partitions file resolved against a fabric, as JSON.

The same reader backs `fabriclab controller --partitions FILE` and scenario files, so a file that passes
`check` is exactly what the controller will enforce; any error is one line with file, line and column, and
exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from controller.formats.partitions_file import load_partitions
from fabriclab.cli.common import load_fabric


def register(commands: Any) -> None:
    p = commands.add_parser("partitions", help="partitions (P_Keys): check a partitions file")
    sub = p.add_subparsers(dest="partitions_command", required=True, metavar="SUBCOMMAND")
    check = sub.add_parser(
        "check", help="resolve a partitions file (OpenSM partitions.conf or YAML) against a topology"
    )
    check.add_argument("file", type=Path, help="partitions.conf (OpenSM syntax) or .yaml")
    check.add_argument("--topology", required=True, type=Path, help="declared fabric (YAML or ibnetdiscover)")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    fabric = load_fabric(args.topology)
    partitions = load_partitions(args.file, fabric)
    print(json.dumps(partitions.as_dict(), indent=2))
    return 0


__all__ = ["register", "run_check"]
