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
from emulation.qosqueues import ifb_name
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


def _up(cluster: NamespaceCluster, shards: int, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fabriclab", "emulate", "up", str(K4), "--dask", cluster.scheduler_address,
            "--shards", str(shards), "--no-cli", "--name-prefix", PREFIX, *extra]  # fmt: skip
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


def _in_worker(cluster: NamespaceCluster, machine: str, argv: list[str]) -> str:
    """`argv` as seen from the machine's worker: `ip netns exec` gave it a mount namespace of its own, so
    its namespaces are bound there only, as they would be on a machine of its own."""
    done = subprocess.run(["nsenter", "-t", str(cluster.worker_pids[machine]), "-m", "-n", *argv],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_fabric_on_two_machines_is_verified_rerouted_and_torn_down(cluster: NamespaceCluster) -> None:
    """Shaped (400G = 200 Mb/s) with the QoS policy's queues, on two machines."""
    qos = str(ROOT / "scenarios" / "qos-tenants.yaml")
    proc = _up(cluster, 2, "--scale", "400G=200M", "--qos", qos)
    try:
        lines = _until(proc, "running;")
        text = "\n".join(lines)
        assert "all pairs: 240/240 reachable" in text, text
        assert "cluster: 2 workers" in text, text
        # each machine's shard reaches the other through VXLAN devices made over its own underlay address
        fabric = load_topology(K4)
        crossing = len(plan(fabric, 2).crossing(fabric))
        shard_of = plan(fabric, 2).shard_of
        for i, ns in enumerate(cluster.machines):
            shown = _in_worker(cluster, ns, ["ip", "-n", f"{PREFIX}x{i}", "-d", "-o", "link", "show", "type",
                                             "vxlan"])  # fmt: skip
            assert shown.count(f"local {cluster.ips[ns]}") == crossing > 0, shown
            # each machine shaped its own ends of the cables to the other (HTB at 400G = 200 Mb/s) and put
            # the QoS policy's queues (an IFB per switch port) on its switch ports
            vxlans = [line.split(":")[1].strip().split("@")[0] for line in shown.splitlines()]
            for dev in vxlans:  # the QoS queues replace a port's HTB: its IFB carries the link's rate
                classes = _in_worker(cluster, ns, ["tc", "-n", f"{PREFIX}x{i}", "class", "show", "dev",
                                                   ifb_name(dev)])  # fmt: skip
                assert "htb 1:1 root" in classes and "rate 200Mbit" in classes, classes
            ifbs = _in_worker(cluster, ns, ["ip", "-n", f"{PREFIX}x{i}", "-o", "link", "show", "type", "ifb"])
            ports = [r for r in fabric.port_map if fabric.nodes[r.node].is_switch and shard_of[r.node] == i]
            assert len(ifbs.splitlines()) == len(ports) > 0, ifbs
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


def test_k8_on_three_machines_is_verified_and_torn_down() -> None:
    """k=8 (80 switches, 128 hosts) on 4 shards over three machines: shard 3 shares the first machine
    (i mod W), every one of the 16,256 pairs verified where its hosts are, SIGTERM leaves nothing."""
    require_emulation(cluster_available())
    k8 = ROOT / "topologies" / "fat-tree-k8.yaml"
    with NamespaceCluster("ft", machines=3, subnet="10.213.5") as three:
        argv = [sys.executable, "-m", "fabriclab", "emulate", "up", str(k8), "--dask",
                three.scheduler_address, "--shards", "4", "--no-cli", "--name-prefix", PREFIX,
                "--ready-timeout", "300"]  # fmt: skip
        proc = three.popen_in(three.head, argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)  # fmt: skip
        try:
            text = "\n".join(_until(proc, "running;", timeout_s=400))
            assert "all pairs: 16256/16256 reachable" in text, text
            assert "cluster: 3 workers" in text and "shards [0, 3]" in text, text
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "stopped: torn down" in out, out[-2000:]
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


SCENARIO = """\
fabriclab: 1
name: across-machines
topology: {root}/topologies/fat-tree-k4.yaml
scale: 400G=200M
buffer_packets: 16
partitions: {root}/scenarios/partitions-k4.conf
controller: {{engine: ftree}}
duration_s: 4
seed: 5
poll_interval_s: 0.5
traffic:
  - {{kind: udp, src: h1, dst: h5, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h9, dst: h13, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h14, dst: h9, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h2, dst: h3, rate_pps: 400, size_bytes: 512}}
  - {{kind: udp, src: h10, dst: h14, rate_pps: 200, size_bytes: 512}}
  - {{kind: roce-collective, collective: allreduce-ring, ranks: h1..h8, size: 32KiB, rate_pps: 300,
     mtu: 1024}}
faults:
  - {{at_s: 1.5, action: link_down, port: "{cut}"}}
  - {{at_s: 3, action: link_up, port: "{cut}"}}
"""


def test_a_scenario_runs_across_machines(cluster: NamespaceCluster, tmp_path: Any) -> None:
    """`scenario run --dask`: each flow sent where its source is and received where its destination is
    (h1 -> h5, h9 -> h13 and h14 -> h9 cross between the machines; h2 -> h3 stays on one), a ring
    all-reduce whose RoCE rank agents run on the machines holding their hosts (h1..h4 on one, h5..h8 on
    the other), links shaped on both machines, a cable between the machines cut and restored at its
    times, the partition layer's drops read on every machine (h10 -> h14: two limited members, denied),
    results merged into one summary, and nothing left on any machine."""
    fabric = load_topology(K4)
    shard_of = plan(fabric, 2).shard_of
    cut = next(f"{lk.a.node}:{lk.a.port}" for lk in plan(fabric, 2).crossing(fabric))
    assert {shard_of["h1"], shard_of["h9"]} == {0} and {shard_of["h5"], shard_of["h13"]} == {1}
    file = tmp_path / "across.yaml"
    file.write_text(SCENARIO.format(root=ROOT, cut=cut))
    before = netns_names()
    argv = [sys.executable, "-m", "fabriclab", "scenario", "run", str(file), "--dask",
            cluster.scheduler_address, "--shards", "2", "-o", str(tmp_path / "out")]  # fmt: skip
    done = cluster.run_in(cluster.head, argv, timeout_s=400, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["shards"] == {"count": 2, "crossing": "vxlan", "dask": cluster.scheduler_address}
    rep = summary["repetitions"][0]
    assert rep["all_pairs"]["pairs"] == 240
    isolation = rep["isolation"]
    assert isolation["denied_but_delivered"] == [] and isolation["permitted_but_undelivered"] == []
    assert rep["all_pairs"]["reachable"] == 240 - isolation["denied_pairs"] > 0
    (ring,) = rep["collectives"]
    assert ring["ranks"] == 8 and ring["packets_expected"] > 0 and ring["bad_icrc"] == 0, ring
    assert ring["packets_received"] > 0.5 * ring["packets_expected"], ring  # every agent reported
    senders = {m["src"] for m in rep["roce_messages"] if m["sent"]}
    assert senders == {f"h{i}" for i in range(1, 9)}, rep["roce_messages"][:3]
    flows = {f["name"]: f for f in rep["flows"]}
    assert len(flows) == 5
    for flow in flows.values():
        assert flow["sent"] > 0.9 * flow["rate_pps"] * 4, flow  # the source's machine sent it all
        if (flow["src"], flow["dst"]) == ("h10", "h14"):
            assert flow["received"] == 0, flow
        else:  # the destination's machine received it (a cut costs milliseconds of it, not half)
            assert flow["received"] > 0.5 * flow["sent"], flow
            assert flow["latency_ms"] is not None, flow
    assert isolation["dropped_packets"]["denied"] >= 0.9 * flows_of(rep, "h10", "h14")["sent"]
    assert [(f["action"], f["target"]) for f in rep["faults"]] == [("link_down", cut), ("link_up", cut)]
    link = next(lk for lk in plan(fabric, 2).crossing(fabric) if f"{lk.a.node}:{lk.a.port}" == cut)
    ends = {cut, f"{link.b.node}:{link.b.port}"}  # cut at both ends: the controller may see either first
    seen = {(e["kind"], p.split()[0]) for e in rep["events"] for p in e.get("ports", [])}
    assert {k for k, port in seen if port in ends} >= {"port_down", "port_up"}, rep["events"]
    # the denied flow's packets are the partition layer's drops, not the emulator's
    assert rep["headroom"]["partition_drops"] >= isolation["dropped_packets"]["denied"]
    assert any(rep["utilisation"]["links"].values()), "no port counters were sampled"
    deadline = time.monotonic() + 30
    while netns_names() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert netns_names() - before == set()


def flows_of(rep: dict[str, Any], src: str, dst: str) -> dict[str, Any]:
    return next(f for f in rep["flows"] if (f["src"], f["dst"]) == (src, dst))
