"""`fabriclab sim` and `fabriclab sweep`: the flow-level simulator's commands.

    fabriclab sim scenarios/moe-alltoall-4096gpu.yaml --policies static,ecmp,spray,adaptive -o results/sim
    fabriclab sim scenarios/permutation-k4.yaml --policies static,ecmp,spray --cc dcqcn -o results/cc
    fabriclab sim --topology topologies/leaf-spine-32x32.yaml --traffic permutation --seed 1 \\
                  --policies ecmp,spray -o results/perm
    fabriclab sweep sweeps/policies-vs-size.yaml -o results/sweep [--dask tcp://127.0.0.1:8786]

Everything is checked before any work starts (unknown policy or workload, hosts the fabric lacks, a grid
over the cap, a Dask scheduler that does not answer): one line on stderr, exit 2, nothing written.  Results
are written to a temporary folder and renamed into place, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from controller.sm.engines import default_registry
from controller.sm.policies import PolicyParams
from fabriclab.cli import results
from fabriclab.cli.common import SEED, CliError, load_fabric
from fabriclab.cli.progress import console_progress
from flowsim.ccsim import check_supported
from flowsim.engine import SimConfig
from flowsim.metrics import FIELDS
from flowsim.network import Network
from flowsim.policies import sim_policies
from flowsim.report import write_report
from flowsim.run import reference_run, simulate
from flowsim.scenario import cc_setup, workload_of
from flowsim.sweep import SweepError, load_sweep, run_dask, run_local, sweep_digest, write_sweep
from flowsim.workload import ADHOC, adhoc
from labspec.scenario import Scenario, load_scenario
from traffic.errors import TrafficError, parse_hosts, parse_size

ALL_POLICIES = ",".join(sim_policies().names())


def register(commands: Any) -> None:
    sim = commands.add_parser(
        "sim",
        help="flow-level simulation of a scenario or an ad hoc workload under routing policies",
        description="Max-min fair flow-level simulation at real link speeds, on the controller's own tables.",
    )
    sim.add_argument("scenario", nargs="?", type=Path, help="scenario file (as for `scenario run`)")
    sim.add_argument("--topology", type=Path, help="ad hoc: topology file instead of a scenario")
    sim.add_argument("--traffic", help=f"ad hoc workload: {' | '.join(ADHOC)}")
    sim.add_argument("--size", default="64MiB", help="ad hoc: bytes per flow / per rank (default 64MiB)")
    sim.add_argument("--hosts", help="ad hoc: hosts taking part, e.g. h1..h256 (default: all)")
    sim.add_argument("--seed", type=SEED, help="seed (ECMP hash, permutations); default: the scenario's or 0")
    sim.add_argument(
        "--policies",
        help=f"comma-separated, from {ALL_POLICIES} (default: the scenario's policy; ad hoc: all)",
    )
    sim.add_argument("--engine", help="routing engine (default: the scenario's or ftree)")
    sim.add_argument("--interval-ms", type=int, help="adaptive: measurement interval")
    sim.add_argument("--threshold", type=float, help="adaptive: utilisation above which a port is avoided")
    sim.add_argument(
        "--hysteresis", type=float, help="adaptive: band below the threshold where nothing moves"
    )
    sim.add_argument(
        "--aggregate",
        choices=("auto", "always", "never"),
        default="auto",
        help="flow classes by (src leaf, dst leaf, route) for big one-phase batches",
    )
    sim.add_argument(
        "--compare",
        type=Path,
        metavar="SUMMARY",
        help="the summary.json of `fabriclab compare` on the same scenario: writes comparison.json",
    )
    sim.add_argument(
        "--cc",
        choices=("none", "dcqcn"),
        help="congestion control of the RoCE senders, overriding the scenario's `cc:` (dcqcn: a fluid DCQCN "
        "model; none: ideal max-min)",
    )
    sim.add_argument(
        "--real-speed",
        action="store_true",
        help="simulate a scenario at its topology's real link speeds instead of its `scale` (not "
        "comparable with the emulator then)",
    )
    sim.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="results folder (new, empty or an earlier `sim` result, which is replaced)",
    )
    sim.add_argument("--force", action="store_true", help=results.FORCE_HELP)
    sim.set_defaults(handler=run_sim)

    sweep = commands.add_parser("sweep", help="run a grid of simulations (policy x workload x fabric x seed)")
    sweep.add_argument("file", type=Path, help="sweep file (YAML)")
    sweep.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="results folder (new, empty or an earlier `sweep` result, which is replaced or resumed)",
    )
    sweep.add_argument("--force", action="store_true", help=results.FORCE_HELP)
    sweep.add_argument("--dask", metavar="ADDRESS", help="run on a Dask scheduler, e.g. tcp://127.0.0.1:8786")
    sweep.add_argument("--dask-timeout", type=float, default=10.0, help="seconds to wait for the scheduler")
    sweep.add_argument("--workers", type=int, help="local processes (default: one per core)")
    sweep.add_argument("--max-points", type=int, help="cap on grid points (default: the file's, or 500)")
    sweep.set_defaults(handler=run_sweep)


def _params(args: argparse.Namespace, base: PolicyParams) -> PolicyParams:
    return PolicyParams(
        args.interval_ms if args.interval_ms is not None else base.interval_ms,
        args.threshold if args.threshold is not None else base.threshold,
        args.hysteresis if args.hysteresis is not None else base.hysteresis,
    ).validate()


def run_sim(args: argparse.Namespace) -> int:
    results.check(args.output, "sim", args.force)  # before any work
    registry = sim_policies()
    if (args.scenario is None) == (args.topology is None):
        raise CliError("give a scenario file or --topology with --traffic (not both)")
    if args.scenario is not None:
        if args.traffic or args.hosts:
            raise CliError(
                "--traffic/--hosts are for ad hoc runs (--topology); a scenario has its own traffic"
            )
        scenario = load_scenario(args.scenario)
        if args.cc is not None:
            scenario = scenario.with_cc(args.cc)
        c = scenario.spec.controller
        base = PolicyParams(c.interval_ms, c.threshold, c.hysteresis)
        policies = registry.parse_list(c.policy if args.policies is None else args.policies)
        engine = args.engine or c.engine
        seed = args.seed if args.seed is not None else scenario.spec.seed
        network = Network.build(scenario.fabric, None if args.real_speed else scenario.scale)
        workload = workload_of(scenario, network)
        name = scenario.spec.name
        cc = cc_setup(scenario, network) if scenario.spec.cc == "dcqcn" else None
    else:
        if not args.traffic:
            raise CliError(f"--traffic: needed with --topology ({' | '.join(ADHOC)})")
        policies = registry.parse_list(ALL_POLICIES if args.policies is None else args.policies)
        base, engine, seed = PolicyParams(), args.engine or "ftree", args.seed or 0
        network = Network.build(load_fabric(str(args.topology)))
        try:
            size = parse_size(args.size, field="size")
            hosts = parse_hosts(args.hosts, sorted(network.host_index), field="hosts") if args.hosts else None
        except TrafficError as exc:
            raise CliError(str(exc)) from None
        workload = adhoc(args.traffic, network, size, seed, hosts)
        name = None
        if args.compare or args.real_speed:
            raise CliError("--compare/--real-speed: for scenario files (the emulator runs scenarios)")
        if args.cc == "dcqcn":
            raise CliError("--cc: dcqcn needs a scenario file (its RoCE traffic, `dcqcn:` parameters, scale "
                           "and buffers)")  # fmt: skip
        cc = None
    if engine not in default_registry():
        raise CliError(
            f"--engine: unknown routing engine {engine!r} ({', '.join(default_registry().names())})"
        )
    params = _params(args, base)
    emulation = _read_compare(args.compare) if args.compare else None
    config = SimConfig(params=params, engine=engine, seed=seed, aggregate=args.aggregate)
    if cc is not None:
        check_supported(workload, policies, params)  # before any work: what the DCQCN model cannot run
    started = time.perf_counter()
    with console_progress() as show:
        outcome = simulate(network, workload, policies, config, show, scenario=name, cc=cc)
    with results.results_dir(args.output, "sim", args.force) as folder:
        summary = write_report(outcome, folder, emulation)
    print(f"{network.fabric.summary()}; {workload.label}; links {network.link_speeds}; "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    for policy, row in summary["policies"].items():
        shown = "  ".join(
            f"{f}={row[f]:.4g}" if isinstance(row[f], float) else f"{f}={row[f]}" for f in FIELDS
        )
        print(f"{policy:<9} {shown}")
        if "cc" in row:
            b = row["cc"]
            jain = "-" if b["jain_senders"] is None else f"{b['jain_senders']:.3f}"
            print(f"{'':<9} cc={b['cc']}  cnps={b['cnps_sent']}  marked={b['marked_fraction']:.3g}  "
                  f"loss_pct={b['loss_pct']:.3g}  peak_queue_bytes={b['peak_queue_bytes']:.0f}  "
                  f"jain_senders={jain}")  # fmt: skip
    if "emulation_comparison" in summary:
        c = summary["emulation_comparison"]
        verdict = ("NOT COMPARABLE: " + str(c["why_not"])) if not c["comparable"] else (
            f"{'agree' if c['agree'] else 'DISAGREE'} (same order: {c['same_order']}, largest difference "
            f"{c['max_rel_diff']:.1%}, tolerance {c['tolerance']:.0%})")  # fmt: skip
        print(f"vs emulation: {verdict}; {args.output}/comparison.json")
    print(f"results: {args.output}/summary.json, {args.output}/report.md")
    return 0


def scenario_reference(scenario: Scenario) -> dict[str, Any]:
    """The non-blocking reference run of a scenario at its scale: what the emulator's slowdowns and
    throughput ratios divide by (`fabriclab compare` composes the emulator with the simulator here)."""
    c = scenario.spec.controller
    network = Network.build(scenario.fabric, scenario.scale)
    config = SimConfig(params=PolicyParams(c.interval_ms, c.threshold, c.hysteresis), engine=c.engine,
                       seed=scenario.spec.seed)  # fmt: skip
    return reference_run(network, workload_of(scenario, network), config)


def _read_compare(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"--compare: cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("policies"), dict):
        raise CliError(f"--compare: {path} is not a summary ({{'policies': {{NAME: {{...}}}}}})")
    return data


def run_sweep(args: argparse.Namespace) -> int:
    if args.max_points is not None and args.max_points < 1:
        raise CliError(f"--max-points: must be >= 1, not {args.max_points}")
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers: must be >= 1, not {args.workers}")
    if not 0.5 <= args.dask_timeout <= 3600:
        raise CliError(f"--dask-timeout: 0.5..3600 seconds, not {args.dask_timeout:g}")
    results.check(args.output, "sweep", args.force)
    sweep = load_sweep(args.file, args.max_points)
    digest = sweep_digest(sweep)
    done = _resumable(args.output, digest)
    resumed = len(done)
    if resumed:
        print(f"resuming: {resumed} of {len(sweep.tasks)} units finished earlier (kept in {args.output})")
    started = time.perf_counter()
    try:
        with console_progress() as show:

            def tick(finished: int, total: int, where: str) -> None:
                show(finished / total, f"sweep: {finished}/{total} units on {where}")

            if args.dask:
                rows = run_dask(sweep, args.dask, tick, args.dask_timeout, done)
                executor = f"dask {args.dask}"
            else:
                rows = run_local(sweep, args.workers, tick, done)
                executor = "local processes"
    except BaseException as exc:
        if len(done) > resumed:  # keep what finished: a rerun of the same command resumes from it
            _keep_partial(args, digest, done)
            note = f"they are kept in {args.output}: the same command resumes"
            if isinstance(exc, SweepError):
                raise SweepError(f"{exc.message}; {note}", field=exc.field) from None
            print(f"fabriclab: {note}", file=sys.stderr)
        raise
    with results.results_dir(args.output, "sweep", args.force, meta={"sweep": digest}) as folder:
        write_sweep(sweep, rows, folder, executor)
    print(
        f"{sweep.points} points ({len(sweep.tasks)} units) on {executor} "
        f"in {time.perf_counter() - started:.1f} s" + (f", {resumed} units resumed" if resumed else "")
    )
    print(f"results: {args.output}/results.json, {args.output}/results.csv, {args.output}/report.md")
    return 0


#: The file of an unfinished sweep's finished units (one JSON object per line: {"task": i, "rows": [...]}).
PARTIAL = "partial.jsonl"


def _resumable(output: Path, digest: str) -> dict[int, list[dict[str, Any]]]:
    """Finished units of an earlier, interrupted run of the same grid into `output` ({} if none)."""
    note = results.marker(output)
    if note.get("command") != "sweep" or note.get("sweep") != digest or not note.get("partial"):
        return {}
    done: dict[int, list[dict[str, Any]]] = {}
    try:
        with (output / PARTIAL).open(encoding="utf-8") as handle:
            for line in handle:
                unit = json.loads(line)
                done[int(unit["task"])] = list(unit["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # damaged: run everything again (the folder is replaced at the end)
    return done


def _keep_partial(args: argparse.Namespace, digest: str, done: dict[int, list[dict[str, Any]]]) -> None:
    meta = {"sweep": digest, "partial": True}
    with results.results_dir(args.output, "sweep", args.force, meta=meta) as folder:
        (folder / PARTIAL).write_text(
            "".join(json.dumps({"task": task, "rows": rows}) + "\n" for task, rows in sorted(done.items()))
        )


__all__ = ["register"]
