"""`fabriclab controller`: the running controller — os-ken (OpenFlow) and uvicorn (REST) in one process.

os-ken 4.2 has no osken-manager and its `run_apps` ignores SIGINT, so this is the launcher: it builds the
subnet manager and service, starts the os-ken app (native threads, with `compat` fixes) and uvicorn on a
thread, then waits for SIGINT/SIGTERM itself and shuts everything down in order: stop accepting
switches, close their connections (switches keep their flows: fail_mode=secure), stop the worker, stop
REST.  Exit code 0 on a signal, 2 on bad input, 1 if a listener cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.formats.partitions_file import load_partitions
from controller.formats.qosload import load_policy
from controller.heap import Heap
from controller.sm.engines import UnknownEngine, default_registry
from controller.sm.intents import ForwardingOptions
from controller.statestore import StateError, StateStore
from fabriclab.cli.common import CliError, check_bindable, check_distinct, endpoint, load_fabric, real
from fabriclab.cli.policy import (
    add_policy_options,
    apply_policy_overrides,
    option_error,
    policy_overrides,
)
from topologies.scale import Scale

LOG = logging.getLogger("fabriclab")
TOKEN_ENV = "FABRICLAB_API_TOKEN"
#: The QoS policy file when --qos is not given (docker compose passes it through when set).
QOS_ENV = "FABRICLAB_QOS"


#: Names the controller's --partitions file when the option is not given (docker compose's .env).
PARTITIONS_ENV = "FABRICLAB_PARTITIONS"


def register(commands: Any) -> None:
    p = commands.add_parser("controller", help="run the controller (OpenFlow + REST)")
    p.add_argument("--topology", required=True, type=Path, help="declared fabric (YAML or ibnetdiscover)")
    p.add_argument("--engine", default=None, help="routing engine (default: saved state, else ftree)")
    p.add_argument(
        "--openflow", default="127.0.0.1:6653", help="OpenFlow listen address (default %(default)s)"
    )
    p.add_argument("--api", default="127.0.0.1:8080", help="REST listen address (default %(default)s)")
    p.add_argument(
        "--state-dir", type=Path, default=None, help="persist engine/options here, restore on start"
    )
    p.add_argument("--no-fast-failover", action="store_true", help="plain outputs instead of failover groups")
    p.add_argument("--multipath", action="store_true", help="legacy: the same as --policy ecmp")
    add_policy_options(p)
    p.add_argument(
        "--partitions",
        type=Path,
        default=Path(os.environ[PARTITIONS_ENV]) if os.environ.get(PARTITIONS_ENV) else None,
        metavar="FILE",
        help=f"partitions to enforce (OpenSM partitions.conf or YAML; default: ${PARTITIONS_ENV} if set, "
        "else the saved ones, else everyone full in Default=0x7fff)",
    )
    p.add_argument(
        "--lldp-interval",
        type=real(0.1, 3600, " seconds"),
        default=10.0,
        metavar="S",
        help="LLDP probe period, 0.1..3600 s (default %(default)s)",
    )
    p.add_argument(
        "--stats-interval",
        type=real(0.05, 3600, " seconds"),
        default=2.0,
        metavar="S",
        help="port counter polling period, 0.05..3600 s (default %(default)s)",
    )
    p.add_argument(
        "--capacity-scale",
        metavar="REAL=EMULATED",
        help="links run scaled, as in an emulated fabric (e.g. 400G=200M): utilisation (metrics, live view, "
        "adaptive routing) is measured against the scaled speed",
    )
    p.add_argument(
        "--qos",
        type=Path,
        metavar="FILE",
        help="QoS policy (YAML, docs/qos.md; default: $FABRICLAB_QOS, else saved, else none)",
    )
    p.add_argument(
        "--gc",
        choices=("frozen", "cpython"),
        default="frozen",
        help="garbage collector policy: 'frozen' keeps full collections off the readers' path "
        "(controller/heap.py); 'cpython' is the interpreter's own (default %(default)s)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(handler=run)


#: See `run`: measured with `python -m benchmarks.reads` (docs/controller.md).
READER_SWITCH_INTERVAL_S = 0.0005

#: The whole shutdown after SIGTERM/SIGINT, at most (the worker may be in a seconds-long k=16 recompute).
SHUTDOWN_S = 4.0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("os_ken", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    of_host, of_port = endpoint(args.openflow, "--openflow")
    api_host, api_port = endpoint(args.api, "--api")
    listeners = [("--openflow", (of_host, of_port)), ("--api", (api_host, api_port))]
    check_distinct(listeners)
    try:
        scale = Scale.parse(args.capacity_scale) if args.capacity_scale else None
    except ValueError as exc:
        raise CliError(f"--capacity-scale: {exc}") from None
    fabric = load_fabric(args.topology)
    partitions = load_partitions(args.partitions, fabric) if args.partitions is not None else None
    if args.qos is None and os.environ.get(QOS_ENV):
        args.qos = Path(os.environ[QOS_ENV])
    qos_policy = load_policy(args.qos, fabric) if args.qos is not None else None  # exit 2 before anything

    # Imported here: the routing-only commands must not pay for os-ken, FastAPI and uvicorn.
    from controller.core.fabric import GenerationExhausted  # noqa: PLC0415
    from controller.core.state import Config  # noqa: PLC0415
    from controller.httpguard import (  # noqa: PLC0415
        ALLOWED_HOSTS_ENV,
        ListenError,
        allowed_hosts,
        is_loopback,
        serve_in_thread,
        token_from_env,
    )
    from controller.observe.web import Observability  # noqa: PLC0415
    from controller.rest.api import create_app  # noqa: PLC0415
    from controller.service import FabricService  # noqa: PLC0415
    from controller.southbound.app import start_openflow  # noqa: PLC0415

    try:
        token = token_from_env(os.environ.get(TOKEN_ENV))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.engine is not None and args.engine not in default_registry():
        default_registry().create(args.engine)  # raises UnknownEngine: one line naming the choices
    store = StateStore(args.state_dir) if args.state_dir else None

    overrides = policy_overrides(args)
    link_scale = scale.emulated_gbps / scale.real_gbps if scale is not None else 1.0

    def chosen(saved: Config) -> Config:
        engine = args.engine if args.engine is not None else saved.engine
        options = saved.options
        if args.no_fast_failover or args.multipath:
            options = ForwardingOptions(not args.no_fast_failover, args.multipath, classes=options.classes)
        chosen_partitions = partitions if partitions is not None else saved.partitions
        config = replace(saved, engine=engine, options=options, partitions=chosen_partitions)
        if qos_policy is not None and qos_policy != saved.qos:  # saved with the rest at the first save
            config = replace(config, qos=qos_policy, qos_source=f"file {args.qos}")
        return apply_policy_overrides(config, overrides)

    heap = Heap() if args.gc == "frozen" else None
    if heap is not None:
        heap.install()
        # A reader waiting for the interpreter lock gets it after at most this long of the worker's
        # computation (CPython's default is 5 ms; a REST read needs the lock a few times).
        sys.setswitchinterval(READER_SWITCH_INTERVAL_S)
    try:
        if store is not None:
            store.lock()  # held until the process exits: one controller per state directory
        service = FabricService.for_fabric(fabric, store, chosen, lldp_interval_s=args.lldp_interval,
                                           stats_interval_s=args.stats_interval,
                                           link_scale=link_scale, heap=heap)  # fmt: skip
    except (StateError, GenerationExhausted) as exc:
        raise CliError(f"--state-dir: {exc}") from None
    except UnknownEngine as exc:  # --engine was checked above: this is the saved one
        raise CliError(f"--state-dir: {store.path if store else ''}: engine: {exc}") from None
    state = service.snapshot().state
    if state.config.options.slot_tables:  # a multipath policy needs equal-cost alternatives
        from controller.sm.manager import policy_problem  # noqa: PLC0415

        problem = policy_problem(
            fabric, state.config.engine, state.config.options, registry=service.context.registry
        )
        if problem is not None:
            raise option_error(problem)
    check_bindable(listeners)
    extra_hosts = os.environ.get(ALLOWED_HOSTS_ENV, "").split(",")
    observability = Observability.for_service(service.snapshot, scale, token_required=token is not None)
    app = create_app(service, token, allowed_hosts(api_host, api_port, extra_hosts), observability)
    observer = observability.observer()

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    runtime = start_openflow(service, of_host, of_port)
    service.start(runtime.app)
    observer.start()
    try:
        rest = serve_in_thread(app, (api_host, api_port), "rest", "--api")
    except ListenError as exc:
        runtime.stop()
        service.stop()
        observer.stop()
        raise CliError(str(exc)) from None
    LOG.info(
        "controller for %s: engine %s, policy %s, OpenFlow %s:%d, REST http://%s:%d/api/v1 (docs at /docs, "
        "live view at /, metrics at /metrics)",
        fabric.summary(),
        state.config.engine,
        state.config.options.policy,
        of_host,
        of_port,
        api_host,
        api_port,
    )
    if token is not None:
        LOG.info("REST: changes need the bearer token from %s", TOKEN_ENV)
    elif is_loopback(api_host):
        LOG.info("REST: no token (%s unset); changes are open to local processes", TOKEN_ENV)
    else:
        LOG.warning(
            "REST on %s without a token: ANYONE who can reach it can reprogram the fabric; set %s",
            api_host,
            TOKEN_ENV,
        )
    while not stop.wait(0.5):
        if not rest.alive():
            LOG.error("REST server stopped unexpectedly")
            break
    LOG.info("shutting down")
    deadline = time.monotonic() + SHUTDOWN_S  # Docker's grace is 10 s: well inside it, whatever runs

    def left(reserve_s: float = 0.0) -> float:
        return max(0.2, deadline - reserve_s - time.monotonic())

    runtime.stop()
    service.stop(left(reserve_s=1.0))  # waiting operators answered at once; no save half-done after it
    observer.stop(min(1.0, left(reserve_s=0.5)))
    rest.stop(left())
    LOG.info("stopped in %.1f s", SHUTDOWN_S - (deadline - time.monotonic()))
    return 0 if stop.is_set() else 1


__all__ = ["endpoint", "register", "run"]
