"""`fabriclab trace import kineto`: PyTorch profiler traces of a real job as a congestion trace.

    fabriclab trace import kineto rank0.json rank1.json ... --hosts h1..h8 -o trace.jsonl
    fabriclab trace import kineto rank*.json --scenario scenarios/permutation-k4.yaml -o trace.jsonl

One Kineto file per rank; rank i runs on the i-th host of `--hosts` (or of the scenario's or topology's
hosts, in order).  The output is the trace format `kind: trace` scenario items replay (`traffic.trace`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fabriclab.cli.common import CliError, load_fabric, output_file
from labspec.scenario import load_scenario
from traffic.errors import TrafficError, parse_hosts
from traffic.kineto import import_kineto
from traffic.trace import write_trace


def register(commands: Any) -> None:
    trace = commands.add_parser("trace", help="congestion traces: import them from real jobs' profiles")
    sub = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    imp = sub.add_parser("import", help="turn another tool's trace into a congestion trace")
    formats = imp.add_subparsers(dest="trace_format", required=True, metavar="FORMAT")
    kineto = formats.add_parser(
        "kineto",
        help="PyTorch profiler (Kineto) JSON traces, one per rank: their NCCL collectives",
        description="Each NCCL collective a rank ran (GPU kernel, or record_param_comms) becomes its sends "
        "of "
        "the collective's steps over its process group, posted at the kernel's start (step k at k/steps of "
        "its duration).",
    )
    kineto.add_argument("files", nargs="+", type=Path, help="one Kineto trace per rank")
    where = kineto.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="host of each rank, in rank order, e.g. h1..h8")
    where.add_argument("--scenario", type=Path, help="ranks on the scenario topology's hosts, in order")
    where.add_argument("--topology", type=Path, help="ranks on the topology's hosts, in order")
    kineto.add_argument("-o", "--output", type=Path, required=True, help="trace file to write (JSON Lines)")
    kineto.set_defaults(handler=run_import_kineto)


def _hosts(args: argparse.Namespace) -> list[str]:
    if args.scenario is not None:
        return [h.name for h in load_scenario(args.scenario).fabric.hosts]
    if args.topology is not None:
        return [h.name for h in load_fabric(str(args.topology)).hosts]
    try:
        return parse_hosts(args.hosts, field="hosts")
    except TrafficError as exc:
        raise CliError(f"--hosts: {exc.message}") from None


def run_import_kineto(args: argparse.Namespace) -> int:
    hosts = _hosts(args)
    imported = import_kineto(args.files, hosts)
    with output_file(args.output) as tmp:
        write_trace(tmp, imported.records)
    kinds: dict[str, int] = {}
    for c in imported.collectives:
        kinds[c.name] = kinds.get(c.name, 0) + 1
    ranks = sorted({c.rank for c in imported.collectives})
    print(f"{len(args.files)} file(s), ranks {ranks[0]}..{ranks[-1]}: "
          + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))  # fmt: skip
    if imported.skipped:
        print("not imported: " + ", ".join(f"{k or '?'} x{v}" for k, v in sorted(imported.skipped.items())))
    print(f"wrote {args.output}: {len(imported.records)} messages")
    return 0


__all__ = ["register"]
