"""`fabriclab emulate up --dask` across "machines" that are network namespaces made by the test, each with
its own underlay address and its own `dask worker` (tests/cluster_support.py), exactly as across hosts:
the shards are placed on the workers, cables between machines are VXLAN over the underlay, every bridge
dials the one controller through its machine's relay.  All pairs are verified where the hosts are; a cable
between the machines is cut and restored and the controller routes around it; SIGTERM leaves nothing on any
machine; a worker killed mid-run is reported with its shards and the rest torn down, and `emulate clean`
on that machine removes what the dead worker left."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from emulation import runfile
from emulation.shards import plan
from tests.cluster_support import NamespaceCluster, cluster_available, netns_names
from tests.conftest import ROOT
from tests.emulation_support import require_emulation
from topologies.loader import load_topology

pytestmark = pytest.mark.emulation

K4 = ROOT / "topologies" / "fat-tree-k4.yaml"
PREFIX = "zq"  # the fabric's names on every machine
HTTP = """
import sys, urllib.request as u
method, url, body = sys.argv[1:4]
headers = {"Content-Type": "application/json"}
request = u.Request(url, data=body.encode() or None, method=method, headers=headers)
print(u.urlopen(request, timeout=30).read().decode())
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[NamespaceCluster]:
    require_emulation(cluster_available())
    with NamespaceCluster("fq", machines=2, subnet="10.213.7") as c:
        yield c


