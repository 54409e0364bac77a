#!/usr/bin/env python3
"""Smoke test of README's first command, `docker compose up`, as a user would meet it.

Brings the stack up detached, waits until both services are healthy, checks through the REST APIs that every
switch is connected and every host pair was verified reachable, injects a link fault and sees the controller
reroute, runs a shipped scenario through `docker compose exec`, then `docker compose down` and checks that
nothing is left: no containers, no listeners, no interfaces of the fabric in the host's namespace.  Then the
`cluster` profile: its scheduler and emulation host up, `emulate up --dask` from a third container placing
a k=4 fabric's shards on that host, verified, stopped with SIGTERM, the profile down, nothing left.

Run from the repository root on a machine with a Docker engine (see `.ci/run`). Standard library only
(plus the project's own stdlib-only REST client, `controller.rest.client`): the host needs no installs.
Exit status 0 on success; on failure the services' logs are printed and the stack is still taken down.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PORT_DEFAULTS = {"FABRICLAB_API_PORT": 8080, "FABRICLAB_EMU_API_PORT": 8081, "FABRICLAB_OPENFLOW_PORT": 6653}
PORTS = [int(os.environ.get(name, default)) for name, default in PORT_DEFAULTS.items()]
sys.path.insert(0, str(ROOT))  # the project's REST client; standard library only, like this script
from controller.rest.client import ControllerClient, wait_for  # noqa: E402

CONTROLLER = ControllerClient("127.0.0.1", PORTS[0])
EMULATOR = ControllerClient("127.0.0.1", PORTS[1])  # the emulator's API speaks the same /api/v1 style
SCENARIO = "scenarios/link-failure.yaml"
RESULTS = "results/compose-smoke"


class SmokeFailure(Exception):
    pass


#: What a failed step raises (AssertionError: a REST call that did not answer 200, or wait_for timing out).
FAILURES = (SmokeFailure, OSError, AssertionError, KeyError, ValueError, subprocess.SubprocessError)


def compose(*args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["docker", "compose", *args]
    print("$", " ".join(argv), flush=True)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and done.returncode != 0:
        raise SmokeFailure(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def post(api: ControllerClient, path: str, body: dict[str, Any]) -> Any:
    token = os.environ.get("FABRICLAB_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, answer = api.request("POST", path, json.dumps(body), headers)
    if status != 200:
        raise SmokeFailure(f"POST {path} {body}: {status} {answer}")
    return answer


def fetch(api: ControllerClient, path: str) -> str:
    with urllib.request.urlopen(f"http://{api.host}:{api.api_port}{path}", timeout=30) as response:
        text: str = response.read().decode()
        return text


def health(service: str) -> str:
    ids = compose("ps", "-q", service).stdout.split()
    if not ids:
        return "no container"
    status = "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}"
    argv = ["docker", "inspect", "--format", status, ids[0]]
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split()
    return out[-1] if len(out) > 1 else (out[0] if out else "gone")


def wait_healthy(services: list[str], timeout_s: float) -> float:
    start = time.monotonic()
    while True:
        states = {s: health(s) for s in services}
        if all(state == "healthy" for state in states.values()):
            return time.monotonic() - start
        if any(state in ("exited", "dead", "unhealthy", "gone") for state in states.values()):
            raise SmokeFailure(f"services failed: {states}")
        if time.monotonic() - start > timeout_s:
            raise SmokeFailure(f"not healthy after {timeout_s:.0f} s: {states}")
        time.sleep(2)


def host_network() -> set[str]:
    """Interfaces and named namespaces in the host's network namespace (the fabric uses host networking)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    links = {
        f"interface {line.split(':')[1].strip().split('@')[0]}" for line in out.splitlines() if ":" in line
    }
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return links | {f"namespace {line.split()[0]}" for line in out.splitlines() if line.strip()}


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def smoke() -> dict[str, Any]:
    figures: dict[str, Any] = {}
    compose("config", "-q")
    busy = [port for port in PORTS if listening(port)]
    if busy:
        raise SmokeFailure(f"ports already in use on 127.0.0.1: {busy}; stop whatever holds them first")
    start = time.monotonic()
    compose("up", "-d")
    figures["healthy_s"] = round(wait_healthy(["controller", "fabric"], timeout_s=300), 1)

    fabric = CONTROLLER.get("fabric")
    switches = fabric["switches"]
    down = [s["name"] for s in switches if not s["connected"]]
    if not switches or down:
        raise SmokeFailure(f"switches not connected: {down or 'none listed'}")
    emulation = EMULATOR.get("emulation")
    if not emulation["pairs"] or emulation["pairs_reachable"] != emulation["pairs"]:
        raise SmokeFailure(f"all-pairs check did not pass: {emulation}")
    figures.update(switches=len(switches), pairs=emulation["pairs"], verified_s=emulation["verified_s"])
    print(f"ok: {len(switches)} switches connected, {emulation['pairs']} pairs reachable", flush=True)

    last = max((int(e["id"]) for e in CONTROLLER.get("events")), default=0)
    post(EMULATOR, "faults", {"action": "link_down", "target": "leaf1:3"})

    def seen() -> bool:
        return any(e["kind"] == "port_down" for e in CONTROLLER.get(f"events?since={last}"))

    wait_for(seen, 30, "the controller's port_down after a link_down fault", interval_s=0.2)
    post(EMULATOR, "faults", {"action": "link_up", "target": "leaf1:3"})
    print("ok: link_down injected through the emulator API, port_down seen by the controller", flush=True)

    page = fetch(CONTROLLER, "/")
    if "fabric-view.js" not in page or len(fetch(CONTROLLER, "/ui/dist/fabric-view.js")) < 10_000:
        raise SmokeFailure("the live view at / or its bundled script is missing from the image")
    metrics = fetch(CONTROLLER, "/metrics")
    for family in (
        'fabriclab_events_total{kind="port_down"}',
        "fabriclab_port_transmit_bytes_total",
        "fabriclab_link_utilisation_ratio",
        "fabriclab_http_request_duration_seconds_bucket",
    ):
        if family not in metrics:
            raise SmokeFailure(f"controller /metrics lacks {family}")
    if 'fabriclab_events_total{kind="port_down"} 0.0' in metrics:
        raise SmokeFailure("controller /metrics did not count the port_down")
    if "fabriclab_emulator_port_transmit_bytes_total" not in fetch(EMULATOR, "/metrics"):
        raise SmokeFailure("emulator /metrics lacks its interface counters")
    print("ok: live view and bundle served, /metrics of controller and emulator", flush=True)

    shutil.rmtree(ROOT / RESULTS, ignore_errors=True)
    run = compose("exec", "-T", "fabric", "fabriclab", "scenario", "run", SCENARIO, "-o", RESULTS)
    print(run.stdout.strip(), flush=True)
    summary = json.loads((ROOT / RESULTS / "summary.json").read_text())
    rep = summary["repetitions"][0]
    if rep["all_pairs"]["reachable"] != rep["all_pairs"]["pairs"] or not rep["flows"]:
        raise SmokeFailure(f"scenario in the fabric container: {rep['all_pairs']}, {len(rep['flows'])} flows")
    if not all(f["received"] > 0 for f in rep["flows"]):
        raise SmokeFailure(f"scenario flows received nothing: {rep['flows']}")
    figures["scenario_flows"] = len(rep["flows"])
    print(
        f"ok: scenario {summary['scenario']} ran in the fabric container; results in ./{RESULTS}", flush=True
    )
    figures["total_up_s"] = round(time.monotonic() - start, 1)
    return figures


