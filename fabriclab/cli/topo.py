"""`fabriclab topo ...`: generate, check, import and export topologies."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from fabriclab.cli import failures
from fabriclab.cli.common import SEED, CliError, load_fabric, real, write_text
from topologies.checks import check_fabric
from topologies.errors import TopologyError
from topologies.faults import tier_counts_text
from topologies.generators import generate
from topologies.ibnet import dump_ibnet, load_ibnet
from topologies.loader import dump_yaml
from topologies.model import Fabric
from topologies.schema import NAME_RE


def register(commands: Any) -> None:
    topo = commands.add_parser("topo", help="generate, check, import and export topologies")
    sub = topo.add_subparsers(dest="topo_command", required=True, metavar="TOPO_COMMAND")

    gen = sub.add_parser("generate", help="write a generated fabric as a topology file")
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")
    ft = kinds.add_parser("fat-tree", help="3-tier k-ary fat-tree (k^3/4 hosts)")
    ft.add_argument("--k", type=int, required=True, help="switch radix (even)")
    osm = kinds.add_parser("opensm-fat-tree", help="k-ary 3-tree laid out like OpenSM's test generator")
    osm.add_argument("--k", type=int, required=True, help="switch radix (even)")
    ls = kinds.add_parser("leaf-spine", help="2-tier leaf-spine with oversubscription and parallel links")
    ls.add_argument("--leaves", type=int, required=True)
    ls.add_argument("--spines", type=int, required=True)
    ls.add_argument("--hosts-per-leaf", type=int, required=True)
    ls.add_argument("--parallel", type=int, default=1, help="links between each leaf and spine (default 1)")
    ls.add_argument(
        "--uplink-bw-gbps", type=float, default=None, help="leaf-spine link speed (default: --bw-gbps)"
    )
    rail = kinds.add_parser("rail", help="rail-optimised fabric (DGX SuperPOD style)")
    rail.add_argument("--servers", type=int, required=True, help="servers per group")
    rail.add_argument("--gpus", type=int, default=8, help="GPUs (NICs, rails) per server (default 8)")
    rail.add_argument("--groups", type=int, default=1, help="groups / scalable units (default 1)")
    rail.add_argument("--spines", type=int, default=None, help="spine switches (default: 1:1 with servers)")
    rail.add_argument("--parallel", type=int, default=None, help="links between each leaf and spine")
    torus = kinds.add_parser("torus", help="2-D or 3-D torus (hosts on every switch)")
    torus.add_argument("--x", type=int, required=True)
    torus.add_argument("--y", type=int, required=True)
    torus.add_argument("--z", type=int, default=1, help="a third dimension, >= 3 (default 1: a 2-D torus)")
    fly = kinds.add_parser("dragonfly", help="dragonfly: all-to-all groups joined by global links")
    fly.add_argument("--groups", type=int, required=True)
    fly.add_argument("--routers", type=int, required=True, help="routers per group")
    fly.add_argument("--globals-per-router", type=int, required=True)
    rr = kinds.add_parser("random-regular", help="random regular graph of switches (seeded)")
    rr.add_argument("--switches", type=int, required=True)
    rr.add_argument("--degree", type=int, required=True, help="switch-to-switch links per switch")
    rr.add_argument("--seed", type=SEED, default=0)
    for p in (torus, fly, rr):
        p.add_argument("--hosts-per-switch", type=int, default=1)
    for p in (ft, osm, ls, rail, torus, fly, rr):
        p.add_argument("--bw-gbps", type=float, default=400.0, help="link bandwidth in Gb/s (default 400)")
        p.add_argument("--name", help="fabric name (default derived from the parameters)")
        p.add_argument("-o", "--output", help="output file (default: stdout)")
        p.set_defaults(handler=cmd_generate)

    check = sub.add_parser("check", help="validate a topology file (YAML or ibnetdiscover)")
    check.add_argument("file")
    check.add_argument("--format", choices=("auto", "yaml", "ibnet"), default="auto")
    check.add_argument("--json", action="store_true", help="print the summary as JSON")
    check.set_defaults(handler=cmd_check)

    imp = sub.add_parser("import-ibnet", help="turn ibnetdiscover (or ibsim) output into a topology file")
    imp.add_argument("file")
    imp.add_argument("-o", "--output", help="output YAML file (default: stdout)")
    imp.add_argument("--name", help="fabric name (default: the file name)")
    imp.add_argument(
        "--bw-gbps",
        type=real(0.001, 1e6, " Gb/s"),
        default=10.0,
        help="bandwidth of links whose speed the dump does not give (default 10: ibsim's 4x SDR)",
    )
    imp.set_defaults(handler=cmd_import)

    exp = sub.add_parser("export-ibnet", help="write a topology as an ibsim/ibnetdiscover net file")
    exp.add_argument("file")
    exp.add_argument("--format", choices=("auto", "yaml", "ibnet"), default="auto")
    exp.add_argument("-o", "--output", help="output file (default: stdout)")
    exp.set_defaults(handler=cmd_export)

    deg = sub.add_parser(
        "degrade",
        help="write a copy of a topology with links and switches failed (the same as route --fail-*)",
    )
    deg.add_argument("file")
    deg.add_argument("--format", choices=("auto", "yaml", "ibnet"), default="auto")
    failures.add_options(deg)
    deg.add_argument("--ibnet", action="store_true", help="write ibnetdiscover (what OpenSM/ibsim read)")
    deg.add_argument("-o", "--output", help="output file (default: stdout)")
    deg.set_defaults(handler=cmd_degrade)


def _generator_params(args: argparse.Namespace) -> dict[str, Any]:
    if args.kind in ("fat-tree", "opensm-fat-tree"):
        return {"k": args.k, "bw_gbps": args.bw_gbps}
    if args.kind in ("torus", "dragonfly", "random-regular"):
        names = {
            "torus": ("x", "y", "z"),
            "dragonfly": ("groups", "routers", "globals_per_router"),
            "random-regular": ("switches", "degree", "seed"),
        }[args.kind]
        params = {name: getattr(args, name) for name in names}
        if params.get("z") == 1:  # a 2-D torus: as it was always generated and written
            del params["z"]
        return {**params, "hosts_per_switch": args.hosts_per_switch, "bw_gbps": args.bw_gbps}
    if args.kind == "leaf-spine":
        return {
            "leaves": args.leaves,
            "spines": args.spines,
            "hosts_per_leaf": args.hosts_per_leaf,
            "parallel": args.parallel,
            "bw_gbps": args.bw_gbps,
            "uplink_bw_gbps": args.uplink_bw_gbps,
        }
    return {
        "servers": args.servers,
        "gpus": args.gpus,
        "groups": args.groups,
        "spines": args.spines,
        "parallel": args.parallel,
        "bw_gbps": args.bw_gbps,
    }


def cmd_generate(args: argparse.Namespace) -> int:
    params = _generator_params(args)
    _check_name(args.name)
    try:
        fabric = generate(args.kind, **params)
    except TopologyError as exc:
        if exc.field and exc.field.startswith("generator."):  # name the option the user typed
            raise CliError(
                f"--{exc.field.removeprefix('generator.').replace('_', '-')}: {exc.message}"
            ) from None
        raise CliError(f"{args.kind}: {exc.message}") from None
    check_fabric(fabric)
    if args.name:
        fabric = replace(fabric, name=args.name)
    shown = " ".join(
        f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
        for k, v in params.items()
        if v is not None
    )
    _write_topology(fabric, f"generated by: fabriclab topo generate {args.kind} {shown}", args.output)
    return 0


def _write_topology(fabric: Fabric, provenance: str, output: str | None) -> None:
    write_text(dump_yaml(fabric, header=f"{provenance}\n{fabric.summary()}"), output)
    if output:
        print(f"wrote {output}: {fabric.summary()}", file=sys.stderr)


def cmd_check(args: argparse.Namespace) -> int:
    fabric = load_fabric(args.file, args.format)
    summary = {
        "file": args.file,
        "ok": True,
        "name": fabric.name,
        "switches": len(fabric.switches),
        "hosts": len(fabric.hosts),
        "links": len(fabric.links),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"ok: {args.file}: {fabric.summary()}")
    return 0


def _check_name(name: str | None) -> None:
    """`--name` must be a name the written file can be read back with."""
    if name is not None and not NAME_RE.match(name):
        raise CliError(f"--name: bad fabric name {name[:40]!r}: use letters, digits and _ . : / @ + -")


def cmd_import(args: argparse.Namespace) -> int:
    _check_name(args.name)
    fabric = load_ibnet(args.file, name=args.name, default_bw_gbps=args.bw_gbps)
    _write_topology(fabric, f"imported by: fabriclab topo import-ibnet {args.file}", args.output)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    fabric = load_fabric(args.file, args.format)
    write_text(dump_ibnet(fabric, header=f"{fabric.summary()} (exported by fabriclab)"), args.output)
    return 0


def cmd_degrade(args: argparse.Namespace) -> int:
    """The degraded copy `fabriclab route --fail-*` routes, as a file (for OpenSM, or the emulator)."""
    fabric = load_fabric(args.file, args.format)
    result = failures.degraded(fabric, args)
    if result is None:
        raise CliError("nothing to fail: give --fail-links and/or --fail-switches")
    tiers = tier_counts_text(result.failed_switch_tiers)
    note = (
        f"degraded from {args.file} (seed {args.seed}): failed links [{', '.join(result.failed_links)}], "
        f"switches [{', '.join(result.failed_switches)}]{f' ({tiers})' if tiers else ''}; "
        f"{len(result.lost_hosts)} host(s) cut off"
    )
    if args.ibnet:
        write_text(dump_ibnet(result.fabric, header=f"{result.fabric.summary()}; {note}"), args.output)
    else:
        _write_topology(result.fabric, note, args.output)
    print(f"fabriclab: {note}", file=sys.stderr)
    return 0