def _up(cluster: NamespaceCluster, shards: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fabriclab", "emulate", "up", str(K4), "--dask", cluster.scheduler_address,
            "--shards", str(shards), "--no-cli", "--name-prefix", PREFIX]  # fmt: skip
    return cluster.popen_in(cluster.head, argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def _until(proc: subprocess.Popen[str], marker: str, timeout_s: float = 240) -> list[str]:
    """Lines of `emulate up` until one starts with `marker` (fails with everything said if it exits)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith(marker):
            return lines
        assert time.monotonic() < deadline, lines
    pytest.fail(f"emulate up ended (exit {proc.wait()}) before {marker!r}:\n" + "\n".join(lines))


def _http(cluster: NamespaceCluster, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    """A REST call from the head namespace (where `emulate up` serves on loopback)."""
    body_text = json.dumps(body) if body else ""
    done = cluster.run_in(cluster.head, [sys.executable, "-c", HTTP, method, url, body_text], timeout_s=60)
    assert done.returncode == 0, done.stderr[-1500:]
    return json.loads(done.stdout)


def _ours_left() -> list[str]:
    """This fabric's namespaces, shard run directories and run records, on any machine (one box here)."""
    names = [n for n in netns_names() if runfile.prefix_pattern(PREFIX).fullmatch(n)]
    records = [str(p) for p, r in runfile.records() if r.prefix == PREFIX]
    return sorted(names + records)


def _lose(cluster: NamespaceCluster, kill: Callable[[], None]) -> tuple[int, str]:
    """`emulate up` on two shards, then `kill` (a worker, the scheduler) once it runs: its exit status and
    what it said after."""
    proc = _up(cluster, shards=2)
    try:
        _until(proc, "running;")
        kill()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def _crossing_hop(cluster: NamespaceCluster, shards: int) -> tuple[str, int, str, str]:
    """A switch port on the path h1 -> h13 whose cable joins the two machines: (switch, port, src, dst)."""
    shard_of = plan(load_topology(K4), shards).shard_of
    route = _http(cluster, "GET", "http://127.0.0.1:8080/api/v1/routes?src=h1&dst=h13")
    hops = [(h["node"], h["out_port"]) for h in route["hops"] if h.get("out_port") is not None]
    for (node, port), (nxt, _) in itertools.pairwise(hops):
        if node in shard_of and nxt in shard_of and shard_of[node] % 2 != shard_of[nxt] % 2:
            return node, int(port), "h1", "h13"
    pytest.fail(f"no hop of h1 -> h13 crosses machines: {route['path']}")


def test_a_fabric_on_two_machines_is_verified_rerouted_and_torn_down(cluster: NamespaceCluster) -> None:
    proc = _up(cluster, shards=2)
    try:
        lines = _until(proc, "running;")
        text = "\n".join(lines)
        assert "all pairs: 240/240 reachable" in text, text
        assert "cluster: 2 workers" in text, text
        # each machine's shard reaches the other through VXLAN devices made over its own underlay address
        fabric = load_topology(K4)
        crossing = len(plan(fabric, 2).crossing(fabric))
        for i, ns in enumerate(cluster.machines):
            # seen from the worker's own mounts: `ip netns exec` gave it a mount namespace of its own, so
            # its namespaces are bound there only, as they would be on a machine of its own
            argv = ["ip", "-n", f"{PREFIX}x{i}", "-d", "-o", "link", "show", "type", "vxlan"]
            done = subprocess.run(["nsenter", "-t", str(cluster.worker_pids[ns]), "-m", "-n", *argv],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            assert done.returncode == 0, done.stderr
            shown = done.stdout
            assert shown.count(f"local {cluster.ips[ns]}") == crossing > 0, shown
        node, port, src, dst = _crossing_hop(cluster, 2)
        before = _http(cluster, "GET", f"http://127.0.0.1:8080/api/v1/routes?src={src}&dst={dst}")
        applied = _http(cluster, "POST", "http://127.0.0.1:8081/api/v1/faults",
                        {"action": "link_down", "target": f"{node}:{port}"})  # fmt: skip
        assert f"{PREFIX}s" in str(applied), applied
        deadline = time.monotonic() + 20
        while True:
            after = _http(cluster, "GET", f"http://127.0.0.1:8080/api/v1/routes?src={src}&dst={dst}")
            if after["generation"] > before["generation"] and f"{node}>{port}" not in after["path"]:
                break
            assert time.monotonic() < deadline, (before["path"], after["path"])
            time.sleep(0.3)
        links = _http(cluster, "GET", "http://127.0.0.1:8080/api/v1/links?counters=false")
        assert sum(1 for lk in links if not lk["up"]) == 1, [lk for lk in links if not lk["up"]]
        _http(
            cluster,
            "POST",
            "http://127.0.0.1:8081/api/v1/faults",
            {"action": "link_up", "target": f"{node}:{port}"},
        )
        deadline = time.monotonic() + 20
        while any(
            not lk["up"] for lk in _http(cluster, "GET", "http://127.0.0.1:8080/api/v1/links?counters=false")
        ):
            assert time.monotonic() < deadline, "the restored cable never came back up at the controller"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out[-2000:]
    assert "stopped: torn down" in out, out[-2000:]
    deadline = time.monotonic() + 30
    while _ours_left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ours_left() == []


def test_a_lost_scheduler_is_reported_and_every_part_torn_down() -> None:
    """The scheduler killed mid-run: `emulate up` says so, and each worker, ending without its scheduler,
    removes its part on the way out."""
    require_emulation(cluster_available())
    with NamespaceCluster("fs", machines=2, subnet="10.213.6") as own:
        code, out = _lose(own, own.kill_scheduler)
        assert code == 2, out[-2000:]
        assert "the Dask scheduler" in out and "is gone" in out, out[-2000:]
        deadline = time.monotonic() + 30
        while _ours_left() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _ours_left() == [], out[-2000:]


def test_a_coordinator_killed_outright_leaves_nothing_on_the_machines(cluster: NamespaceCluster) -> None:
    """`emulate up` killed with SIGKILL (no teardown of its own): each worker stops hearing from it and
    removes its part within the lease; the run's own record is what `emulate clean` is for."""
    proc = _up(cluster, shards=2)
    try:
        _until(proc, "running;")
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while [n for n in _ours_left() if "/runs/" not in n] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [n for n in _ours_left() if "/runs/" not in n] == []
    argv = [sys.executable, "-m", "fabriclab", "emulate", "clean", "--prefix", PREFIX]
    clean = cluster.run_in(cluster.head, argv, timeout_s=120, cwd=ROOT)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _ours_left() == []


def test_a_lost_worker_is_reported_with_its_shards_and_the_rest_torn_down(cluster: NamespaceCluster) -> None:
    lost = cluster.machines[1]
    code, out = _lose(cluster, lambda: cluster.kill_worker(lost))
    assert code == 2, out[-2000:]
    assert f"{cluster.ips[lost]}" in out and "is gone, and with it shards [1]" in out, out[-2000:]
    # the surviving machine tore its part down; the dead worker's part waits for `emulate clean` there
    survivor = cluster.run_in(cluster.machines[0], ["ip", "netns", "list"], timeout_s=10)
    assert f"{PREFIX}x0" not in survivor.stdout
    assert f"{PREFIX}x1" in netns_names()  # the killed worker could not remove its own
    clean = cluster.run_in(lost, [sys.executable, "-m", "fabriclab", "emulate", "clean", "--prefix", PREFIX],
                           timeout_s=120, cwd=ROOT)  # fmt: skip
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _ours_left() == [], clean.stdout
