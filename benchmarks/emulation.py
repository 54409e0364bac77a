"""Emulation bring-up benchmark: Mininet + userspace OVS + the controller, per fabric.  Prints JSON.

Phases (seconds from the start): Mininet built, switches connected to the controller, tables installed on
every switch (barrier-confirmed), all pairs verified (a frame between every pair of hosts, through the
controller's tables).  Peak resident memory of ovs-vswitchd, the controller process and this process (which
holds Mininet) is sampled during bring-up; idle CPU of ovs-vswitchd and the controller is measured over a
few seconds after it.

    python benchmarks/emulation.py            # k=4, k=8 fat-trees and a 64-GPU rail fabric
    python benchmarks/emulation.py --cases k4
    python benchmarks/emulation.py --cases k16,rail1024 --out benchmarks/results/emulation-scale.json
    python benchmarks/emulation.py --cases k4,k8 --baseline   # also Mininet's own nodes, same process
Needs root, Open vSwitch and Mininet (Debian's mnexec).  The build is `emulation.lightnet` (batched `ip`,
one OVSDB transaction, shell-less hosts); `--baseline` also times Mininet's node-by-node build (a bash per
node) of the same fabric, as `emulate up` did before.  A case that does not reach a phase within
`--ready-timeout` records the error and how far it got; teardown seconds are recorded too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The repository first, before this script's own folder (whose emulation.py would shadow the package).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent)]

from controller.sm.manager import SubnetManager  # noqa: E402
from emulation.controlproc import ControllerProcess  # noqa: E402
from emulation.mesh import check_all_pairs  # noqa: E402
from emulation.mnfabric import MininetFabric, Scale, mininet_available  # noqa: E402
from emulation.ovs import OvsDaemon  # noqa: E402
from topologies.generators import fat_tree, rail  # noqa: E402
from topologies.loader import dump_yaml  # noqa: E402
from topologies.model import Fabric  # noqa: E402

CASES: dict[str, Callable[[], Fabric]] = {
    "k4": lambda: fat_tree(4),
    "k8": lambda: fat_tree(8),
    "rail64": lambda: rail(servers=8, gpus=8),
    "k16": lambda: fat_tree(16),
    "rail1024": lambda: rail(servers=32, gpus=8, groups=4),
}
DEFAULT_CASES = "k4,k8,rail64"


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
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _vswitchd_pid() -> int:
    return int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text().strip())


def bring_up(
    name: str, fabric: Fabric, work: Path, idle_s: float, shells: bool = False, ready_timeout_s: float = 300
) -> dict[str, Any]:
    topology = work / f"{name}.yaml"
    topology.write_text(dump_yaml(fabric))
    sm = SubnetManager(fabric)
    addresses = sm.addresses.as_strings()
    ctl = ControllerProcess(topology, work / f"state-{name}", work / f"controller-{name}.log")
    ctl.start()
    assert ctl.proc is not None
    pids = {
        "ovs-vswitchd": _vswitchd_pid(),
        "controller": ctl.proc.pid,
        "mininet (this process)": os.getpid(),
    }
    peak = dict.fromkeys(pids, 0.0)
    peak_total = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            values = {k: _rss_mb(p) for k, p in pids.items()}
            for k, v in values.items():
                peak[k] = max(peak[k], v)
            peak_total[0] = max(peak_total[0], sum(values.values()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    phases: dict[str, float] = {}
    prefix = f"b{os.getpid() % 10000}"  # names of its own: other fabrics may share this OVS
    net = MininetFabric(
        fabric, addresses, controller=ctl.openflow, scale=Scale.parse("400G=400M"), name_prefix=prefix,
        shells=shells,
    )  # fmt: skip
    start = time.perf_counter()
    load_before = os.getloadavg()
    pairs: dict[tuple[str, str], bool] = {}
    flows: list[dict[str, Any]] = []
    idle: dict[str, float] = {}
    error = None
    build: dict[str, float] = {}
    try:
        net.start()
        build = {k: round(v, 2) for k, v in net.timings.items()}
        phases["mininet_built_s"] = net.timings["mininet_build_s"]
        phases["mininet_started_s"] = net.timings["mininet_start_s"]
        n = len(fabric.switches)
        deadline = start + ready_timeout_s
        while ctl.get("health")["switches_connected"] < n:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{ctl.get('health')['switches_connected']}/{n} switches connected")
            time.sleep(0.05)
        phases["switches_connected_s"] = time.perf_counter() - start
        ctl.ready(n, timeout_s=max(1.0, deadline - time.perf_counter()))
        phases["tables_installed_s"] = time.perf_counter() - start
        pairs = check_all_pairs(net.endpoints())
        phases["all_pairs_verified_s"] = time.perf_counter() - start
        stop.set()
        sampler.join()
        time.sleep(1.0)
        cpu0 = {k: _cpu_s(p) for k, p in pids.items() if k != "mininet (this process)"}
        time.sleep(idle_s)
        idle = {f"{k}_pct": round(100 * (_cpu_s(pids[k]) - v) / idle_s, 1) for k, v in cpu0.items()}
        flows = ctl.get("switches")
    except Exception as exc:  # a case that does not come up is a result: recorded
        error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        stop.set()
        load_during = os.getloadavg()
        torn = time.perf_counter()
        net.stop()
        teardown_s = time.perf_counter() - torn
        ctl.stop()
    return {
        "fabric": fabric.summary(),
        "build": "mininet nodes (a shell each)" if shells else "lightnet (batched, shell-less)",
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "build_steps_s": build,
        "teardown_s": round(teardown_s, 2),
        "error": error,
        "pairs": len(pairs),
        "pairs_reachable": sum(pairs.values()),
        "flows_installed": sum(s["flows"] or 0 for s in flows),
        "groups_installed": sum(s["groups"] or 0 for s in flows),
        "peak_rss_mb": {k: round(v) for k, v in peak.items()},
        "peak_rss_total_mb": round(peak_total[0]),
        "idle_cpu": idle,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in load_during],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"of {', '.join(CASES)}")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--ready-timeout", type=float, default=300.0, metavar="S")
    parser.add_argument("--baseline", action="store_true", help="also Mininet's node-by-node build")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
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
            for name in args.cases.split(","):
                results[name] = bring_up(name, CASES[name](), Path(tmp), args.idle_s,
                                         ready_timeout_s=args.ready_timeout)  # fmt: skip
                if args.baseline:
                    results[f"{name}_baseline"] = bring_up(name, CASES[name](), Path(tmp), args.idle_s, True,
                                                           args.ready_timeout)  # fmt: skip
    finally:
        daemon.stop_if_started()
    text = json.dumps(results, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
