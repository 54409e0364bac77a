"""Controller benchmark on real Open vSwitch (userspace datapath).  Prints one JSON document.

1. `flow_rate`: flow-mods per second to one bridge, confirmed by barrier — our southbound (struct-packed
   flow-mods, one buffer and one barrier per batch) against two baselines in the same process: os-ken's
   serializer with one barrier per batch, and a barrier after every flow-mod.
2. `reroute`: controller-side reroute latency on k=4 and k=8 fat-trees over seeded random switch-to-switch
   link failures: port-status received to recomputed (`computed_ms`), to every new entry barrier-confirmed
   on every switch (`installed_ms`: the new paths are in place) and to the unused entries deleted and
   confirmed too (`cleaned_ms`, make-before-break's second phase).
3. `loss_window`: data-plane loss when the first uplink of a UDP probe's path is cut, measured at the
   receiver by sequence numbers, with fast-failover groups (switch-local) and without (controller
   recomputes) — the same failures in the same run.

    python benchmarks/controlplane.py            # everything (several minutes)
    python benchmarks/controlplane.py --quick    # smaller counts, k=4 only
    python benchmarks/controlplane.py --parts flow_rate,reroute
Needs root and Open vSwitch; starts OVS if it is not running (and stops it again).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The repository first, before this script's own folder (whose emulation.py would shadow the package).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent)]

from controller.rest.client import wait_for  # noqa: E402
from controller.sm.intents import FlowIntent, SwitchDelta, cookie_of, match  # noqa: E402
from controller.sm.manager import SubnetManager  # noqa: E402
from emulation.controlproc import ControllerProcess, free_port  # noqa: E402
from emulation.ovs import OvsDaemon, OvsFabric, ovs_available  # noqa: E402
from topologies.generators import fat_tree  # noqa: E402
from topologies.loader import dump_yaml  # noqa: E402

PROBE = str(ROOT / "emulation" / "probe.py")


def _pcts(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "max": round(ordered[-1], 2),
        "mean": round(statistics.fmean(ordered), 2),
    }


# --- 1. flow programming rate ---------------------------------------------------------------------------


class _Listener:
    def __init__(self) -> None:
        self.connected = threading.Event()
        self.dpid = 0

    def switch_connected(self, dpid: int, now: float) -> None:
        self.dpid = dpid
        self.connected.set()

    def switch_disconnected(self, dpid: int, now: float) -> None: ...
    def port_status(self, dpid: int, port: int, live: bool | None, now: float) -> None: ...
    def link_seen(self, *args: Any) -> None: ...
    def arp_request(self, *args: Any) -> None:
        return None


def flow_rate(n_flows: int, n_baseline: int) -> dict[str, Any]:
    from controller.southbound import openflow  # noqa: PLC0415
    from controller.southbound.app import start_openflow  # noqa: PLC0415

    listener = _Listener()
    port = free_port()
    runtime = start_openflow(listener, "127.0.0.1", port)
    bridge, dpid = "flbench0", 0x02FAB1FF00000001
    settings = ["datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
                f"other-config:datapath-id={dpid:016x}"]  # fmt: skip
    subprocess.run(
        ["ovs-vsctl", "--", "--if-exists", "del-br", bridge, "--", "add-br", bridge,
         "--", "set", "Bridge", bridge, *settings, "--", "set-controller", bridge, f"tcp:127.0.0.1:{port}"],
        check=True,
    )  # fmt: skip
    try:
        if not listener.connected.wait(15):
            raise RuntimeError("bridge did not connect")
        app = runtime.app

        def flows(n: int, offset: int) -> list[FlowIntent]:
            return [
                FlowIntent(
                    0, 100, match(eth_dst=0x02FAB1100000 + offset + i), (("output", 1 + i % 8),), cookie_of(1)
                )
                for i in range(n)
            ]

        batch = flows(n_flows, 0)
        start = time.perf_counter()
        problems = app.push({dpid: SwitchDelta("b", dpid, add_flows=tuple(batch))}, "make", timeout_s=120)
        ours_s = time.perf_counter() - start
        assert not problems, problems
        installed = _count_flows(bridge)
        start = time.perf_counter()
        app.push({dpid: SwitchDelta("b", dpid, delete_flows=tuple(batch))}, "break", timeout_s=120)
        delete_s = time.perf_counter() - start
        slow = flows(n_flows, 1 << 21)
        dp = app._dp(dpid)
        start = time.perf_counter()
        buf, _ = openflow.serialize(dp, [openflow.flow_add(dp, f, fast=False) for f in slow])
        dp.send(buf)
        app._request(dpid, openflow.barrier, 120)
        osken_s = time.perf_counter() - start
        baseline = flows(n_baseline, 1 << 20)
        start = time.perf_counter()
        for flow in baseline:
            problems = app.push({dpid: SwitchDelta("b", dpid, add_flows=(flow,))}, "make", timeout_s=30)
            assert not problems, problems
        base_s = time.perf_counter() - start
        return {
            "flows": n_flows,
            "installed_on_switch": installed,
            "batched_barrier_s": round(ours_s, 3),
            "flow_mods_per_s": round(n_flows / ours_s),
            "deletes_per_s": round(n_flows / delete_s),
            "baseline_barrier_per_flow": {"flows": n_baseline, "flow_mods_per_s": round(n_baseline / base_s)},
            "ratio_vs_baseline": round((n_flows / ours_s) / (n_baseline / base_s), 1),
            "osken_serializer_one_barrier": {"flows": n_flows, "flow_mods_per_s": round(n_flows / osken_s)},
            "ratio_vs_osken_serializer": round(osken_s / ours_s, 1),
        }
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], check=False)
        runtime.stop()


def _count_flows(bridge: str) -> int:
    out = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", bridge],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(1 for line in out.splitlines() if "priority=100" in line)


# --- fabric + controller process ------------------------------------------------------------------------


class Lab:
    def __init__(self, k: int, workdir: Path, *controller_args: str) -> None:
        self.fabric = fat_tree(k)
        topology = workdir / f"ft{k}.yaml"
        topology.write_text(dump_yaml(self.fabric))
        sm = SubnetManager(self.fabric)
        self.addresses = sm.addresses.as_strings()
        self.ctl = ControllerProcess(
            topology, workdir / f"state{k}", workdir / f"controller{k}.log", *controller_args
        )
        self.net = OvsFabric(self.fabric, self.addresses, controller=None)
        self.bringup_s = 0.0

    def __enter__(self) -> Lab:
        start = time.perf_counter()
        self.ctl.start()
        self.net.up()
        self.net.set_controller(self.ctl.openflow)
        self.ctl.ready(len(self.fabric.switches))
        self.bringup_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.ctl.proc is not None:
                self.ctl.stop()
        finally:
            self.net.down()

    def last_event(self) -> int:
        events = self.ctl.get("events")
        return int(events[-1]["id"]) if events else 0

    def wait_event(self, kind: str, since: int) -> dict[str, Any]:
        found: list[dict[str, Any]] = wait_for(
            lambda: [e for e in self.ctl.get(f"events?since={since}") if e["kind"] == kind], 30, kind
        )
        return found[0]


# --- 2. reroute latency ---------------------------------------------------------------------------------


def reroute(k: int, failures: int, seed: int, workdir: Path) -> dict[str, Any]:
    with Lab(k, workdir) as lab:
        fabric = lab.fabric
        links = [
            lk
            for lk in fabric.links
            if fabric.nodes[lk.a.node].is_switch and fabric.nodes[lk.b.node].is_switch
        ]
        rng = random.Random(seed)
        installed, computed, cleaned, mods = [], [], [], []
        for link in rng.sample(links, min(failures, len(links))):
            since = lab.last_event()
            lab.net.set_link(link.b.node, link.b.port, up=False)
            event = lab.wait_event("port_down", since)
            installed.append(event["installed_ms"])
            computed.append(event["computed_ms"])
            cleaned.append(event["cleaned_ms"])
            mods.append(event["flow_mods"])
            since = lab.last_event()
            lab.net.set_link(link.b.node, link.b.port, up=True)
            lab.wait_event("port_up", since)
            lab.ctl.ready(len(fabric.switches))
        return {
            "fabric": fabric.summary(),
            "bringup_s": round(lab.bringup_s, 2),
            "failures": len(installed),
            "installed_ms": _pcts(installed),
            "computed_ms": _pcts(computed),
            "cleaned_ms": _pcts(cleaned),
            "flow_mods_per_event": _pcts([float(m) for m in mods]),
            "target_ms": 500,
        }


# --- 3. loss window -------------------------------------------------------------------------------------


def loss_window(failures: int, rate_pps: int, workdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"rate_pps": rate_pps, "resolution_ms": round(1000 / rate_pps, 3)}
    with Lab(4, workdir) as lab:
        src, dst = "h1", "h16"
        dst_ip = lab.addresses[(dst, 1)][1]
        lab.net.run(
            src, ["ping", "-n", "-c", "2", "-W", "1", dst_ip], capture_output=True
        )  # resolve ARP first
        for mode, body in (
            ("fast_failover", '{"fast_failover": true}'),
            ("controller_only", '{"fast_failover": false}'),
        ):
            status, reply = lab.ctl.request("PUT", "routing", body)
            assert status == 200, reply
            lab.ctl.ready(len(lab.fabric.switches))
            windows = []
            for _ in range(failures):
                hops = lab.ctl.get(f"routes?src={src}&dst={dst}")["hops"]
                leaf, out_port = hops[1]["node"], hops[1]["out_port"]
                far = lab.fabric.peer(leaf, out_port)
                assert far is not None
                windows.append(_probe_failure(lab, src, dst, dst_ip, rate_pps, far.node, far.port))
                since = lab.last_event()
                lab.net.set_link(far.node, far.port, up=True)
                lab.wait_event("port_up", since)
                lab.ctl.ready(len(lab.fabric.switches))
                time.sleep(0.2)
            result[mode] = _pcts(windows)
    ff, ctl = result["fast_failover"], result["controller_only"]
    result["ratio_controller_only_vs_ff_p50"] = round(ctl["p50"] / ff["p50"], 1) if ff.get("p50") else None
    result["reference_raw_ovs_ff_ms"] = "7-14 (issue's measurement)"
    return result


def _probe_failure(lab: Lab, src: str, dst: str, dst_ip: str, rate: int, node: str, port: int) -> float:
    port_no, duration = 5999, 1.6
    recv_argv = [sys.executable, PROBE, "recv", str(port_no), str(duration + 0.8)]
    receiver = lab.net.popen(dst, recv_argv, stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "ready"
    send_argv = [sys.executable, PROBE, "send", dst_ip, str(port_no), str(rate), str(duration)]
    sender = lab.net.popen(src, send_argv, stdout=subprocess.PIPE, text=True)
    time.sleep(0.6)
    lab.net.set_link(node, port, up=False)
    sent = json.loads(sender.communicate(timeout=30)[0])["sent"]
    report = json.loads(receiver.communicate(timeout=30)[0])
    missing = sum(int(g["missing"]) for g in report["gaps"]) + max(0, int(sent) - 1 - int(report["max_seq"]))
    return 1000.0 * missing / rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="flow_rate,reroute,loss_window")
    parser.add_argument("--failures", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=int, default=10000, help="UDP probe rate (packets/s)")
    args = parser.parse_args()
    reason = ovs_available()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    failures = args.failures or (5 if args.quick else 20)
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {"machine": {"cpus": _cpus()}, "quick": args.quick}
    daemon = OvsDaemon()
    daemon.ensure_running()
    try:
        with tempfile.TemporaryDirectory(prefix="fabriclab-bench-") as tmp:
            work = Path(tmp)
            if "flow_rate" in parts:
                report["flow_rate"] = flow_rate(2000 if args.quick else 10000, 200 if args.quick else 1000)
            if "reroute" in parts:
                report["reroute"] = {
                    f"k{k}": reroute(k, failures, args.seed, work) for k in ((4,) if args.quick else (4, 8))
                }
            if "loss_window" in parts:
                report["loss_window"] = loss_window(failures, args.rate, work)
    finally:
        daemon.stop_if_started()
    print(json.dumps(report, indent=2))
    return 0


def _cpus() -> int:
    import os  # noqa: PLC0415

    return os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
