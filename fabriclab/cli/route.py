"""`fabriclab route`: compute forwarding tables, verify them, report quality, dump in OpenSM formats."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from controller.sm.engines import default_registry, select_engine
from controller.sm.engines.base import RoutingEngine
from controller.sm.engines.labels import LABELS, labelled
from controller.sm.engines.sssp import MAX_VLS
from controller.sm.hostorder import format_ca_order
from controller.sm.lanedump import check_lanes, format_path_sl, format_sl2vl
from controller.sm.opensm import DumpError, format_lfts, format_subnet_lst
from controller.sm.quality import quality
from controller.sm.report import build_report, render_report
from controller.sm.subnet import Subnet
from controller.sm.tables import RoutingTables
from controller.sm.verify import Verification, verify
from fabriclab.cli import failures, results
from fabriclab.cli.common import CliError, load_fabric

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
        "--fallback",
        help="engine to use (and say so) when --engine cannot route this fabric, e.g. ftree on a non-tree",
    )
    route.add_argument(
        "--report",
        action="store_true",
        help="add quality figures: all-to-all link load and worst shift permutation",
    )
    route.add_argument("--json", action="store_true", help="print the report as JSON")
    route.add_argument(
        "--dump-dir",
        help="write opensm-lfts.dump, opensm-subnet.lst, opensm-ftree-ca-order.dump and report.json (and for "
        "an engine with lanes opensm-sl2vl.dump, opensm-path-sl.dump) into this folder (new, empty or an "
        "earlier --dump-dir, which is replaced); nothing if the tables fail verification",
    )
    route.add_argument("--force", action="store_true", help=results.FORCE_HELP.replace("-o", "--dump-dir"))
    route.add_argument(
        "--vls",
        type=int,
        default=None,
        help="virtual lanes available for deadlock freedom, 1..15 (default: 1; dfsssp: 8, as OpenSM)",
    )
    route.add_argument(
        "--max-shifts",
        type=int,
        default=None,
        help="evaluate at most this many shifts, evenly spread (default: all)",
    )
    route.add_argument(
        "--labels",
        choices=LABELS,
        default="as-given",
        help="break the engine's ties by the fabric's own GUIDs and port numbers, as OpenSM does (as-given, "
        "the default) or by labels derived from the cabling alone, so that any relabelling of the same "
        "cabling gets the same figures (canonical; docs/routing.md)",
    )
    failures.add_options(route)
    route.add_argument(
        "--sm-node", help="node marked as running the SM in opensm-subnet.lst (default: lowest-LID host)"
    )
    route.set_defaults(handler=cmd_route)

    lanes = commands.add_parser(
        "check-lanes",
        help="prove every virtual lane of a route --dump-dir deadlock-free from its files alone",
        description="Read opensm-subnet.lst, opensm-lfts.dump and opensm-path-sl.dump from DIR, walk every "
        "route and check each lane's channel dependency graph for a cycle (exit 1 if one has one).",
    )
    lanes.add_argument("dir", help="a folder written by route --dump-dir with an engine that uses lanes")
    lanes.set_defaults(handler=cmd_check_lanes)


def list_engines(args: argparse.Namespace) -> int:
    for engine in default_registry():
        print(f"{engine.name:<8} {engine.summary}  [deadlock-free: {engine.deadlock_free}]")
    return 0


def _balance(tables: RoutingTables, max_shifts: int | None) -> dict[str, Any]:
    figures = quality(tables, max_shifts=max_shifts)
    summary: dict[str, Any] = {
        "engine": tables.engine,
        "switch_links_max_over_mean": round(figures.switch_links.max_over_mean, 4),
        "worst_tier_max_over_mean": round(max((t.max_over_mean for t in figures.all_to_all), default=0.0), 4),
    }
    if figures.shift is not None:
        summary["shift_worst_max_flows"] = figures.shift.worst_max_flows
    return summary


def _route(
    engine: RoutingEngine, subnet: Subnet, vls: int | None
) -> tuple[RoutingTables, Verification, float]:
    """Route (the engine given `vls` lanes where it layers) and verify: (tables, verification, seconds)."""
    if vls is not None:
        engine = engine.with_lanes(vls)
    started = time.perf_counter()
    tables = engine.route(subnet)
    route_s = time.perf_counter() - started
    return tables, verify(tables, vls=vls if vls is not None else 1), route_s


def _failure(tables: RoutingTables, verification: Verification) -> str:
    if verification.unreachable_pairs:
        return f"{verification.unreachable_pairs} host pairs unreachable"
    if verification.loop_entries or verification.dead_entries:
        return f"{verification.loop_entries} loop and {verification.dead_entries} dead entries"
    note = tables.info.get("note")  # the engine's own word (dfsssp: "still cyclic with 8 VL(s)")
    return str(note) if note else "a channel dependency cycle"


def cmd_route(args: argparse.Namespace) -> int:
    registry = default_registry()
    registry.create(args.engine)
    if args.fallback is not None:
        registry.create(args.fallback)
    if args.vls is not None and not 1 <= args.vls <= MAX_VLS:
        raise CliError(f"--vls must be 1..{MAX_VLS}, got {args.vls}")
    if args.max_shifts is not None and args.max_shifts < 1:
        raise CliError(f"--max-shifts must be >= 1, got {args.max_shifts}")
    fabric = load_fabric(args.file, args.format)
    if args.sm_node is not None and args.sm_node not in fabric.nodes:
        raise CliError(f"--sm-node: no node {args.sm_node!r} in {args.file}")
    extra: dict[str, Any] = {}
    intact = fabric
    result = failures.degraded(fabric, args)
    if result is not None:
        fabric = result.fabric
        extra["degraded"] = failures.describe(result, args.seed)
    dump_dir = Path(args.dump_dir) if args.dump_dir else None
    if dump_dir is not None:  # fail before routing, not after; nothing is created until the dumps are
        results.check(dump_dir, "route", args.force, "--dump-dir")

    subnet = Subnet.build(fabric)
    engine, fallback = select_engine(registry, args.engine, subnet, args.fallback)
    if fallback is not None:
        print(f"fabriclab: {fallback}", file=sys.stderr)
        extra["fallback"] = {"requested": args.engine, "used": engine.name, "reason": fallback}
    tables, verification, route_s = _route(labelled(engine, args.labels), subnet, args.vls)
    if not verification.ok and args.fallback is not None and engine.name != args.fallback:
        # the engine ran but its tables do not verify (dfsssp still cyclic with every lane it was given):
        # the fallback routes instead, as OpenSM falls back when its engine fails
        reason = _failure(tables, verification)
        engine = registry.create(args.fallback)
        note = f"{args.engine}'s tables failed verification ({reason}); falling back to {engine.name}"
        print(f"fabriclab: {note}", file=sys.stderr)
        extra["fallback"] = {"requested": args.engine, "used": engine.name, "reason": note}
        tables, verification, route_s = _route(labelled(engine, args.labels), subnet, args.vls)
    figures = quality(tables, max_shifts=args.max_shifts) if args.report else None
    if args.report and "degraded" in extra:
        intact_subnet = Subnet.build(intact)
        intact_engine, _ = select_engine(registry, engine.name, intact_subnet, args.fallback)
        intact_tables = labelled(intact_engine, args.labels).route(intact_subnet)
        extra["degraded"]["intact"] = _balance(intact_tables, args.max_shifts)
        extra["degraded"]["degraded"] = _balance(tables, args.max_shifts)
    report = build_report(tables, verification, figures, route_s, extra)

    if dump_dir is not None and not verification.ok:
        print(f"fabriclab: nothing written to {dump_dir}: the tables failed verification", file=sys.stderr)
        dump_dir = None
    if dump_dir is not None:
        dumps = {
            "opensm-lfts.dump": format_lfts(tables),
            "opensm-subnet.lst": format_subnet_lst(subnet, args.sm_node),
            "opensm-ftree-ca-order.dump": format_ca_order(subnet, tables.ca_order),
            "report.json": json.dumps(report, indent=2) + "\n",
        }
        if tables.layers is not None:  # an engine that assigns lanes (dfsssp): its SLs and SL-to-VL maps
            dumps["opensm-sl2vl.dump"] = format_sl2vl(tables)
            dumps["opensm-path-sl.dump"] = format_path_sl(tables)
        try:  # all files or none: a new folder renamed into place (an earlier `route` dump is replaced)
            with results.results_dir(dump_dir, "route", args.force, "--dump-dir") as folder:
                for name, text in dumps.items():
                    (folder / name).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CliError(f"--dump-dir: cannot write {dump_dir}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.report or not dump_dir:
        print(render_report(report))
    if dump_dir is not None and not args.json:
        print(f"wrote {dump_dir}/{', '.join(dumps)}", file=sys.stderr)
    if not verification.ok:
        print("fabriclab: verification FAILED (see report)", file=sys.stderr)
        return EXIT_VERIFY_FAILED
    return 0


def cmd_check_lanes(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    names = ("opensm-subnet.lst", "opensm-lfts.dump", "opensm-path-sl.dump")
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise CliError(
            f"{args.dir}: no {missing[0]} (route --dump-dir writes it for an engine that uses lanes: dfsssp)"
        )
    texts = [(folder / name).read_text(encoding="utf-8") for name in names]
    try:
        result = check_lanes(*texts)
    except DumpError as exc:
        raise CliError(f"{args.dir}: {exc}") from None
    for problem in result.problems:
        print(f"problem       {problem}")
    for lane, count in result.dependencies.items():
        cycle = result.cycles.get(lane)
        verdict = (
            f"CYCLIC: {' -> '.join(cycle[:8])}{' ...' if len(cycle) > 8 else ''}" if cycle else "acyclic"
        )
        print(f"lane {lane:<2d}       {count} dependencies, {verdict}")
    print(f"routes        {result.routes} walked through the dumps; "
          f"{'every lane acyclic' if result.acyclic else 'NOT deadlock-free'}")  # fmt: skip
    return 0 if result.acyclic else EXIT_VERIFY_FAILED
