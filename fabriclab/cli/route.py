"""`fabriclab route`: compute forwarding tables, verify them, report quality, dump in OpenSM formats."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from controller.sm.engines import default_registry
from controller.sm.opensm import format_lfts, format_subnet_lst
from controller.sm.quality import quality
from controller.sm.report import build_report, render_report
from controller.sm.subnet import Subnet
from controller.sm.verify import verify
from fabriclab.cli.common import CliError, load_fabric, write_text
from topologies.faults import degrade

EXIT_VERIFY_FAILED = 1


def register(commands: Any) -> None:
    registry = default_registry()
    route = commands.add_parser(
        "route",
        help="compute forwarding tables with a routing engine; verify, report, dump",
        description="Compute linear forwarding tables, verify them (reachability, loops, deadlock) and "
        "optionally report their quality and write OpenSM-format dumps.",
    )
    route.add_argument("file", help="topology file (YAML) or ibnetdiscover/ibsim dump")
    route.add_argument("--format", choices=("auto", "yaml", "ibnet"), default="auto")
    route.add_argument(
        "--engine", default="ftree", help=f"routing engine: {', '.join(registry.names())} (default ftree)"
    )
    route.add_argument(
        "--report",
        action="store_true",
        help="add quality figures: all-to-all link load and worst shift permutation",
    )
    route.add_argument("--json", action="store_true", help="print the report as JSON")
    route.add_argument(
        "--dump-dir", help="write opensm-lfts.dump and opensm-subnet.lst (and report.json) here"
    )
    route.add_argument(
        "--vls", type=int, default=1, help="virtual lanes available for deadlock freedom (default 1)"
    )
    route.add_argument(
        "--max-shifts",
        type=int,
        default=None,
        help="evaluate at most this many shifts, evenly spread (default: all)",
    )
    route.add_argument("--fail-links", type=int, default=0, help="fail this many random switch links first")
    route.add_argument(
        "--fail-switches", type=int, default=0, help="fail this many random switches without hosts first"
    )
    route.add_argument("--seed", type=int, default=0, help="seed for --fail-* (default 0)")
    route.add_argument(
        "--sm-node", help="node marked as running the SM in opensm-subnet.lst (default: lowest-LID host)"
    )
    route.set_defaults(handler=cmd_route)


def list_engines(args: argparse.Namespace) -> int:
    for engine in default_registry():
        print(f"{engine.name:<8} {engine.summary}  [deadlock-free: {engine.deadlock_free}]")
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    registry = default_registry()
    engine = registry.create(args.engine)
    if args.vls < 1 or args.vls > 15:
        raise CliError(f"--vls must be 1..15, got {args.vls}")
    if args.max_shifts is not None and args.max_shifts < 1:
        raise CliError(f"--max-shifts must be >= 1, got {args.max_shifts}")
    fabric = load_fabric(args.file, args.format)
    if args.sm_node is not None and args.sm_node not in fabric.nodes:
        raise CliError(f"--sm-node: no node {args.sm_node!r} in {args.file}")
    extra: dict[str, Any] = {}
    if args.fail_links or args.fail_switches:
        try:
            result = degrade(fabric, args.fail_links, args.fail_switches, args.seed)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        fabric = result.fabric
        extra["degraded"] = {
            "failed_links": list(result.failed_links),
            "failed_switches": list(result.failed_switches),
            "lost_hosts": list(result.lost_hosts),
            "seed": args.seed,
        }
    dump_dir = Path(args.dump_dir) if args.dump_dir else None
    if dump_dir is not None and dump_dir.exists() and not dump_dir.is_dir():
        raise CliError(f"--dump-dir: {dump_dir} exists and is not a directory")
    if dump_dir is not None:
        try:  # fail before routing, not after
            dump_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"--dump-dir: cannot create {dump_dir}: {exc.strerror or exc}") from None

    subnet = Subnet.build(fabric)
    started = time.perf_counter()
    tables = engine.route(subnet)
    route_s = time.perf_counter() - started
    verification = verify(tables, vls=args.vls)
    figures = quality(tables, max_shifts=args.max_shifts) if args.report else None
    report = build_report(tables, verification, figures, route_s, extra)

    if dump_dir is not None:
        write_text(format_lfts(tables), dump_dir / "opensm-lfts.dump", "--dump-dir")
        write_text(format_subnet_lst(subnet, args.sm_node), dump_dir / "opensm-subnet.lst", "--dump-dir")
        write_text(json.dumps(report, indent=2) + "\n", dump_dir / "report.json", "--dump-dir")
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.report or not dump_dir:
        print(render_report(report))
    if dump_dir is not None and not args.json:
        print(f"wrote {dump_dir}/opensm-lfts.dump, opensm-subnet.lst, report.json", file=sys.stderr)
    if not verification.ok:
        print("fabriclab: verification FAILED (see report)", file=sys.stderr)
        return EXIT_VERIFY_FAILED
    return 0
