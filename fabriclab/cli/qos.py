"""`fabriclab qos check FILE --topology T`: a QoS policy validated in layers and printed resolved (JSON), or
one line naming file, line and field, exit 2.  `--qos FILE` of `controller` and `emulate up` uses the same
loader (`controller.formats.qosload.load_policy`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from controller.formats.qosload import load_policy
from controller.sm.qos import resolve
from fabriclab.cli.common import load_fabric


def register(commands: Any) -> None:
    qos = commands.add_parser("qos", help="QoS policies (service levels, VL arbitration, DSCP)")
    sub = qos.add_subparsers(dest="qos_command", required=True, metavar="QOS_COMMAND")
    check = sub.add_parser("check", help="validate a QoS policy file and print it resolved (JSON)")
    check.add_argument("file", type=Path, help="QoS policy (YAML, see docs/qos.md)")
    check.add_argument("--topology", type=Path, help="resolve port groups against this fabric")
    check.set_defaults(handler=qos_check)


def qos_check(args: argparse.Namespace) -> int:
    fabric = load_fabric(args.topology) if args.topology is not None else None
    policy = load_policy(args.file, fabric)
    print(json.dumps(resolve(policy, fabric), indent=1))
    return 0


__all__ = ["qos_check", "register"]
