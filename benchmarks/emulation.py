"""Emulation bring-up benchmark: Mininet + userspace OVS + the controller, per fabric.  Prints JSON.

Phases (seconds from the start): Mininet built, switches connected to the controller, tables installed on
every switch (barrier-confirmed), all pairs verified (a frame between every pair of hosts, through the
controller's tables).  Peak resident memory of ovs-vswitchd, the controller process and this process (which
holds Mininet) is sampled during bring-up; idle CPU of ovs-vswitchd and the controller is measured over a
few seconds after it.

    python benchmarks/emulation.py            # k=4, k=8 fat-trees and a 64-GPU rail fabric
    python benchmarks/emulation.py --cases k4
Needs root, Open vSwitch and Mininet (Debian's mnexec).
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
}


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


def bring_up(name: str, fabric: Fabric, work: Path, idle_s: float) -> dict[str, Any]:
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
        fabric, addresses, controller=ctl.openflow, scale=Scale.parse("400G=400M"), name_prefix=prefix
    )
    start = time.perf_counter()
    try:
        net.start()
        phases["mininet_built_s"] = net.timings["mininet_build_s"]
        phases["mininet_started_s"] = net.timings["mininet_start_s"]
        n = len(fabric.switches)
        while ctl.get("health")["switches_connected"] < n:
            time.sleep(0.05)
        phases["switches_connected_s"] = time.perf_counter() - start
        ctl.ready(n)
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
    finally:
        stop.set()
        net.stop()
        ctl.stop()
    return {
        "fabric": fabric.summary(),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "pairs": len(pairs),
        "pairs_reachable": sum(pairs.values()),
        "flows_installed": sum(s["flows"] or 0 for s in flows),
        "groups_installed": sum(s["groups"] or 0 for s in flows),
        "peak_rss_mb": {k: round(v) for k, v in peak.items()},
        "peak_rss_total_mb": round(peak_total[0]),
        "idle_cpu": idle,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--idle-s", type=float, default=5.0)
    args = parser.parse_args()
    reason = mininet_available()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    daemon = OvsDaemon()
    daemon.ensure_running()
    results: dict[str, Any] = {"target": "k8 all pairs verified < 60 s", "cpus": os.cpu_count()}
    try:
        with tempfile.TemporaryDirectory(prefix="fabriclab-emu-") as tmp:
            for name in args.cases.split(","):
                results[name] = bring_up(name, CASES[name](), Path(tmp), args.idle_s)
    finally:
        daemon.stop_if_started()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