COORDINATOR = "fabriclab-cluster-smoke"
IMAGE = "fabriclab:latest"  # docker-compose.yml's x-image


def cluster_smoke() -> dict[str, Any]:
    """The `cluster` profile: a Dask scheduler and an emulation host started by compose, a coordinator
    container running `emulate up --dask` against them (a k=4 fabric on 2 shards, placed on the one
    worker); every switch connected and every pair verified, then SIGTERM (`docker stop`) tears it down."""
    start = time.monotonic()
    compose("--profile", "cluster", "up", "-d", "scheduler", "emu-host")
    argv = ["fabriclab", "emulate", "up", "topologies/fat-tree-k4.yaml", "--dask", "tcp://127.0.0.1:8786",
            "--shards", "2", "--no-cli", "--name-prefix", "cs", "--ready-timeout", "120"]  # fmt: skip
    deadline = time.monotonic() + 120
    while True:  # the worker registers a few seconds after its container starts
        # `docker run`, not `compose run`: docker-compose 1.29 adds links, which host networking refuses
        run = ["docker", "run", "-d", "--init", "--network", "host", "--name", COORDINATOR, IMAGE, *argv]
        subprocess.run(run, capture_output=True, text=True, timeout=120, check=True)
        if wait_for_line(COORDINATOR, "running;", 300):
            break
        logs = container_logs(COORDINATOR)
        remove_container(COORDINATOR)
        if "no Dask worker offers" not in logs or time.monotonic() > deadline:
            raise SmokeFailure(f"emulate up --dask did not come up:\n{logs[-3000:]}")
        time.sleep(3)
    logs = container_logs(COORDINATOR)
    if "all pairs: 240/240 reachable" not in logs or "cluster: 1 workers" not in logs:
        raise SmokeFailure(f"emulate up --dask in the cluster profile:\n{logs[-3000:]}")
    fabric = CONTROLLER.get("fabric")
    down = [s["name"] for s in fabric["switches"] if not s["connected"]]
    if len(fabric["switches"]) != 20 or down:
        raise SmokeFailure(f"cluster profile: switches not connected: {down}")
    print("ok: cluster profile: emulate up --dask put 2 shards on the emu-host worker, 240 pairs", flush=True)
    subprocess.run(["docker", "stop", "-t", "60", COORDINATOR], capture_output=True, text=True, timeout=120,
                   check=False)  # fmt: skip
    logs = container_logs(COORDINATOR)
    inspect = ["docker", "inspect", "-f", "{{.State.ExitCode}}", COORDINATOR]
    code = subprocess.run(inspect, capture_output=True, text=True, check=False).stdout.strip()
    remove_container(COORDINATOR)
    if code != "0" or "stopped: torn down" not in logs:
        raise SmokeFailure(f"emulate up --dask after SIGTERM: exit {code}\n{logs[-2000:]}")
    print("ok: SIGTERM tore the cluster's fabric down", flush=True)
    return {"cluster_up_and_down_s": round(time.monotonic() - start, 1)}


