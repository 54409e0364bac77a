"""`fabriclab emulate up|clean|calibrate`: the emulator's own commands (scenarios: `fabriclab.cli.scenario`).

`emulate up` realises a topology on Mininet (userspace OVS), starts the controller as its own process (or
uses a running one with `--controller`), waits until every switch holds its tables, checks that every host
reaches every other (raw frames to each MAC, all pairs at once) and prints the times; then the Mininet CLI,
or with `--no-cli` it waits for Ctrl-C/SIGTERM.  Teardown removes only what it created.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from controller.formats.partitions_file import load_partitions
from controller.formats.qosload import load_policy
from controller.httpguard import TOKEN_ENV, ListenError, token_from_env
from controller.rest.client import WaitTimeout
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import SubnetManager, policy_problem
from controller.sm.policies import PolicyChoice
from emulation import calibrate as calibration
from emulation import fastports
from emulation.ecnmark import ecn_marking_available
from emulation.fastports import PORTS
from emulation.lifecycle import Stopped, stop_on_signals
from emulation.mnfabric import EmulationError, MininetFabric, Scale, mininet_available
from emulation.ovs import OvsDaemon
from emulation.session import UpOptions, run_up
from emulation.shards import CABLES, CROSSINGS, uses_patch
from emulation.shards import plan as shard_plan
from fabriclab.cli.common import (
    CC_CHOICES,
    CliError,
    check_bindable,
    check_distinct,
    check_output_file,
    endpoint,
    integer,
    load_fabric,
)
from fabriclab.cli.policy import add_policy_options, choose, option_error, policy_argv, policy_overrides
from labspec.ccspec import dcqcn_params
from labspec.scenario import nic_gbps

T = TypeVar("T")


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
    up.add_argument(
        "--qos",
        type=Path,
        metavar="FILE",
        help="QoS policy (docs/qos.md) for the controller and every switch port",
    )
    up.add_argument("--emu-api", default="127.0.0.1:8081", help="the emulator's fault-injection REST API")
    up.add_argument(
        "--partitions",
        type=Path,
        metavar="FILE",
        help="partitions the controller this starts enforces (OpenSM partitions.conf or YAML)",
    )
    up.add_argument("--no-cli", action="store_true", help="no Mininet CLI: wait for Ctrl-C or SIGTERM")
    up.add_argument("--cc", choices=CC_CHOICES, default="none",
                    help="dcqcn: ECN marking (DCQCN's profile) at every shaped switch egress "
                    "(needs --scale)")  # fmt: skip
    up.add_argument(
        "--name-prefix",
        default="",
        metavar="P",
        help="name bridges, interfaces and hosts P s0, P h3, ... (to run beside another fabric of the same "
        "topology in one OVS; up to 6 lowercase letters/digits, starting with a letter)",
    )
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds to wait for the controller to program every switch (default 120)",
    )
    up.add_argument(
        "--shards",
        type=integer(1, 64),
        default=1,
        metavar="N",
        help="switches on N ovs-vswitchd instances, one network namespace each (k=16 needs about 8; "
        "docs/sharding.md); implies --no-cli",
    )
    up.add_argument(
        "--crossing",
        choices=CROSSINGS,
        default="veth",
        help="cables between shards: veth (one machine) or VXLAN tunnels over an underlay, as between "
        "machines (default veth)",
    )
    up.add_argument(
        "--shard-cables",
        choices=CABLES,
        default="auto",
        help="cables between two switches of one shard: OVS patch ports (a packet crosses the shard in "
        "one datapath pass; cannot be shaped) or veths; default auto: patch unless --scale",
    )
    up.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="place the --shards on the Dask workers started with --resources fabriclab-emu=1 (one "
        "machine each, VXLAN between them; docs/sharding.md), e.g. tcp://10.0.0.1:8786",
    )
    up.add_argument(
        "--openflow-advertise",
        metavar="HOST",
        help="with --dask: the address the workers reach the controller at (it listens there; default: "
        "this machine's address towards the scheduler)",
    )
    _add_ports_option(up)
    add_policy_options(up)
    up.set_defaults(handler=emulate_up)
    clean = sub.add_parser(
        "clean",
        help="remove what emulation runs that are gone (killed, crashed) left behind",
        description="Each `emulate up` records its node names under /run/fabriclab/runs before it builds; "
        "this removes the bridges, veths, host namespaces and controller of every recorded run whose "
        "process is gone, and nothing else (never `mn -c`).  With --prefix, only that run; if it left "
        "no record, the names PREFIX s<i> / PREFIX h<i> present.",
    )
    clean.add_argument("--prefix", metavar="P", help="only the run with this name prefix")
    clean.set_defaults(handler=emulate_clean)
    cal = sub.add_parser(
        "calibrate",
        help="measure the fabric's clean capacity on this machine (pkt/s per host and total)",
        description="Bring the topology up with its controller and raise a UDP load (every host to the host "
        "half the fabric away) step by step: the highest rate per host that loses <= 0.1 %% is the "
        "emulator's clean capacity here.  Scenario runs warn when they ask for more; tests size their "
        "traffic from it.",
    )
    cal.add_argument("topology", type=Path)
    cal.add_argument("--scale", help="link speed scaling, as for `emulate up` (default: unshaped)")
    cal.add_argument(
        "-o", "--output", type=Path, help="JSON file (default ~/.cache/fabriclab/calibration-NAME.json)"
    )
    cal.add_argument(
        "--step-s", type=float, default=2.0, metavar="S", help="seconds per rate step (default 2)"
    )
    cal.add_argument(
        "--shards",
        type=integer(1, 64),
        default=1,
        metavar="N",
        help="calibrate the fabric as `emulate up --shards N` builds it (default 1: unsharded)",
    )
    cal.add_argument(
        "--shard-cables",
        choices=CABLES,
        default="auto",
        help="cables between two switches of one shard, as for `emulate up`; `patch` with --shards 1 puts "
        "the whole fabric on one shard with patch cables",
    )
    _add_ports_option(cal)
    cal.set_defaults(handler=emulate_calibrate)


def _add_ports_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ports",
        choices=PORTS,
        default="system",
        help="what a switch port is to ovs-vswitchd: a packet socket (system, the default), an AF_XDP "
        "socket (afxdp: about 4x the clean capacity, unshaped links only; docs/emulation.md), or auto "
        "(afxdp where the links are unshaped and this Open vSwitch offers it)",
    )


def _up_marking(args: argparse.Namespace, fabric: Any, scale: Scale | None) -> Any:
    """`emulate up --cc dcqcn`: the DCQCN marking profile of every shaped switch egress (None: none)."""
    if args.cc != "dcqcn":
        return None
    if scale is None or args.shards > 1 or args.qos is not None:
        raise CliError("--cc dcqcn: needs --scale, and works without --shards and --qos (docs/congestion.md)")
    refused = ecn_marking_available()
    if refused:
        raise CliError(f"--cc dcqcn: {refused}")
    speed = next((s for h in fabric.hosts if (s := nic_gbps(fabric, h.name))), None)
    return dcqcn_params(None, speed or 1.0, scale.factor)


#: A day: longer is not waiting for a controller, it is hanging.
MAX_READY_TIMEOUT_S = 86400


def prerequisites() -> OvsDaemon:
    reason = mininet_available()
    if reason:
        raise CliError(f"emulation unavailable: {reason}")
    daemon = OvsDaemon()
    daemon.ensure_running()
    return daemon


def emulated(work: Callable[[], T], not_ready: str) -> T | None:
    """Run `work` with Open vSwitch started if it was not (and stopped again after), SIGTERM and Ctrl-C
    turned into a clean stop: its result, or None when it was stopped (the caller exits 130)."""
    stop_on_signals()  # first: a signal from here on stops cleanly, OVS included
    daemon: OvsDaemon | None = None
    try:
        daemon = prerequisites()
        return work()
    except WaitTimeout as exc:
        raise CliError(f"{not_ready}: {exc}") from None
    except Stopped:
        print("stopped: the fabric and controller were torn down", file=sys.stderr)
        return None
    finally:
        if daemon is not None:
            daemon.stop_if_started()


def emulate_calibrate(args: argparse.Namespace) -> int:
    fabric = load_fabric(args.topology)
    if not 0.5 <= args.step_s <= 60:
        raise CliError(f"--step-s: between 0.5 and 60 seconds, not {args.step_s:g}")
    try:
        scale = Scale.parse(args.scale) if args.scale else None
        if scale is not None:
            MininetFabric(fabric, {}, scale=scale)  # a scale HTB cannot shape fails before anything runs
    except (ValueError, EmulationError) as exc:
        raise CliError(f"--scale: {exc}") from None
    try:
        uses_patch(args.shard_cables, shaped=scale is not None)
        if args.shards > 1:
            shard_plan(fabric, args.shards)
    except ValueError as exc:
        raise CliError(f"--shard-cables/--shards: {exc}") from None
    try:
        fastports.check(args.ports, shaped=scale is not None, qos=False)
    except ValueError as exc:
        raise CliError(f"--ports {args.ports}: {exc}") from None
    sharded = args.shards > 1 or args.shard_cables == "patch"
    output = args.output or calibration.default_path(
        fabric.name, args.shards, args.shard_cables if sharded else None, args.ports
    )
    check_output_file(output, "--output")  # before a minute of measuring, not after

    def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="fabriclab-calibrate-") as work:
            return calibration.calibrate(
                args.topology.resolve(), fabric, Path(work), scale, args.step_s, progress=print,
                shards=args.shards, cables=args.shard_cables, ports=args.ports,
            )  # fmt: skip

    result = emulated(run, "controller not ready")
    if result is None:
        return 130
    try:
        calibration.save(result, output)
    except OSError as exc:
        print(json.dumps(result, indent=2))
        raise CliError(f"--output: cannot write {output} ({exc.strerror or exc}); result above") from None
    print(
        f"capacity of {fabric.name} here: {result['per_host_pps']:g} pkt/s per host, {result['total_pps']:g} "
        f"pkt/s in total ({result['senders']} senders, <= {100 * result['loss_target']:g} % loss); "
        f"load average {result['machine']['load_avg_before'][0]:g}"
    )
    print(f"wrote {output}")
    return 0


def emulate_clean(args: argparse.Namespace) -> int:
    from emulation.cleanup import clean  # noqa: PLC0415

    if args.prefix is not None and not re.fullmatch(r"[a-z][a-z0-9]{0,5}", args.prefix):
        raise CliError(f"--prefix: {args.prefix!r}: up to 6 lowercase letters and digits, a letter first")
    reason = mininet_available()
    if reason:
        raise CliError(f"emulation unavailable: {reason}")
    done = clean(args.prefix)
    for run in done.running:
        print(f"still running, left alone: {run}")
    for pid in done.controllers:
        print(f"stopped controller {pid}")
    print(
        f"cleaned {len(done.runs)} run(s)"
        + (f" ({', '.join(done.runs)})" if done.runs else "")
        + f": {len(done.removed)} object(s) removed"
    )
    return 0


def dask_address(value: str, advertise: str | None) -> str:
    """`--dask` as tcp://HOST:PORT (a bare HOST:PORT is taken as TCP); `--openflow-advertise` checked."""
    address = value if "://" in value else f"tcp://{value}"
    if not re.fullmatch(r"tcp://[A-Za-z0-9.\-]+:\d{1,5}", address):
        raise CliError(f"--dask: expected tcp://HOST:PORT of a Dask scheduler, got {value!r}")
    if advertise is not None:
        try:
            ipaddress.ip_address(advertise)
        except ValueError:
            raise CliError(f"--openflow-advertise: expected the IP address the workers reach this machine "
                           f"at, got {advertise!r}") from None  # fmt: skip
    return address


