"""How much traffic can this machine emulate cleanly on a fabric?  `fabriclab emulate calibrate TOPOLOGY`.

The emulator's capacity is not the modelled links' (a 200 Mb/s HTB link carries ~48,000 512-byte packets a
second) but the CPU's: ovs-vswitchd forwards every packet of every bridge on one thread, and the probe
senders and receivers in the hosts share the same cores.  So it is measured, on this machine, on the
fabric itself: every host sends one sequence-numbered UDP flow to the host half the fabric away (the
longest paths, through the top tier), at a rate per host that is raised step by step — doubled until a
step loses more than `CLEAN_LOSS` of its packets, then bisected between the last clean and the first lossy
rate.  The highest clean rate is the capacity: per host and in total (per host × senders).

The result is JSON (default `~/.cache/fabriclab/calibration-<fabric>.json`): scenario runs compare what
they offer with it and warn, and the tests size their traffic from it.  It holds for the machine's load
while it was measured (recorded as the load average): a machine shared with other work has less.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from controller.sm.manager import SubnetManager
from emulation import fleet, probe
from emulation.controlproc import ControllerProcess
from emulation.headroom import CLEAN_LOSS, assess, snapshot
from emulation.mesh import check_all_pairs
from emulation.mnfabric import MininetFabric, Scale
from emulation.sharded import ShardedFabric
from topologies.model import Fabric

BASE_PORT = 7000
#: Receivers stop this long after the senders end (packets still in flight).
RECEIVE_GRACE_S = 1.0
#: A step is clean only if the senders sent at least this share of the rate asked of them: past what the
#: hosts can send, a step's "no loss" said nothing about the fabric (k=4 on AF_XDP ports: "14,000 pkt/s per
#: host" clean, of which the senders managed 10,300).
MIN_SENT_SHARE = 0.99
SEND_SLACK_S = 0.02
Progress = Callable[[str], None]


def default_path(fabric_name: str, shards: int = 1, cables: str | None = None, ports: str = "system") -> Path:
    """Where a calibration is kept: one per fabric, and one per sharded build of it (`cables`: what the
    cables inside a shard were; None for the unsharded build, the one scenario runs compare with) and per
    kind of switch port other than packet sockets (`ports`, `emulation.fastports`)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    suffix = f"-shards{shards}-{cables}" if cables is not None else ""
    suffix += f"-{ports}" if ports != "system" else ""
    return cache / "fabriclab" / f"calibration-{fabric_name}{suffix}.json"


def load(fabric_name: str, path: Path | None = None) -> dict[str, Any] | None:
    """A saved calibration of this fabric, or None (none made yet, unreadable, or one that found no clean
    rate at all: it cannot size anything, and a ratio against zero would be nonsense)."""
    path = path or default_path(fabric_name)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("fabric") != fabric_name or not isinstance(data.get("per_host_pps"), int | float):
        return None
    if not data["per_host_pps"] > 0 or not float(data.get("total_pps") or 0) > 0:
        return None
    return data


