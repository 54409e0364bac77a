"""`fabriclab emulate up` and `fabriclab scenario check|run`: the emulator's commands.

`emulate up` realises a topology on Mininet (userspace OVS), starts the controller as its own process (or
uses a running one with `--controller`), waits until every switch holds its tables, checks that every host
reaches every other (raw frames to each MAC, all pairs at once) and prints the times; then the Mininet CLI,
or with `--no-cli` it waits for Ctrl-C/SIGTERM.  Teardown removes only what it created.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from controller.cli.common import CliError, load_fabric
from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess
from emulation.mesh import check_all_pairs
from emulation.mnfabric import EmulationError, MininetFabric, Scale, mininet_available
from emulation.ovs import OvsDaemon
from emulation.runner import console_progress, run_scenario
from emulation.scenario import load_scenario


def register(commands: Any) -> None:
    emulate = commands.add_parser(
        "emulate", help="run an emulated fabric (Mininet + OVS) with the controller"
    )
    sub = emulate.add_subparsers(dest="emulate_command", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="bring a topology up, verify all pairs, then the Mininet CLI")
    up.add_argument("topology", type=Path)
    up.add_argument("--scale", help="link speed scaling, e.g. 400G=200M (HTB; at most 1 Gb/s per link)")
    up.add_argument("--engine", default="ftree")
    up.add_argument("--controller", help="use a running controller (tcp:HOST:PORT) instead of starting one")
    up.add_argument("--api", default="127.0.0.1:8080", help="REST address of the controller this starts")
    up.add_argument(
        "--openflow", default="127.0.0.1:6653", help="OpenFlow address of the controller this starts"
    )
    up.add_argument("--mtu", type=int, default=1500)
    up.add_argument("--no-cli", action="store_true", help="no Mininet CLI: wait for Ctrl-C or SIGTERM")
    up.set_defaults(handler=emulate_up)

    scenario = commands.add_parser("scenario", help="check or run scenario files")
    ssub = scenario.add_subparsers(dest="scenario_command", required=True, metavar="ACTION")
    check = ssub.add_parser("check", help="validate a scenario file (and its topology)")
    check.add_argument("file", type=Path)
    check.set_defaults(handler=scenario_check)
    run = ssub.add_parser("run", help="run a scenario headless and write a results folder")
    run.add_argument("file", type=Path)
    run.add_argument("-o", "--output", type=Path, default=Path("results"), help="results folder")
    run.set_defaults(handler=scenario_run)


def _prerequisites() -> OvsDaemon:
    reason = mininet_available()
    if reason:
        raise CliError(f"emulation unavailable: {reason}")
    daemon = OvsDaemon()
    daemon.ensure_running()
    return daemon


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
    daemon = _prerequisites()
    try:
        summary = run_scenario(scenario, args.output, console_progress())
    finally:
        daemon.stop_if_started()
    for rep in summary["repetitions"]:
        lost = sum(f["lost"] for f in rep["flows"])
        worst = max((w["loss_window_ms"] for w in rep["loss_windows"]), default=0.0)
        print(
            f"rep {rep['repetition']}: {rep['all_pairs']['reachable']}/{rep['all_pairs']['pairs']} pairs, "
            f"{len(rep['flows'])} flows, {lost} packets lost, worst loss window {worst} ms, "
            f"{sum(1 for e in rep['events'] if e['kind'].startswith('port_'))} reroutes"
        )
    print(f"results: {args.output}/summary.json, {args.output}/report.md")
    return 0


def emulate_up(args: argparse.Namespace) -> int:
    fabric = load_fabric(args.topology)
    try:
        scale = Scale.parse(args.scale) if args.scale else None
    except ValueError as exc:
        raise CliError(f"--scale: {exc}") from None
    daemon = _prerequisites()
    sm = SubnetManager(fabric)
    addresses = {(a.host, a.port): (a.mac_str, a.ipv4_str) for a in sm.addresses}
    ctl: ControllerProcess | None = None
    start = time.perf_counter()
    try:
        target = args.controller
        if target is None:
            ctl = ControllerProcess(args.topology.resolve(), Path(".fabriclab-state"), Path("controller.log"),
                                    "--engine", args.engine)  # fmt: skip
            ctl.of_port = int(args.openflow.rpartition(":")[2])
            ctl.api_port = int(args.api.rpartition(":")[2])
            ctl.start()
            target = ctl.openflow
            print(f"controller: REST http://{args.api}/api/v1 (log: controller.log)")
        net = MininetFabric(fabric, addresses, controller=target, scale=scale, mtu=args.mtu)
        try:
            net.start()
            print(f"fabric: {fabric.summary()}; Mininet up in {time.perf_counter() - start:.1f} s")
            if ctl is not None:
                ctl.ready(len(fabric.switches))
                print(f"tables installed on every switch at {time.perf_counter() - start:.1f} s")
            pairs = check_all_pairs(net.endpoints())
            ok = sum(pairs.values())
            print(f"all pairs: {ok}/{len(pairs)} reachable, verified at {time.perf_counter() - start:.1f} s")
            if args.no_cli or not sys.stdin.isatty():
                _wait_for_signal()
            else:
                from mininet.cli import CLI  # noqa: PLC0415

                CLI(net.net)
        finally:
            net.stop()
    except EmulationError as exc:
        raise CliError(str(exc)) from None
    finally:
        if ctl is not None and ctl.proc is not None:
            ctl.stop()
        daemon.stop_if_started()
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("running; Ctrl-C or SIGTERM to stop")
    while not stop.wait(0.5):
        pass


__all__ = ["register"]
