"""Emulation bring-up benchmark: Mininet + userspace OVS (the system's, or shards of their own) + the
controller, per fabric.  Prints JSON.

Phases (seconds from the start of the build): built, switches connected to the controller, tables
installed on every switch (barrier-confirmed), all pairs verified (a frame between every pair of hosts,
through the controller's tables); then the build's own steps and the teardown.  Sampled every 0.2 s during
bring-up: peak resident memory of the ovs-vswitchd processes (summed over shards and the largest one), the
ovsdb-servers (summed), the controller and this process (which builds the fabric); the machine's 1-minute
load and its CPU busy fraction (/proc/stat).  Idle CPU of the switches and the controller is measured over
a few seconds after bring-up.  `--repeat N` runs each case N times in this process and summarises every
figure as p50/p95/max over the runs that verified all pairs (n says how many); every run is kept.

    python -m benchmarks.bringup            # k=4, k=8 fat-trees and a 64-GPU rail fabric, system OVS
    python -m benchmarks.bringup --cases k4 --shards 2 --repeat 20
    python -m benchmarks.bringup --cases k4 --shards 1,2 --crossing vxlan   # unsharded baseline too
    python -m benchmarks.bringup --cases k16,rail1024 --repeat 3 --out benchmarks/results/X.json
    python -m benchmarks.bringup --cases k4,k8 --baseline   # also Mininet's own nodes, same process
    python -m benchmarks.bringup --cases k16 --scale none --cables patch,veth --repeat 3   # A/B
Needs root, Open vSwitch and Mininet (Debian's mnexec).  `--shards` defaults per case: k16 on 8 shards,
rail1024 on 4, the others on the system OVS (1).  A case is keyed `NAME`, `NAME-sN` or `NAME-sN-vxlan`,
then `-patch`/`-veth` when `--cables` names what a cable inside a shard is (default auto: patch ports
unless links are shaped).  Links are shaped to `--scale` (default 400G=400M; `none`: unshaped, as
`emulate up` without `--scale`).
The build is `emulation.lightnet` (batched `ip`, one OVSDB transaction, shell-less hosts) or
`emulation.sharded`; `--baseline` also times Mininet's node-by-node build (a bash per node, system OVS).
A run that does not reach a phase within `--ready-timeout` records the error and how far it got; the
fabric and the controller are torn down after every run, whatever happened.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.out import out_file, write_out
from controller.sm.manager import SubnetManager
from emulation import runfile
from emulation.controlproc import ControllerProcess
from emulation.mesh import check_all_pairs
from emulation.mnfabric import MininetFabric, Scale, mininet_available
from emulation.ovs import OvsDaemon
from emulation.sharded import ShardedFabric
from emulation.shards import CABLES, CROSSINGS, uses_patch
from topologies.generators import fat_tree, rail
from topologies.loader import dump_yaml
from topologies.model import Fabric

ROOT = Path(__file__).resolve().parents[1]

CASES: dict[str, Callable[[], Fabric]] = {
    "k4": lambda: fat_tree(4),
    "k8": lambda: fat_tree(8),
    "rail64": lambda: rail(servers=8, gpus=8),
    "k16": lambda: fat_tree(16),
    "rail1024": lambda: rail(servers=32, gpus=8, groups=4),
}
DEFAULT_CASES = "k4,k8,rail64"
#: One userspace ovs-vswitchd does not bring these up in minutes (docs/sharding.md).
DEFAULT_SHARDS = {"k16": 8, "rail1024": 4}
PHASES = ("mininet_built_s", "mininet_started_s", "switches_connected_s", "tables_installed_s",
          "all_pairs_verified_s")  # fmt: skip
SYSTEM_OVS = Path("/var/run/openvswitch")


@dataclass(frozen=True)
class Options:
    shards: int = 1
    crossing: str = "veth"
    shells: bool = False
    idle_s: float = 5.0
    ready_timeout_s: float = 300.0
    cables: str = "auto"
    scale: str | None = "400G=400M"


def case_key(name: str, shards: int, crossing: str, shells: bool = False, cables: str = "auto") -> str:
    """`k16-s8`, `k4-s2-vxlan`, `k16-s8-veth`, `k4` (system OVS), `k4_baseline` (Mininet's own nodes)."""
    if shells:
        return f"{name}_baseline"
    if shards == 1:
        return name
    return f"{name}-s{shards}" + ("-vxlan" if crossing == "vxlan" else "") + (
        f"-{cables}" if cables != "auto" else "")  # fmt: skip


def summarise(values: list[float]) -> dict[str, float]:
    """p50/p95/max and n (p95 interpolated between ranks, as numpy's default)."""
    ordered = sorted(values)
    p95 = statistics.quantiles(ordered, n=20, method="inclusive")[18] if len(ordered) > 1 else ordered[0]
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 3), "p95": round(p95, 3),
            "max": round(ordered[-1], 3)}  # fmt: skip