def half_shift(fabric: Fabric) -> list[tuple[str, str]]:
    hosts = [h.name for h in fabric.hosts]
    n = len(hosts)
    return [(hosts[i], hosts[(i + n // 2) % n]) for i in range(n) if (i + n // 2) % n != i]


@contextlib.contextmanager
def controlled_fabric(
    topology: Path,
    fabric: Fabric,
    work: Path,
    scale: Scale | None,
    name_prefix: str,
    *controller_args: str,
    shards: int = 1,
    cables: str = "auto",
    ports: str = "system",
) -> Iterator[tuple[ControllerProcess, MininetFabric]]:
    """The controller as its own process and the fabric (on `shards` ovs-vswitchd, cables inside a shard
    as `cables` says — `emulation.sharded`; one shard with patch cables is a sharded build too), programmed;
    both torn down on leaving, whatever happened."""
    work.mkdir(parents=True, exist_ok=True)
    addresses = SubnetManager(fabric).addresses.as_strings()
    of_host = None
    if shards > 1 or cables == "patch":
        net: MininetFabric = ShardedFabric(
            fabric, addresses, shards, "veth", cables, scale=scale, name_prefix=name_prefix, ports=ports
        )
    else:
        net = MininetFabric(fabric, addresses, scale=scale, name_prefix=name_prefix, ports=ports)
    ctl = None
    try:
        if isinstance(net, ShardedFabric):
            of_host = net.prepare_control()  # the shards dial the controller on their own network
        ctl = ControllerProcess(
            topology, work / "state", work / "controller.log", *controller_args, of_host=of_host
        )
        ctl.start()
        net.controller = ctl.openflow
        net.start()
        ctl.ready(len(fabric.switches))
        yield ctl, net
    finally:
        try:
            net.stop()
        finally:
            if ctl is not None:
                ctl.stop()


def measure_step(net: MininetFabric, pairs: list[tuple[str, str]], rate_pps: float, seconds: float,
                 size_bytes: int = 512) -> dict[str, Any]:  # fmt: skip
    """Every pair sends at `rate_pps` for `seconds`: packets sent, received, lost, and what the emulator's
    own counters say."""
    ip_of = {host: ip for (host, _), (_, ip) in net.addresses.items()}
    netns = {ep.name: ep.netns for ep in net.endpoints()}
    hosts = net.headroom_hosts()
    before = snapshot(net.switch_interfaces(), hosts, net.switch_namespaces(), net.xsk_dbs())
    flows = [{"src_netns": netns[src], "dst_netns": netns[dst], "dst": ip_of[dst], "port": BASE_PORT + i}
             for i, (src, dst) in enumerate(pairs)]  # fmt: skip
    spec = {"flows": flows, "rate_pps": rate_pps, "seconds": seconds, "size": size_bytes, "bucket_s": 0.1,
            "grace_s": RECEIVE_GRACE_S}  # fmt: skip
    proc = fleet.launch(spec)
    try:
        fleet.go(proc, time.time() + probe.START_MARGIN_S)
        records = fleet.collect(proc, seconds + 120)
    finally:
        fleet.stop(proc)
    sent = sum(int(r["sent"]) for r in records["senders"])
    results = records["receivers"]
    received = sum(int(r["received"]) for r in results)
    p99 = max((r["latency_ms"]["p99"] for r in results if r.get("latency_ms")), default=None)
    after = snapshot(net.switch_interfaces(), hosts, net.switch_namespaces(), net.xsk_dbs())
    verdict = assess(before, after, sent, latency_p99_ms=p99)
    # a sender stops at its end time, and its last wake may come up to two sleeps (10 ms each) before it:
    # what it could not send then is not a shortfall of the host
    offered = rate_pps * max(0.0, seconds - SEND_SLACK_S) * len(pairs)
    return {
        "rate_pps_per_host": round(rate_pps, 1),
        # what the senders managed: hosts that cannot send the rate do not make it a clean one
        "sent_share": round(sent / offered, 4) if offered else 1.0,
        "achieved_pps_per_host": round(sent / seconds / max(1, len(pairs)), 1),
        "sent": sent,
        "received": received,
        "loss": round((sent - received) / sent, 6) if sent else 0.0,
        "emulator_drops": verdict["emulator_drops"],
        "latency_p99_ms": p99,
        # how far the worst sender fell behind its schedule (a starved sender: the machine, not the fabric)
        "senders_late_max_ms": max((float(r["late_max_ms"]) for r in records["senders"]), default=0.0),
    }


#: Warm-up steps before the search: a trickle every host sends until one arrives whole (at most this many).
WARM_UP_STEPS, WARM_UP_PPS, WARM_UP_S = 3, 10.0, 1.5


def warm(net: MininetFabric, pairs: list[tuple[str, str]], size_bytes: int) -> list[dict[str, Any]]:
    """A trickle of the step's flows until one arrives whole: the hosts' first packets to a destination wait
    for its neighbour entry (ARP through the controller), and at k=16 1,024 hosts resolving at once lost 31 %
    of the first step at 100 pkt/s per host — the search then took that for the fabric's limit.  Returns the
    warm-up steps (not part of the search)."""
    steps = []
    for _ in range(WARM_UP_STEPS):
        steps.append(measure_step(net, pairs, WARM_UP_PPS, WARM_UP_S, size_bytes))
        if steps[-1]["loss"] == 0:
            break
    return steps


def search(
    step: Callable[[float], dict[str, Any]],
    start_pps: float = 100.0,
    max_pps: float = 102400.0,
    refine: int = 3,
    loss_target: float = CLEAN_LOSS,
) -> tuple[float, list[dict[str, Any]]]:
    """The highest rate with loss <= `loss_target` that the senders really sent (`sent_share`, where a step
    reports it): double from `start_pps` (halve, if even that is lossy) to bracket it, then bisect `refine`
    times.  Returns (rate, every step measured)."""
    steps: list[dict[str, Any]] = []

    def clean(rate: float) -> bool:
        result = step(rate)
        steps.append(result)
        return bool(result["loss"] <= loss_target and result.get("sent_share", 1.0) >= MIN_SENT_SHARE)

    good, bad = 0.0, None
    rate = start_pps
    if clean(rate):
        good = rate
        while rate * 2 <= max_pps:
            rate *= 2
            if not clean(rate):
                bad = rate
                break
            good = rate
    else:
        bad = rate
        while rate / 2 >= 5:
            rate /= 2
            if clean(rate):
                good = rate
                break
            bad = rate
    if bad is not None and good > 0:
        for _ in range(refine):
            mid = (good + bad) / 2
            if clean(mid):
                good = mid
            else:
                bad = mid
    return good, steps


def calibrate(
    topology: Path,
    fabric: Fabric,
    work: Path,
    scale: Scale | None = None,
    step_s: float = 2.0,
    size_bytes: int = 512,
    name_prefix: str = "",
    progress: Progress | None = None,
    shards: int = 1,
    cables: str = "auto",
    ports: str = "system",
) -> dict[str, Any]:
    """Measure the fabric's clean capacity on this machine (see the module docstring), on `shards`
    ovs-vswitchd with `cables` inside a shard (`emulate up --shards/--shard-cables`)."""
    say = progress or (lambda line: None)
    pairs = half_shift(fabric)
    started = time.time()
    load_before = os.getloadavg()
    prefix = name_prefix or f"c{os.getpid() % 10000}"
    with controlled_fabric(
        topology, fabric, work, scale, prefix, shards=shards, cables=cables, ports=ports
    ) as (_, net):
        port_kind = net.port_choice.kind
        pairs_ok = check_all_pairs(net.endpoints())
        if not all(pairs_ok.values()):
            bad = [p for p, ok in pairs_ok.items() if not ok]
            raise RuntimeError(f"{len(bad)} host pairs unreachable before calibrating, e.g. {bad[:3]}")

        warm_up = warm(net, pairs, size_bytes)

        def step(rate: float) -> dict[str, Any]:
            result = measure_step(net, pairs, rate, step_s, size_bytes)
            say(
                f"{rate:8.1f} pkt/s per host: {result['received']}/{result['sent']} received "
                f"(loss {100 * result['loss']:.3f} %, emulator drops {result['emulator_drops']})"
            )
            return result

        rate, steps = search(step)
    per_host = round(rate, 1)
    return {
        "fabric": fabric.name,
        "summary": fabric.summary(),
        "topology": str(topology),
        "scale": f"{scale.real_gbps:g}G={scale.emulated_gbps * 1000:g}M" if scale else None,
        "shards": shards,
        "shard_cables": cables if shards > 1 or cables == "patch" else None,
        "ports": port_kind,
        "pattern": "half-shift: host i sends to host i + n/2 (one UDP flow per host)",
        "size_bytes": size_bytes,
        "loss_target": CLEAN_LOSS,
        "senders": len(pairs),
        "per_host_pps": per_host,
        "total_pps": round(per_host * len(pairs), 1),
        "steps": steps,
        "step_s": step_s,
        "warm_up": warm_up,
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
    }


def save(result: dict[str, Any], path: Path) -> Path:
    """Whole or not at all: a new file renamed over the old one, never a temporary left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


__all__ = [
    "calibrate",
    "controlled_fabric",
    "default_path",
    "half_shift",
    "load",
    "measure_step",
    "save",
    "search",
    "warm",
]