def _check_dask(args: argparse.Namespace) -> None:
    """What `--dask` cannot be combined with (yet), each named."""
    args.dask = dask_address(args.dask, args.openflow_advertise)
    refused = {
        "--controller": "the workers' bridges dial the controller this starts",
        "--cc dcqcn": "ECN marking runs on one machine only" if args.cc != "none" else None,
        "--ports afxdp": "AF_XDP ports run on one machine only" if args.ports == "afxdp" else None,
    }
    if args.controller is None:
        refused.pop("--controller")
    for option, why in refused.items():
        if why is not None:
            raise CliError(f"{option}: not with --dask ({why}; docs/sharding.md)")
    try:
        shard_plan(load_fabric(args.topology), args.shards)
    except ValueError as exc:
        raise CliError(f"--shards: {exc}") from None


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
    if args.name_prefix and not re.fullmatch(r"[a-z][a-z0-9]{0,5}", args.name_prefix):
        raise CliError(
            f"--name-prefix: {args.name_prefix!r}: up to 6 lowercase letters and digits, a letter first"
        )
    api, openflow = endpoint(args.api, "--api"), endpoint(args.openflow, "--openflow")
    overrides = policy_overrides(args)
    if overrides and args.controller is not None:
        raise CliError("--policy and its options: only for a controller this starts (use its REST API)")
    listeners = [("--emu-api", emu_api)]
    if args.controller is None:
        listeners += [("--openflow", openflow), ("--api", api)]
        if openflow[0] != api[0]:
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
    partition_args: tuple[str, ...] = ()
    if args.partitions is not None:
        if args.controller is not None:
            raise CliError("--partitions: only for the controller this starts (give it to that controller)")
        load_partitions(args.partitions, fabric)  # a bad file fails (exit 2) before anything is built
        partition_args = ("--partitions", str(args.partitions.resolve()))
    if args.controller is None:
        SubnetManager(fabric).registry.create(args.engine)  # an unknown engine fails before building
        choice = choose(PolicyChoice(), overrides)
        forwarding = ForwardingOptions(policy=choice.name, classes=choice.classes)
        problem = policy_problem(fabric, args.engine, forwarding)
        if problem is not None:
            raise option_error(problem)
    if args.qos is None and os.environ.get("FABRICLAB_QOS"):
        args.qos = Path(os.environ["FABRICLAB_QOS"])  # docker compose passes it through when set
    if args.qos is not None:
        if scale is None:
            raise CliError("--qos: needs --scale (the queues share shaped links)")
        load_policy(args.qos, fabric)  # a bad policy fails (exit 2, line and field) before anything is built
    if args.dask is not None:
        _check_dask(args)
    elif args.openflow_advertise is not None:
        raise CliError("--openflow-advertise: only with --dask (the workers dial the controller there)")
    sharded = args.shards > 1 or args.shard_cables == "patch" or args.dask is not None
    if sharded and args.dask is None:
        if args.controller is not None:
            raise CliError(
                "--shards/--shard-cables patch: only with the controller this starts (it listens on the "
                "shards' network)"
            )
        try:
            shard_plan(fabric, args.shards)
        except ValueError as exc:
            raise CliError(f"--shards: {exc}") from None
        try:
            uses_patch(args.shard_cables, shaped=scale is not None)
        except ValueError as exc:
            raise CliError(f"--shard-cables {args.shard_cables}: {exc}") from None
    elif args.crossing != "veth" and args.dask is None:
        raise CliError("--crossing: only with --shards 2 or more")
    elif args.shard_cables != "auto":
        raise CliError("--shard-cables: veth only with --shards 2 or more")
    try:
        fastports.check(args.ports, shaped=scale is not None, qos=args.qos is not None)
    except ValueError as exc:
        raise CliError(f"--ports {args.ports}: {exc}") from None
    marking = _up_marking(args, fabric, scale)
    check_bindable(listeners)
    try:
        token = token_from_env(os.environ.get(TOKEN_ENV))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    options = UpOptions(
        topology=args.topology,
        engine=args.engine,
        scale=scale,
        controller=args.controller,
        controller_api=remote_api,
        api=api,
        openflow=openflow,
        emu_api=emu_api,
        mtu=args.mtu,
        interactive=not args.no_cli and not sharded and args.ports != "afxdp" and sys.stdin.isatty(),
        ready_timeout_s=args.ready_timeout,
        token=token,
        name_prefix=args.name_prefix,
        policy_args=(*policy_argv(args), *partition_args),
        qos=args.qos,
        shards=args.shards,
        crossing=args.crossing,
        shard_cables=args.shard_cables,
        ports=args.ports,
        dcqcn=marking,
        dask=args.dask,
        openflow_advertise=args.openflow_advertise,
    )
    stop_on_signals()  # first: a signal from here on stops cleanly, OVS included
    daemon: OvsDaemon | None = None
    try:
        if args.dask is None:  # with --dask the switches run on the workers' machines, not here
            daemon = prerequisites()
        run_up(fabric, options, lambda line: print(line, flush=True))
    except EmulationError as exc:
        raise CliError(str(exc)) from None
    except ListenError as exc:
        raise CliError(str(exc)) from None
    except WaitTimeout as exc:
        where = "see controller.log" if args.controller is None else f"is it running at {args.controller}?"
        raise CliError(f"controller not ready ({where}): {exc}") from None
    except Stopped:
        print("stopped: torn down")
    finally:
        if daemon is not None:
            daemon.stop_if_started()
    return 0


__all__ = ["register"]
