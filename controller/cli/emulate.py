"""`fabriclab emulate up` and `fabriclab scenario check|run`: the emulator's commands.

`emulate up` realises a topology on Mininet (userspace OVS), starts the controller as its own process (or
uses a running one with `--controller`), waits until every switch holds its tables, checks that every host
reaches every other (raw frames to each MAC, all pairs at once) and prints the times; then the Mininet CLI,
or with `--no-cli` it waits for Ctrl-C/SIGTERM.  Teardown removes only what it created.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controller.cli.common import CliError, check_bindable, check_distinct, integer, load_fabric
from controller.cli.serve import endpoint
from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerClient, ControllerProcess, WaitTimeout
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
    up.add_argument(
        "--controller-api",
        help="REST address (HOST:PORT) of the --controller: wait until it has programmed every switch",
    )
    up.add_argument("--api", default="127.0.0.1:8080", help="REST address of the controller this starts")
    up.add_argument(
        "--openflow", default="127.0.0.1:6653", help="OpenFlow address of the controller this starts"
    )
    up.add_argument(
        "--mtu", type=integer(576, 9216), default=1500, help="interface MTU, 576..9216 (default 1500)"
    )
    up.add_argument("--emu-api", default="127.0.0.1:8081", help="the emulator's fault-injection REST API")
    up.add_argument("--no-cli", action="store_true", help="no Mininet CLI: wait for Ctrl-C or SIGTERM")
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds to wait for the controller to program every switch (default 120)",
    )
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


#: A day: longer is not waiting for a controller, it is hanging.
MAX_READY_TIMEOUT_S = 86400


class Stopped(Exception):
    """SIGINT/SIGTERM arrived: unwind through every `finally`, so what was built is torn down."""


_signals = {"defer": False, "pending": False}


def _stop_on_signals() -> None:
    """SIGINT/SIGTERM raise `Stopped` — except inside `_deferred()` (Mininet half-way through building its
    network cannot be torn down cleanly), where they are remembered and raised at its end."""

    def stop(*_: object) -> None:
        if _signals["defer"]:
            _signals["pending"] = True
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not interrupt the teardown
        raise Stopped

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


@contextlib.contextmanager
def _deferred() -> Iterator[None]:
    _signals["defer"] = True
    try:
        yield
    finally:
        _signals["defer"] = False
    if _signals["pending"]:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped


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
    try:  # a results folder that cannot be written fails now, not after the whole run
        args.output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"-o/--output: cannot create results folder {args.output}: {exc.strerror}") from None
    daemon = _prerequisites()
    _stop_on_signals()
    try:
        summary = run_scenario(scenario, args.output, console_progress())
    except WaitTimeout as exc:
        raise CliError(f"controller not ready (see controller.log under {args.output}): {exc}") from None
    except Stopped:
        print("stopped: the fabric and controller were torn down", file=sys.stderr)
        return 130
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
    emu_api = endpoint(args.emu_api, "--emu-api")  # bad input fails before anything is built
    remote_api = endpoint(args.controller_api, "--controller-api") if args.controller_api else None
    if not (math.isfinite(args.ready_timeout) and 0 < args.ready_timeout <= MAX_READY_TIMEOUT_S):
        raise CliError(
            f"--ready-timeout: must be a positive number of seconds, not {args.ready_timeout:g} "
            f"(at most {MAX_READY_TIMEOUT_S})"
        )
    if remote_api is not None and args.controller is None:
        raise CliError("--controller-api: only with --controller (a controller this starts is waited for)")
    listeners = [("--emu-api", emu_api)]
    if args.controller is None:
        listeners += [
            ("--openflow", endpoint(args.openflow, "--openflow")),
            ("--api", endpoint(args.api, "--api")),
        ]
        if listeners[1][1][0] != listeners[2][1][0]:
            raise CliError("--openflow and --api: the controller this starts listens on one host")
    else:  # what MininetFabric (Mininet's RemoteController) accepts
        proto, *address = args.controller.split(":")
        if proto != "tcp" or len(address) != 2:
            raise CliError(f"--controller: expected tcp:HOST:PORT, got {args.controller!r}")
        endpoint(":".join(address), "--controller")
    check_distinct(listeners)
    try:
        scale = Scale.parse(args.scale) if args.scale else None
        if scale is not None:
            scale.check(fabric)  # the same check a scenario gets, before anything is started
    except ValueError as exc:
        raise CliError(f"--scale: {exc}") from None
    sm = SubnetManager(fabric)
    if args.controller is None:
        sm.registry.create(args.engine)  # an unknown engine fails here, not in the controller it starts
    check_bindable(listeners)
    daemon = _prerequisites()
    _stop_on_signals()
    addresses = sm.addresses.as_strings()
    ctl: ControllerProcess | None = None
    start = time.perf_counter()
    try:
        target = args.controller
        if target is None:
            of_host, of_port = endpoint(args.openflow, "--openflow")
            api_host, api_port = endpoint(args.api, "--api")
            ctl = ControllerProcess(args.topology.resolve(), Path(".fabriclab-state"), Path("controller.log"),
                                    "--engine", args.engine, host=api_host, of_port=of_port,
                                    api_port=api_port)  # fmt: skip
            ctl.start()
            target = ctl.openflow
            print(f"controller: REST http://{args.api}/api/v1 (log: controller.log)")
        net = MininetFabric(fabric, addresses, controller=target, scale=scale, mtu=args.mtu)
        try:
            with _deferred():
                net.start()
            print(f"fabric: {fabric.summary()}; Mininet up in {time.perf_counter() - start:.1f} s")
            client = ctl if ctl is not None else ControllerClient(*remote_api) if remote_api else None
            if client is not None:
                client.ready(len(fabric.switches), timeout_s=args.ready_timeout)
                print(f"tables installed on every switch at {time.perf_counter() - start:.1f} s")
            pairs = check_all_pairs(net.endpoints())
            ok = sum(pairs.values())
            print(f"all pairs: {ok}/{len(pairs)} reachable, verified at {time.perf_counter() - start:.1f} s")
            summary = {
                "fabric": fabric.summary(),
                "switches": len(fabric.switches),
                "hosts": len(fabric.hosts),
                "pairs": len(pairs),
                "pairs_reachable": ok,
                "verified_s": round(time.perf_counter() - start, 3),
            }
            server = _serve_faults(net, summary, emu_api)
            print(
                f'faults: POST http://{args.emu_api}/api/v1/faults (e.g. {{"action": "link_down", '
                f'"target": "leaf1:3"}}); summary: GET http://{args.emu_api}/api/v1/emulation',
                flush=True,
            )
            if args.no_cli or not sys.stdin.isatty():
                _wait_for_signal()
            else:
                _interactive(net)
        finally:
            if "server" in locals():
                server.should_exit = True
            net.stop()
    except EmulationError as exc:
        raise CliError(str(exc)) from None
    except WaitTimeout as exc:
        where = "see controller.log" if ctl is not None else f"is it running at {args.controller}?"
        raise CliError(f"controller not ready ({where}): {exc}") from None
    except Stopped:
        print("stopped: torn down")
    finally:
        if ctl is not None and ctl.proc is not None:
            ctl.stop()
        daemon.stop_if_started()
    return 0


def apply_fault(net: MininetFabric, action: str, target: str) -> str:
    """One fault on the running fabric; returns what was done, with the time (for the user's record)."""
    if action in ("link_down", "link_up"):
        node, _, port = target.rpartition(":")
        if node not in net.fabric.nodes or not port.isdigit():
            raise ValueError(f"{target!r}: expected NODE:PORT")
        intf = net.set_link(node, int(port), up=action == "link_up")
        what = f"{action} {target} ({intf})"
    elif action in ("switch_down", "switch_up"):
        if target not in net.fabric.nodes or not net.fabric.nodes[target].is_switch:
            raise ValueError(f"{target!r}: not a switch")
        net.set_switch(target, up=action == "switch_up")
        what = f"{action} {target}"
    else:
        raise ValueError(f"unknown fault {action!r} (link_down, link_up, switch_down, switch_up)")
    return f"{time.strftime('%H:%M:%S')} {what}"


def _interactive(net: MininetFabric) -> None:
    """Mininet's CLI plus `fault ACTION TARGET` (link_down/link_up NODE:PORT, switch_down/switch_up NAME)."""
    from mininet.cli import CLI  # noqa: PLC0415

    class FabricCLI(CLI):  # type: ignore[misc]
        def do_fault(self, line: str) -> None:
            """fault link_down|link_up NODE:PORT  or  fault switch_down|switch_up SWITCH"""
            parts = line.split()
            try:
                if len(parts) != 2:
                    raise ValueError("usage: fault ACTION TARGET")
                print(apply_fault(net, parts[0], parts[1]))
            except (ValueError, KeyError, OSError) as exc:
                print(f"*** {exc}")

    FabricCLI(net.net)


def _serve_faults(net: MininetFabric, summary: dict[str, Any], address: tuple[str, int]) -> Any:
    """The emulator's REST API (fault injection) on a thread; returns the uvicorn server to stop."""
    import os  # noqa: PLC0415

    import uvicorn  # noqa: PLC0415

    from emulation.api import create_app  # noqa: PLC0415

    host, port = address
    app = create_app(lambda action, target: apply_fault(net, action, target), summary,
                     os.environ.get("FABRICLAB_API_TOKEN") or None)  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="emulator-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:  # announce the address only once it answers
        if not thread.is_alive() or time.monotonic() > deadline:
            raise CliError(f"--emu-api: cannot listen on {host}:{port}")
        time.sleep(0.02)
    return server


def _wait_for_signal() -> None:
    print("running; Ctrl-C or SIGTERM to stop", flush=True)
    while True:  # ends with Stopped from the signal handler
        time.sleep(0.5)


__all__ = ["register"]
