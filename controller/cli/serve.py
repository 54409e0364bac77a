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
import threading
from pathlib import Path
from typing import Any

from controller.cli.common import CliError, check_bindable, check_distinct, endpoint, load_fabric, real
from controller.sm.engines.base import UnknownEngine
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import SubnetManager
from controller.state import StateError, StateStore

LOG = logging.getLogger("fabriclab")
TOKEN_ENV = "FABRICLAB_API_TOKEN"


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
    p.add_argument("--multipath", action="store_true", help="select groups over equal-cost ports")
    p.add_argument(
        "--lldp-interval",
        type=real(0.1, 3600, " seconds"),
        default=10.0,
        metavar="S",
        help="LLDP probe period, 0.1..3600 s (default %(default)s)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("os_ken", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    of_host, of_port = endpoint(args.openflow, "--openflow")
    api_host, api_port = endpoint(args.api, "--api")
    listeners = [("--openflow", (of_host, of_port)), ("--api", (api_host, api_port))]
    check_distinct(listeners)
    fabric = load_fabric(args.topology)

    # Imported here: the routing-only commands must not pay for os-ken, FastAPI and uvicorn.
    import uvicorn  # noqa: PLC0415

    from controller.rest.api import create_app  # noqa: PLC0415
    from controller.service import FabricService  # noqa: PLC0415
    from controller.southbound.app import start_openflow  # noqa: PLC0415

    store = StateStore(args.state_dir) if args.state_dir else None
    manager = SubnetManager(fabric)
    try:
        if store is not None:
            store.lock()  # held until the process exits: one controller per state directory
        service = FabricService.restore(manager, store, lldp_interval_s=args.lldp_interval)
    except StateError as exc:
        raise CliError(f"--state-dir: {exc}") from None
    except UnknownEngine as exc:  # only the saved engine is created in restore()
        raise CliError(f"--state-dir: {store.path if store else ''}: engine: {exc}") from None
    if args.engine is not None:
        manager.registry.create(args.engine)
        manager.engine = args.engine
    if args.no_fast_failover or args.multipath:
        manager.options = ForwardingOptions(not args.no_fast_failover, args.multipath)
    check_bindable(listeners)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    runtime = start_openflow(service, of_host, of_port)
    service.start(runtime.app)
    token = os.environ.get(TOKEN_ENV) or None
    config = uvicorn.Config(create_app(service, token), host=api_host, port=api_port, log_level="warning")
    server = uvicorn.Server(config)
    api_thread = threading.Thread(target=server.run, name="rest", daemon=True)
    api_thread.start()
    LOG.info(
        "controller for %s: engine %s, OpenFlow %s:%d, REST http://%s:%d/api/v1 (docs at /docs)%s",
        fabric.summary(),
        manager.engine,
        of_host,
        of_port,
        api_host,
        api_port,
        ", token required for changes" if token else "",
    )
    while not stop.wait(0.5):
        if not api_thread.is_alive():
            LOG.error("REST server stopped unexpectedly")
            break
    LOG.info("shutting down")
    runtime.stop()
    service.stop()
    server.should_exit = True
    api_thread.join(5.0)
    LOG.info("stopped")
    return 0 if stop.is_set() else 1


__all__ = ["endpoint", "register", "run"]
