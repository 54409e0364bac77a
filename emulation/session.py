"""`fabriclab emulate up` as a library: a topology on Mininet with its controller, verified, then served.

Realises the fabric (userspace OVS), starts the controller as its own process (or uses a running one),
waits until every switch holds its tables, checks that every host reaches every other (raw frames to each
MAC, all pairs at once), serves the emulator's REST API (faults, summary) and then either runs Mininet's
CLI (with a `fault` command) or waits for a signal.  Teardown removes only what it created, on any exit.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.formats.qosload import load_policy
from controller.httpguard import BackgroundServer, page_origins, serve_in_thread
from controller.rest.client import ControllerClient
from controller.sm.manager import SubnetManager
from emulation import ccrun, runfile
from emulation.api import FaultNotApplied
from emulation.cluster import ClusterFabric
from emulation.controlproc import ControllerProcess
from emulation.ecnmark import EcnMarker
from emulation.lifecycle import deferred, raise_if_stopped
from emulation.mesh import check_all_pairs
from emulation.metrics import HeadroomSource, SwitchPort, emulator_registry
from emulation.mnfabric import EmulationError, MininetFabric, Scale
from emulation.sharded import ShardedFabric
from topologies.model import Fabric
from topologies.tiers import Tiers
from traffic.dcqcn import DcqcnParams

Address = tuple[str, int]


#: `emulate up --cc dcqcn`: the phantom queue's bound, as the interface's default queue of 1,000 frames.
UP_BUFFER_BYTES = 1000 * 1514


@dataclass(frozen=True)
class UpOptions:
    """Everything `emulate up` needs, validated by the CLI before anything is built."""

    topology: Path
    engine: str = "ftree"
    scale: Scale | None = None
    #: A running controller (`tcp:HOST:PORT`) instead of one started here.
    controller: str | None = None
    #: That controller's REST address, to wait until it programmed every switch.
    controller_api: Address | None = None
    api: Address = ("127.0.0.1", 8080)
    openflow: Address = ("127.0.0.1", 6653)
    emu_api: Address = ("127.0.0.1", 8081)
    mtu: int = 1500
    interactive: bool = False
    ready_timeout_s: float = 120.0
    token: str | None = None
    #: Node names `{prefix}s0`, `{prefix}h3`, ... instead of the topology's (see `MininetFabric`).
    name_prefix: str = ""
    #: Routing-policy options for the controller this starts (`--policy adaptive --threshold 0.7 ...`).
    policy_args: tuple[str, ...] = ()
    #: QoS policy file: for the controller this starts, and queues on every switch port (emulation.qosqueues).
    qos: Path | None = None
    #: Switches on this many ovs-vswitchd instances (`emulation.shards`); 1: the system's OVS.
    shards: int = 1
    #: Cables between shards: "veth" or "vxlan".
    crossing: str = "veth"
    #: Cables between two switches of one shard: "patch", "veth" or "auto" (patch unless shaped).
    shard_cables: str = "auto"
    #: What a switch port is to ovs-vswitchd: "system", "afxdp" or "auto" (`emulation.fastports`).
    ports: str = "system"
    #: `--cc dcqcn`: ECN marking with this profile at every shaped switch egress (`emulation.ccrun`).
    dcqcn: DcqcnParams | None = None
    #: `--dask ADDRESS`: shards on the Dask workers with the `fabriclab-emu` resource (`emulation.cluster`).
    dask: str | None = None
    #: The address the workers dial the controller at (default: this machine's route to the scheduler).
    openflow_advertise: str | None = None


@contextlib.contextmanager
def _carried_out(target: str) -> Iterator[None]:
    """A fault the fabric failed to carry out (a command failed, a machine gone) as `FaultNotApplied`."""
    try:
        yield
    except (EmulationError, subprocess.CalledProcessError, OSError) as exc:
        raise FaultNotApplied(f"{target}: {exc}") from None


def apply_fault(net: MininetFabric | ClusterFabric, action: str, target: str) -> str:
    """One fault on the running fabric; returns what was done, with the time (for the user's record)."""
    if action in ("link_down", "link_up"):
        node, _, port = target.rpartition(":")
        if node not in net.fabric.nodes or not port.isdigit():
            raise ValueError(f"{target!r}: expected NODE:PORT")
        with _carried_out(target):
            intf = net.set_link(node, int(port), up=action == "link_up")
        what = f"{action} {target} ({intf})"
    elif action in ("switch_down", "switch_up"):
        if target not in net.fabric.nodes or not net.fabric.nodes[target].is_switch:
            raise ValueError(f"{target!r}: not a switch")
        with _carried_out(target):
            net.set_switch(target, up=action == "switch_up")
        what = f"{action} {target}"
    else:
        raise ValueError(f"unknown fault {action!r} (link_down, link_up, switch_down, switch_up)")
    return f"{time.strftime('%H:%M:%S')} {what}"


def interactive(net: MininetFabric) -> None:
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
            except (ValueError, KeyError, OSError, FaultNotApplied) as exc:
                print(f"*** {exc}")

    FabricCLI(net.net)


def switch_ports(net: MininetFabric | ClusterFabric) -> list[SwitchPort]:
    """Every cabled switch port with its interface in this namespace (what the emulator's metrics read);
    none for a fabric on other machines."""
    if isinstance(net, ClusterFabric):
        return []
    tiers = Tiers(net.fabric)
    return [
        SwitchPort(ref.node, ref.port, tiers.of(ref.node), net.intf_name(ref.node, ref.port))
        for ref in sorted(net.fabric.port_map)
        if net.fabric.nodes[ref.node].is_switch
    ]


def serve_faults(
    net: MininetFabric | ClusterFabric,
    summary: dict[str, Any],
    address: Address,
    token: str | None,
    controller_api: Address | None = None,
    headroom: Sequence[HeadroomSource] = (),
) -> BackgroundServer:
    """The emulator's REST API (fault injection, summary, metrics) on a thread.  The live view served by
    the controller at `controller_api` may call it from a browser.  `headroom`: sources of headroom
    figures to export (see `emulation.metrics.HeadroomSource`)."""
    from emulation.api import create_app  # noqa: PLC0415  (FastAPI only when serving)

    registry, _ = emulator_registry(switch_ports(net), headroom, net.switch_daemons())
    origins = page_origins(*controller_api) if controller_api is not None else []
    counters = net.qos_counters if isinstance(net, MininetFabric) and net.qos is not None else None
    app = create_app(lambda action, target: apply_fault(net, action, target), summary, token, address,
                     registry, origins, qos_counters=counters)  # fmt: skip
    return serve_in_thread(app, address, "emulator-api", "--emu-api")


def wait_for_signal(say: Callable[[str], None], check: Callable[[], None] | None = None) -> None:
    """Until a signal (`Stopped`) or, with `check`, until it raises (a cluster's lost worker)."""
    raise_if_stopped()
    say("running; Ctrl-C or SIGTERM to stop")
    while True:  # ends with Stopped from the signal handler (see emulation.lifecycle)
        time.sleep(0.5)
        raise_if_stopped()
        if check is not None:
            check()


def run_prefix(options: UpOptions) -> str:
    """The run's name prefix: the user's, else (built without Mininet's shells) a fresh one, `e` and three
    random letters/digits, so that `emulate clean` can tell this run's names from everyone else's."""
    if options.name_prefix or options.interactive:
        return options.name_prefix
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "e" + "".join(secrets.choice(alphabet) for _ in range(3))


def run_up(fabric: Fabric, options: UpOptions, say: Callable[[str], None]) -> None:
    """Bring the fabric up, verify it, serve it until stopped; tear down whatever was built on any exit.
    Raises `EmulationError`, `WaitTimeout` or `Stopped` (after teardown).

    The run is recorded (`emulation.runfile`) before anything is built and the record dropped after the
    teardown, so a run killed with SIGKILL leaves a record `fabriclab emulate clean` acts on."""
    addresses = SubnetManager(fabric).addresses.as_strings()
    ctl: ControllerProcess | None = None
    server: BackgroundServer | None = None
    markers: dict[str, EcnMarker] = {}
    start = time.perf_counter()
    prefix = run_prefix(options)
    qos = load_policy(options.qos, fabric) if options.qos is not None else None
    kwargs: dict[str, Any] = {"scale": options.scale, "mtu": options.mtu, "name_prefix": prefix, "qos": qos,
                              "ports": options.ports}  # fmt: skip
    net: MininetFabric | ClusterFabric
    if options.dask is not None:
        net = ClusterFabric(fabric, addresses, options.shards, options.dask, options.openflow_advertise,
                            prefix, options.mtu, options.shard_cables, scale=options.scale,
                            qos=qos)  # fmt: skip
    elif options.shards > 1 or options.shard_cables == "patch":
        net = ShardedFabric(fabric, addresses, options.shards, options.crossing,
                                           options.shard_cables, **kwargs)  # fmt: skip
    else:
        net = MininetFabric(fabric, addresses, shells=options.interactive, **kwargs)
    # Recorded before anything is built (a sharded fabric builds its control network first).
    runfile.write(runfile.RunRecord(prefix, net.node_names, net.group, os.getpid(), None, time.time()))
    try:
        target = options.controller
        if target is None:
            (api_host, api_port), (of_host, of_port) = options.api, options.openflow
            if isinstance(net, ShardedFabric | ClusterFabric):  # the shards reach it on their network
                of_host = net.prepare_control()
            scaled = ["--capacity-scale", str(options.scale)] if options.scale is not None else []
            ctl = ControllerProcess(options.topology.resolve(), Path(".fabriclab-state"),
                                    Path("controller.log"), "--engine", options.engine, *scaled,
                                    *options.policy_args,
                                    *(["--qos", str(options.qos.resolve())] if options.qos else []),
                                    host=api_host, of_port=of_port, api_port=api_port,
                                    of_host=of_host)  # fmt: skip
            ctl.start()
            target = ctl.openflow
            say(
                f"controller: REST http://{api_host}:{api_port}/api/v1, "
                f"live view http://{api_host}:{api_port}/ (log: controller.log)"
            )
        net.controller = target
        controller_pid = ctl.proc.pid if ctl is not None and ctl.proc is not None else None
        runfile.write(runfile.RunRecord(prefix, net.node_names, net.group, os.getpid(), controller_pid,
                                        time.time()))  # fmt: skip
        try:
            if net.shells:  # Mininet half-way through its build cannot be torn down cleanly
                with deferred():
                    net.start()
            else:  # lightnet can: a signal stops the build where it is, teardown removes by name
                net.start()
            raise_if_stopped()
            built = "sharded fabric" if isinstance(net, ShardedFabric | ClusterFabric) else "Mininet"
            say(f"fabric: {fabric.summary()}; {built} up in {time.perf_counter() - start:.1f} s")
            if isinstance(net, ShardedFabric | ClusterFabric):
                say(net.describe())
            if options.ports != "system" and isinstance(net, MininetFabric):
                say(f"switch ports: {net.port_choice.describe()}")
            client = ctl or (ControllerClient(*options.controller_api) if options.controller_api else None)
            if client is not None:
                client.ready(len(fabric.switches), timeout_s=options.ready_timeout_s)
                say(f"tables installed on every switch at {time.perf_counter() - start:.1f} s")
            raise_if_stopped()
            if isinstance(net, ClusterFabric):  # sent and received where the hosts are
                pairs = net.check_all_pairs()
            else:
                pairs = check_all_pairs(net.endpoints())
            ok = sum(pairs.values())
            say(f"all pairs: {ok}/{len(pairs)} reachable, verified at {time.perf_counter() - start:.1f} s")
            summary = {
                "fabric": fabric.summary(),
                "switches": len(fabric.switches),
                "hosts": len(fabric.hosts),
                "pairs": len(pairs),
                "pairs_reachable": ok,
                "verified_s": round(time.perf_counter() - start, 3),
            }
            if options.dcqcn is not None and options.scale is not None and isinstance(net, MininetFabric):
                p = options.dcqcn
                markers = ccrun.attach_markers(
                    fabric, net, options.scale, p, max(p.kmax_bytes, UP_BUFFER_BYTES)
                )
                say(f"ECN marking on {len(markers)} switch egresses (DCQCN: Kmin {p.kmin_bytes} B, Kmax "
                    f"{p.kmax_bytes} B, Pmax {p.pmax:g})")  # fmt: skip
            server = serve_faults(net, summary, options.emu_api, options.token,
                                  options.controller_api if options.controller else options.api)  # fmt: skip
            host, port = options.emu_api
            say(
                f'faults: POST http://{host}:{port}/api/v1/faults (e.g. {{"action": "link_down", '
                f'"target": "leaf1:3"}}); summary: GET http://{host}:{port}/api/v1/emulation; '
                f"metrics: http://{host}:{port}/metrics"
            )
            if options.interactive and isinstance(net, MininetFabric):
                interactive(net)
            else:
                wait_for_signal(say, net.check if isinstance(net, ClusterFabric) else None)
        finally:
            if server is not None:
                server.stop()
            ccrun.detach_markers(markers)
            stopping = time.perf_counter()
            net.stop()
            say(f"fabric removed in {time.perf_counter() - stopping:.1f} s")
    finally:
        net.stop()  # (done already unless the controller failed to start after the shards' network)
        if ctl is not None and ctl.proc is not None:
            ctl.stop()
        runfile.discard(prefix)


__all__ = [
    "UpOptions",
    "apply_fault",
    "interactive",
    "run_prefix",
    "run_up",
    "serve_faults",
    "switch_ports",
    "wait_for_signal",
]
