"""`fabriclab scenario check|run` and `fabriclab compare`: a scenario file run on the emulated fabric, once
or once per routing policy (the emulator's side of the policy lab; `fabriclab sim` is the simulator's)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from controller.sm.intents import ForwardingOptions
from controller.sm.manager import policy_problem
from controller.sm.policies import PolicyError, default_policies
from emulation import calibrate as calibration
from emulation import ccrun
from emulation.runner import capacity_warnings, cluster_refuses, run_scenario
from emulation.shards import CROSSINGS
from emulation.shards import plan as shard_plan
from fabriclab.cli import results
from fabriclab.cli.common import (
    CC_CHOICES,
    CC_HELP,
    CliError,
    integer,
)
from fabriclab.cli.emulate import dask_address, emulated
from fabriclab.cli.policy import option_error
from fabriclab.cli.progress import console_progress
from fabriclab.cli.results import FORCE_HELP
from fabriclab.cli.sim import scenario_reference
from flowsim.policies import SIMULATED_ONLY
from labspec.scenario import Scenario, ScenarioError, emulator_refuses, load_scenario


def register(commands: Any) -> None:
    scenario = commands.add_parser("scenario", help="check or run scenario files")
    ssub = scenario.add_subparsers(dest="scenario_command", required=True, metavar="ACTION")
    check = ssub.add_parser("check", help="validate a scenario file (and its topology)")
    check.add_argument("file", type=Path)
    check.set_defaults(handler=scenario_check)
    run = ssub.add_parser("run", help="run a scenario headless and write a results folder")
    run.add_argument("file", type=Path)
    run.add_argument("-o", "--output", type=Path, help="results folder: new, empty or an earlier `scenario "
                     "run` result, which is replaced (default results/NAME)")  # fmt: skip
    run.add_argument("--force", action="store_true", help=FORCE_HELP)
    run.add_argument("--shards", type=integer(1, 64), default=1, metavar="N",
                     help="switches on N ovs-vswitchd instances (docs/sharding.md)")  # fmt: skip
    run.add_argument("--crossing", choices=CROSSINGS, default="veth",
                     help="cables between shards: veth or VXLAN tunnels (default veth)")  # fmt: skip
    run.add_argument("--dask", metavar="ADDRESS",
                     help="place the --shards on the Dask workers started with --resources fabriclab-emu=1 "
                     "(one machine each, VXLAN between them; each flow sent and received where its hosts "
                     "are; docs/sharding.md), e.g. tcp://10.0.0.1:8786")  # fmt: skip
    run.add_argument("--openflow-advertise", metavar="IP",
                     help="with --dask: the address the workers reach the controller at (default: this "
                     "machine's address towards the scheduler)")  # fmt: skip
    run.add_argument("--cc", choices=CC_CHOICES, help=CC_HELP)
    run.set_defaults(handler=scenario_run)

    compare = commands.add_parser(
        "compare", help="run a scenario once per routing policy and compare them (report, plots, JSON)"
    )
    compare.add_argument("file", type=Path, help="scenario file")
    compare.add_argument(
        "--policies", default="static,ecmp,spray,adaptive", help="comma-separated (default: all four)"
    )
    compare.add_argument("-o", "--output", type=Path, help="results folder: new, empty or an earlier "
                         "`compare` result, which is replaced (default results/NAME-compare)")  # fmt: skip
    compare.add_argument(
        "--force", action="store_true", help="replace -o even if it is a folder of other things"
    )
    compare.add_argument(
        "--capacity",
        type=Path,
        help="the fabric's calibrated clean capacity (JSON with per_host_pps, total_pps): compared with the "
        "load the scenario offers",
    )
    compare.add_argument("--cc", choices=CC_CHOICES, help=CC_HELP)
    compare.set_defaults(handler=compare_policies)


def _with_cc(scenario: Scenario, cc: str | None, shards: int = 1) -> Scenario:
    """The scenario under `--cc` (if given); refused if this emulator cannot run its congestion control."""
    if cc is not None:
        scenario = scenario.with_cc(cc)
    refused = ccrun.refuses(scenario, shards)
    if refused:
        raise CliError(f"--cc: {refused}" if cc is not None else refused)
    return scenario


def _cluster(args: argparse.Namespace, scenario: Scenario) -> tuple[str, str | None] | None:
    """`--dask` (and `--openflow-advertise`) checked: (scheduler, advertised address) or None."""
    if args.dask is None:
        if args.openflow_advertise is not None:
            raise CliError("--openflow-advertise: only with --dask (the workers dial the controller there)")
        return None
    if args.crossing != "veth":
        raise CliError("--crossing: not with --dask (cables between machines are VXLAN)")
    refused = cluster_refuses(scenario)
    if refused:
        raise CliError(f"--dask: {refused}")
    return dask_address(args.dask, args.openflow_advertise), args.openflow_advertise


def scenario_check(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.file)
    flows = scenario.flows()
    print(
        f"ok: {args.file}: {scenario.spec.name}: {scenario.fabric.summary()}; {len(flows)} flow(s), "
        f"{len(scenario.spec.faults)} fault(s), {scenario.spec.duration_s:g} s x {scenario.spec.repetitions}"
    )
    return 0


def scenario_run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.file)
    refused = emulator_refuses(scenario)
    if refused:  # before anything is built or written
        raise ScenarioError(refused, file=str(scenario.file))
    scenario = _with_cc(scenario, args.cc, args.shards)
    if args.shards > 1:
        try:
            shard_plan(scenario.fabric, args.shards)
        except ValueError as exc:
            raise CliError(f"--shards: {exc}") from None
    elif args.crossing != "veth":
        raise CliError("--crossing: only with --shards 2 or more")
    cluster = _cluster(args, scenario)
    output = args.output or _default_output(scenario)
    results.check(output, "scenario run", args.force)  # a folder that cannot be written fails now
    capacity = calibration.load(scenario.fabric.name)
    for warning in capacity_warnings(scenario, capacity):
        print(f"warning: {warning}", file=sys.stderr)

    def run() -> dict[str, Any]:
        with (
            results.results_dir(output, "scenario run", args.force, on_failure=_show_logs) as folder,
            console_progress() as progress,
        ):
            return run_scenario(scenario, folder, progress, capacity, shards=args.shards,
                                crossing=args.crossing, cluster=cluster)  # fmt: skip

    summary = emulated(run, "controller not ready (its log is above)")
    if summary is None:
        return 130
    for rep in summary["repetitions"]:
        lost = sum(f["lost"] for f in rep["flows"])
        worst = max((w["loss_window_ms"] for w in rep["loss_windows"]), default=0.0)
        print(
            f"rep {rep['repetition']}: {rep['all_pairs']['reachable']}/{rep['all_pairs']['pairs']} pairs, "
            f"{len(rep['flows'])} flows, {lost} packets lost, worst loss window {worst} ms, "
            f"{sum(1 for e in rep['events'] if e['kind'].startswith('port_'))} reroutes"
            + (f"; EMULATOR OVERLOADED: {rep['headroom']['why']}" if rep["headroom"]["why"] else "")
        )
    print(f"results: {output}/summary.json, {output}/report.md, {output}/report.html")
    return 0


def _default_output(scenario: Scenario, suffix: str = "") -> Path:
    """results/NAME: one folder per scenario, so running another scenario never meets the last one's."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", scenario.spec.name).strip("._") or "scenario"
    return Path("results") / f"{name[:100]}{suffix}"