def flatten(run: dict[str, Any]) -> dict[str, float]:
    """A run's figures under dotted names (`phases_s.tables_installed_s`, `peak_rss_mb.controller`)."""
    flat: dict[str, float] = {"teardown_s": run["teardown_s"]}
    for group in ("phases_s", "build_steps_s", "peak_rss_mb", "idle_cpu_pct"):
        flat.update({f"{group}.{k}": v for k, v in run[group].items()})
    flat.update({f"load.{k}": v for k, v in run["load"].items() if isinstance(v, int | float)})
    return flat


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Every figure over the runs that verified all pairs (a failed run's figures are not comparable)."""
    ok = [flatten(r) for r in runs if r["error"] is None]
    keys = sorted({k for f in ok for k in f})
    return {k: summarise([f[k] for f in ok if k in f]) for k in keys}


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (busy: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def _pidfile(path: Path) -> list[int]:
    try:
        return [int(path.read_text().strip())]
    except (OSError, ValueError):
        return []


Groups = Callable[[], dict[str, list[int]]]


class Sampler:
    """Peak RSS per process group (summed, and the largest process) and the machine's load, every
    `period_s` on a thread; groups are asked for again every time (shards' daemons start mid-build)."""

    def __init__(self, groups: Groups, period_s: float = 0.2) -> None:
        self.groups, self.period_s = groups, period_s
        self.peak_sum: dict[str, float] = {}
        self.peak_max: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self.peak_total = 0.0
        self.load1: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._ticks = (0, 0)
        self._started = 0.0
        self.busy = self.seconds = 0.0

    def start(self) -> None:
        self._ticks, self._started = cpu_ticks(), time.perf_counter()
        self._thread.start()

    def _sample(self) -> None:
        try:
            groups = self.groups()
        except (RuntimeError, OSError):  # a dict of daemons changing under us: next time
            return
        total = 0.0
        for name, pids in groups.items():
            rss = [_rss_mb(p) for p in pids]
            self.peak_sum[name] = max(self.peak_sum.get(name, 0.0), sum(rss))
            self.peak_max[name] = max(self.peak_max.get(name, 0.0), max(rss, default=0.0))
            self.count[name] = max(self.count.get(name, 0), sum(1 for r in rss if r > 0))
            total += sum(rss)
        self.peak_total = max(self.peak_total, total)
        self.load1.append(os.getloadavg()[0])

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """Stop (once) and return the load during sampling."""
        if not self._stop.is_set() and self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            busy0, total0 = self._ticks
            busy1, total1 = cpu_ticks()
            self.busy = (busy1 - busy0) / max(1, total1 - total0)
            self.seconds = time.perf_counter() - self._started
        return {
            "sampled_s": round(self.seconds, 1),
            "cpu_busy_frac": round(self.busy, 3),
            "load1_mean": round(statistics.fmean(self.load1), 2) if self.load1 else None,
            "load1_max": round(max(self.load1), 2) if self.load1 else None,
        }

    def peaks(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in self.peak_sum:
            out[f"{name}_sum"] = round(self.peak_sum[name])
            if name in ("ovs-vswitchd", "ovsdb-server"):
                out[f"{name}_max"] = round(self.peak_max[name])
                out[f"{name}_count"] = self.count[name]
        out["total"] = round(self.peak_total)
        return out


def groups_of(net: MininetFabric, ctl: ControllerProcess) -> Groups:
    """The processes to sample: a sharded fabric's own daemons, else the system's OVS."""

    def groups() -> dict[str, list[int]]:
        if isinstance(net, ShardedFabric):
            procs = [(n, p.pid) for d in list(net.daemons) for n, p in list(d.procs.items())]
            switchd = [pid for n, pid in procs if n == "ovs-vswitchd"]
            db = [pid for n, pid in procs if n == "ovsdb-server"]
        else:
            switchd = _pidfile(SYSTEM_OVS / "ovs-vswitchd.pid")
            db = _pidfile(SYSTEM_OVS / "ovsdb-server.pid")
        proc = ctl.proc
        return {"ovs-vswitchd": switchd, "ovsdb-server": db, "controller": [proc.pid] if proc else [],
                "this_process": [os.getpid()]}  # fmt: skip

    return groups


def bring_up(name: str, fabric: Fabric, work: Path, opts: Options, run: int = 0) -> dict[str, Any]:
    """One run: controller, fabric, the phases; always torn down.  Errors are results, recorded."""
    topology = work / f"{name}.yaml"
    topology.write_text(dump_yaml(fabric))
    addresses = SubnetManager(fabric).addresses.as_strings()
    prefix = f"b{os.getpid() % 10000}"  # names of its own: other fabrics may share this OVS
    scale = Scale.parse(opts.scale) if opts.scale is not None else None
    kwargs: dict[str, Any] = {"scale": scale, "name_prefix": prefix}
    if opts.shards > 1:
        net: MininetFabric = ShardedFabric(fabric, addresses, opts.shards, opts.crossing, opts.cables,
                                           **kwargs)  # fmt: skip
    else:
        net = MininetFabric(fabric, addresses, shells=opts.shells, **kwargs)
    state = Path(tempfile.mkdtemp(prefix=f"state-{name}-", dir=work))  # a fresh controller each run
    ctl = ControllerProcess(topology, state, work / f"controller-{name}.log", "--engine", "ftree")
    sampler = Sampler(groups_of(net, ctl))
    phases: dict[str, float] = {}
    build: dict[str, float] = {}
    idle: dict[str, float] = {}
    pairs: dict[tuple[str, str], bool] = {}
    flows: list[dict[str, Any]] = []
    error, teardown_s, load_before = None, 0.0, os.getloadavg()
    runfile.write(runfile.RunRecord(prefix, net.node_names, net.group, os.getpid(), None, time.time()))
    try:
        sampler.start()
        if isinstance(net, ShardedFabric):
            ctl.of_host = net.prepare_control()  # the shards dial it on their management network
        ctl.start()
        net.controller = ctl.openflow
        start = time.perf_counter()
        net.start()
        build = {k: round(v, 2) for k, v in net.timings.items()}
        phases["mininet_built_s"] = net.timings["mininet_build_s"]
        phases["mininet_started_s"] = net.timings["mininet_start_s"]
        n = len(fabric.switches)
        deadline = start + opts.ready_timeout_s
        while ctl.get("health")["switches_connected"] < n:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{ctl.get('health')['switches_connected']}/{n} switches connected")
            time.sleep(0.05)
        phases["switches_connected_s"] = time.perf_counter() - start
        ctl.ready(n, timeout_s=max(1.0, deadline - time.perf_counter()))
        phases["tables_installed_s"] = time.perf_counter() - start
        pairs = check_all_pairs(net.endpoints())
        phases["all_pairs_verified_s"] = time.perf_counter() - start
        if not all(pairs.values()):
            raise AssertionError(f"{len(pairs) - sum(pairs.values())}/{len(pairs)} pairs unreachable")
        sampler.stop()
        idle = idle_cpu(groups_of(net, ctl)(), opts.idle_s)
        flows = ctl.get("switches")
    except Exception as exc:  # a run that does not come up is a result: recorded
        error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        load = sampler.stop()
        try:
            torn = time.perf_counter()
            net.stop()
            teardown_s = time.perf_counter() - torn
        finally:
            if ctl.proc is not None:
                ctl.stop()
            runfile.discard(prefix)
    reached = [p for p in PHASES if p in phases]
    return {
        "run": run,
        "error": error,
        "reached": reached[-1] if reached else "nothing",
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "build_steps_s": build,
        "teardown_s": round(teardown_s, 2),
        "patch_cables": len(net.patched) // 2 if isinstance(net, ShardedFabric) else 0,
        "pairs": len(pairs),
        "pairs_reachable": sum(pairs.values()),
        "flows_installed": sum(s["flows"] or 0 for s in flows),
        "groups_installed": sum(s["groups"] or 0 for s in flows),
        "peak_rss_mb": sampler.peaks(),
        "idle_cpu_pct": idle,
        "load": {
            "avg_before": [round(x, 2) for x in load_before],
            **load,
            "avg_after": [round(x, 2) for x in os.getloadavg()],
        },
    }


def idle_cpu(groups: dict[str, list[int]], idle_s: float) -> dict[str, float]:
    """CPU % of the switches (summed over shards) and the controller over `idle_s`, after a settling
    second (0 s: not measured)."""
    if idle_s <= 0:
        return {}
    watched = {k: groups[k] for k in ("ovs-vswitchd", "controller")}
    time.sleep(1.0)
    before = {k: sum(_cpu_s(p) for p in pids) for k, pids in watched.items()}
    time.sleep(idle_s)
    return {k: round(100 * (sum(_cpu_s(p) for p in watched[k]) - v) / idle_s, 1) for k, v in before.items()}


def run_case(name: str, work: Path, opts: Options, repeat: int) -> dict[str, Any]:
    fabric = CASES[name]()
    runs = []
    for i in range(repeat):
        runs.append(bring_up(name, fabric, work, opts, i))
        print(f"{case_key(name, opts.shards, opts.crossing, opts.shells, opts.cables)} run {i + 1}/{repeat}: "
              f"{runs[-1]['error'] or 'ok'} {runs[-1]['phases_s']}", file=sys.stderr)  # fmt: skip
    patched = runs[0]["patch_cables"] > 0
    build = "lightnet (batched, shell-less)" if opts.shards == 1 else f"sharded ({opts.shards} ovs-vswitchd)"
    return {
        "fabric": fabric.summary(),
        "build": "mininet nodes (a shell each)" if opts.shells else build,
        "shards": opts.shards,
        "crossing": opts.crossing if opts.shards > 1 else None,
        "cables_in_shards": (("patch" if patched else "veth") if opts.shards > 1 else None),
        "scale": opts.scale,
        "repeat": repeat,
        "runs_failed": sum(1 for r in runs if r["error"] is not None),
        "summary": summary(runs),
        "runs": runs,
    }  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"of {', '.join(CASES)}")
    defaults = ", ".join(f"{k} {v}" for k, v in DEFAULT_SHARDS.items())
    help_ = f"ovs-vswitchd instances (1: the system OVS); default {defaults}, others 1"
    parser.add_argument("--shards", metavar="N[,N...]", help=help_)
    parser.add_argument("--crossing", choices=CROSSINGS, default="veth", help="cables between shards")
    parser.add_argument(
        "--cables",
        metavar="KIND[,KIND...]",
        default="auto",
        help=f"cables inside a shard, each a case of its own: {', '.join(CABLES)}",
    )
    parser.add_argument("--scale", default="400G=400M", help="link scale (none: unshaped links)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per case (default 1)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle CPU window after bring-up (0: none)")
    parser.add_argument("--ready-timeout", type=float, default=300.0, metavar="S")
    parser.add_argument("--baseline", action="store_true", help="also Mininet's node-by-node build")
    parser.add_argument("--out", type=out_file, help="also write the JSON here")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    if args.repeat < 1:
        parser.error(f"--repeat: {args.repeat}: must be at least 1")
    if args.idle_s < 0 or args.ready_timeout <= 0:
        parser.error("--idle-s must be >= 0 and --ready-timeout > 0")
    try:
        given = [int(s) for s in args.shards.split(",")] if args.shards else None
    except ValueError:
        parser.error(f"--shards: {args.shards!r}: expected N or N,N,... (integers)")
    args.scale = None if args.scale == "none" else args.scale
    try:
        scale = Scale.parse(args.scale) if args.scale is not None else None
    except ValueError as exc:
        parser.error(f"--scale: {exc}")
    args.cables = args.cables.split(",")
    for cables in args.cables:
        try:
            uses_patch(cables, shaped=scale is not None)
        except ValueError as exc:
            parser.error(f"--cables: {exc}" + ("; add --scale none" if cables == "patch" else ""))
    args.plan = []
    for name in cases:
        counts = given or [DEFAULT_SHARDS.get(name, 1)]
        switches = len(CASES[name]().switches)
        bad = [n for n in counts if not 1 <= n <= switches]
        if bad:
            parser.error(f"--shards: {bad[0]} for {name}: must be 1..{switches} (its switches)")
        args.plan += [(name, n) for n in counts]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    reason = mininet_available()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    daemon = OvsDaemon()
    daemon.ensure_running()
    results: dict[str, Any] = {
        "target": "k8 all pairs verified < 60 s; k16 and rail1024 < 120 s",
        "cpus": os.cpu_count(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="fabriclab-emu-") as tmp:
            for name, shards in args.plan:
                for cables in args.cables if shards > 1 else ["auto"]:
                    opts = Options(shards, args.crossing, False, args.idle_s, args.ready_timeout, cables,
                                   args.scale)  # fmt: skip
                    key = case_key(name, shards, args.crossing, cables=cables)
                    results[key] = run_case(name, Path(tmp), opts, args.repeat)
            for name in dict.fromkeys(n for n, _ in args.plan) if args.baseline else ():
                opts = Options(1, args.crossing, True, args.idle_s, args.ready_timeout, scale=args.scale)
                results[case_key(name, 1, args.crossing, True)] = run_case(name, Path(tmp), opts, args.repeat)
    finally:
        daemon.stop_if_started()
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(results, indent=2)
    print(text)
    if args.out is not None:
        write_out(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