def container_logs(name: str) -> str:
    done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def remove_container(name: str) -> None:
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, text=True, timeout=120, check=False)


def wait_for_line(name: str, marker: str, timeout_s: float) -> bool:
    """Until container `name` said a line starting with `marker` (True) or exited (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(line.startswith(marker) for line in container_logs(name).splitlines()):
            return True
        state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                               text=True, check=False).stdout.strip()  # fmt: skip
        if state != "true":
            return False
        time.sleep(1)
    raise SmokeFailure(f"{name}: no line {marker!r} in {timeout_s:.0f} s:\n{container_logs(name)[-3000:]}")


def teardown(before: set[str]) -> list[str]:
    """`docker compose down`, then what is still there that was not before `up` (should be nothing)."""
    start = time.monotonic()
    compose("down", "--timeout", "60", timeout_s=300, check=False)
    print(f"down in {time.monotonic() - start:.1f} s", flush=True)
    left = [f"container {c}" for c in compose("ps", "-q", check=False).stdout.split()]
    left += [f"listener on port {port}" for port in PORTS if listening(port)]
    left += sorted(host_network() - before)
    return left


def main() -> int:
    before = host_network()
    failure: Exception | None = None
    figures: dict[str, Any] = {}
    try:
        figures = smoke()
    except FAILURES as exc:
        failure = exc
        print(compose("logs", "--no-color", "--tail", "80", check=False).stdout, file=sys.stderr)
    left = teardown(before)
    if failure is None and not left:
        try:
            figures.update(cluster_smoke())
        except FAILURES as exc:
            failure = exc
            logs = compose("--profile", "cluster", "logs", "--no-color", "--tail", "80", check=False).stdout
            print(logs, file=sys.stderr)
        remove_container(COORDINATOR)
        compose("--profile", "cluster", "down", "--timeout", "60", timeout_s=300, check=False)
        ids = compose("--profile", "cluster", "ps", "-q", check=False).stdout.split()
        left = [f"container {c}" for c in ids]
        left += [f"listener on port {port}" for port in [*PORTS, 8786] if listening(port)]
        left += sorted(host_network() - before)
    if left:
        print(f"FAIL: left behind after `docker compose down`: {left}", file=sys.stderr)
    if failure is not None:
        print(f"FAIL: {failure}", file=sys.stderr)
    if failure is None and not left:
        print(json.dumps({"compose_smoke": "passed", **figures}))
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