def _show_logs(folder: Path) -> None:
    """A failed run's results folder is removed: its controller logs' last lines go to stderr first."""
    for log in sorted(folder.rglob("controller.log"))[:4]:
        try:
            lines = log.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            continue
        print(f"--- last lines of {log.relative_to(folder)} ---", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr)


def compare_policies(args: argparse.Namespace) -> int:
    """`fabriclab compare`: everything is checked (scenario, policies, that the fabric supports each) before
    anything is built."""
    from emulation.compare import run_compare  # noqa: PLC0415 - matplotlib and Mininet only when running

    scenario = _with_cc(load_scenario(args.file), args.cc)
    output = args.output or _default_output(scenario, "-compare")
    results.check(output, "compare", args.force)
    only_sim = [p.strip() for p in args.policies.split(",") if p.strip() in SIMULATED_ONLY]
    if only_sim:
        raise CliError(
            f"--policies: {', '.join(only_sim)} is simulated only (not realisable on Open vSwitch): "
            "use `fabriclab sim`"
        )
    try:
        policies = default_policies().parse_list(args.policies)
    except PolicyError as exc:
        raise option_error(exc) from None
    refused = emulator_refuses(scenario)
    if refused:
        raise CliError(refused)
    controller = scenario.spec.controller
    for policy in policies:
        options = ForwardingOptions(controller.fast_failover, policy=policy)
        problem = policy_problem(scenario.fabric, controller.engine, options)
        if problem is not None:
            raise CliError(f"--policies: {problem.message}")
    capacity = _capacity(args.capacity) if args.capacity else calibration.load(scenario.fabric.name)
    reference = scenario_reference(scenario)

    def run() -> dict[str, Any]:
        with (
            results.results_dir(output, "compare", args.force, on_failure=_show_logs) as folder,
            console_progress() as progress,
        ):
            return run_compare(scenario, policies, folder, progress, capacity, reference)

    summary = emulated(run, "controller not ready (its log is above)")
    if summary is None:
        return 130
    for policy, f in summary["policies"].items():
        print(
            f"{policy:9} slowdown {_g(f['slowdown'])}, completion {_g(f['completion_s'])} s, goodput "
            f"{_g((f['goodput_gbps'] or 0) * 1e3)} Mb/s, FCT slowdown p99 {_g(f['fct_slowdown_p99'])}, "
            "max util "
            f"{f['max_link_util']}, lost {f['lost_packets']}, reordered {f['reordered_packets']}"
            + (
                f", CNPs {f['cc']['cnps_sent']}, marked {_g(f['cc']['marked_fraction'])}"
                if f["cc"]["cc"] == "dcqcn"
                else ""
            )
            + (" (EMULATOR OVERLOADED)" if f["emulator_overloaded"] else "")
        )
    print(f"results: {output}/summary.json, {output}/report.md, {output}/report.html")
    return 0


def _g(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def _capacity(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        capacity = {"per_host_pps": float(data["per_host_pps"]), "total_pps": float(data["total_pps"])}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CliError(f"--capacity: {path}: expected JSON with per_host_pps and total_pps ({exc})") from None
    if not all(v > 0 for v in capacity.values()):
        raise CliError(f"--capacity: {path}: capacities must be positive")
    return capacity
