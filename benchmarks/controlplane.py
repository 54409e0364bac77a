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
4. `restore_loss`: packets lost while a cut cable comes back under traffic and the controller moves the
   probe's path back onto it (make-before-break: 0 is the target).

    python -m benchmarks.controlplane            # everything (several minutes)
    python -m benchmarks.controlplane --quick    # smaller counts, k=4 only
    python -m benchmarks.controlplane --parts flow_rate,reroute
Needs root and Open vSwitch; starts OVS if it is not running (and stops it again).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.out import out_file, percentiles, write_out
from controller.rest.client import wait_for
from controller.sm.intents import FlowIntent, SwitchDelta, cookie_of, match
from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess, free_port
from emulation.flows import missing_seqs
from emulation.ifflags import set_up
from emulation.ovs import OvsDaemon, OvsFabric, ovs_available
from topologies.generators import fat_tree
from topologies.loader import dump_yaml

ROOT = Path(__file__).resolve().parents[1]

PROBE = str(ROOT / "emulation" / "probe.py")


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

    removed = 0

    def flow_removed(self, *args: Any) -> None:
        self.removed += 1


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
        problems = app.push({dpid: SwitchDelta("b", dpid, delete_flows=tuple(batch))}, "break", timeout_s=120)
        delete_s = time.perf_counter() - start
        assert not problems, problems
        assert _count_flows(bridge) == 0
        # our deletes are not reported back (muted around them); one behind our back still is
        time.sleep(0.5)
        removed_by_ours = listener.removed
        app.push({dpid: SwitchDelta("b", dpid, add_flows=tuple(batch[:1]))}, "make", timeout_s=30)
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", bridge], check=True)
        deadline = time.monotonic() + 5
        while listener.removed == removed_by_ours and time.monotonic() < deadline:
            time.sleep(0.01)
        external_reported = listener.removed - removed_by_ours
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
            "flow_removed_after_our_deletes": removed_by_ours,
            "flow_removed_after_external_delete": external_reported,
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
            "installed_ms": percentiles(installed, mean=True),
            "computed_ms": percentiles(computed, mean=True),
            "cleaned_ms": percentiles(cleaned, mean=True),
            "flow_mods_per_event": percentiles([float(m) for m in mods], mean=True),
            "target_ms": 500,
        }


# --- 3. loss window -------------------------------------------------------------------------------------


def loss_window(failures: int, rate_pps: int, workdir: Path, cut: str = "far") -> dict[str, Any]:
    """Fast-failover groups against controller-only rerouting, in the same fabric and process, alternating
    in blocks of five so that both see the same machine load.  Each sample: a UDP probe h1 -> h16 at
    `rate_pps`, the first uplink of its path cut 0.6 s in (`cut`: "far" downs the agg end, so the leaf
    loses carrier as when the far switch dies; "both" downs both ends as a pulled cable does), and the loss
    window is the number of probes *sent* from 5 ms before the cut to 1 s after it that never arrived,
    over the rate (sequence numbers and send times: drops of a busy emulator elsewhere in the run do not
    count).  Probes lost before the cut are the emulator's own background loss: a sample with any is
    flagged, and the share of clean samples is reported."""
    result: dict[str, Any] = {"rate_pps": rate_pps, "resolution_ms": round(1000 / rate_pps, 3), "cut": cut}
    samples: dict[str, list[dict[str, float]]] = {"fast_failover": [], "controller_only": []}
    loads: list[float] = []
    with Lab(4, workdir) as lab:
        src, dst = "h1", "h16"
        dst_ip = lab.addresses[(dst, 1)][1]
        lab.net.run(src, ["ping", "-n", "-c", "2", "-W", "1", dst_ip], capture_output=True)  # ARP first
        blocks = max(1, -(-failures // 5))
        for block in range(blocks):
            for mode, body in (("fast_failover", '{"fast_failover": true}'),
                               ("controller_only", '{"fast_failover": false}')):  # fmt: skip
                status, reply = lab.ctl.request("PUT", "routing", body)
                assert status == 200, reply
                lab.ctl.ready(len(lab.fabric.switches))
                for _ in range(min(5, failures - 5 * block)):
                    hops = lab.ctl.get(f"routes?src={src}&dst={dst}")["hops"]
                    leaf, out_port = hops[1]["node"], hops[1]["out_port"]
                    far = lab.fabric.peer(leaf, out_port)
                    assert far is not None
                    loads.append(os.getloadavg()[0])
                    samples[mode].append(
                        _probe_change(
                            lab, (src, dst), rate_pps, (leaf, out_port), (far.node, far.port), cut, up=False
                        )
                    )
                    since = lab.last_event()
                    _set_cable(lab, (leaf, out_port), (far.node, far.port), cut, up=True)
                    lab.wait_event("port_up", since)
                    lab.ctl.ready(len(lab.fabric.switches))
                    time.sleep(0.2)
    for mode, rows in samples.items():
        windows = [r["window_ms"] for r in rows]
        clean = [r["window_ms"] for r in rows if r["background_lost"] == 0]
        result[mode] = {
            "loss_window_ms": percentiles(windows, mean=True),
            "clean_samples": len(clean),
            "loss_window_ms_clean_samples": percentiles(clean, mean=True),
            "controller_detected_ms": percentiles([r["detected_ms"] for r in rows], mean=True),
            "controller_installed_ms": percentiles([r["installed_ms"] for r in rows], mean=True),
            "reordered_packets": percentiles([r["reordered"] for r in rows], mean=True),
        }
    ff, ctl = result["fast_failover"]["loss_window_ms"], result["controller_only"]["loss_window_ms"]
    result["ratio_controller_only_vs_ff"] = {
        q: round(ctl[q] / ff[q], 2) if ff.get(q) else None for q in ("p50", "p95")
    }
    result["targets"] = {
        "ff_p95_below_ms": 15,
        "ff_p95_at_most_third_of_controller_only": True,
        "met": bool(ff and ctl and ff["p95"] < 15 and ff["p95"] * 3 <= ctl["p95"]),
    }
    result["load_avg_1min_during"] = percentiles(loads, mean=True)
    return result


def restore_loss(
    restores: int, rate_pps: int, workdir: Path, cut: str = "both", pair: tuple[str, str] = ("h1", "h3")
) -> dict[str, Any]:
    """Make-before-break on a cable restore, under traffic.  Each sample: the first uplink of the UDP
    probe's path (`pair`; by default inside one pod, where updating the leaf before the aggregation switch
    makes a loop) is cut (both ends by default, as a pulled cable) and the controller reroutes;
    then a probe runs at `rate_pps` and the cable comes back 0.6 s in; the controller recomputes with the
    cable and moves the probe's path back.  Counted: probes sent from 5 ms before the restore to 1 s after
    it that never arrived (target: 0 in every sample), and the same window's count before the restore is
    the emulator's background loss (a sample with any is flagged)."""
    rows: list[dict[str, float]] = []
    loads: list[float] = []
    with Lab(4, workdir) as lab:
        src, dst = pair
        dst_ip = lab.addresses[(dst, 1)][1]
        lab.net.run(src, ["ping", "-n", "-c", "2", "-W", "1", dst_ip], capture_output=True)  # ARP first
        for _ in range(restores):
            hops = lab.ctl.get(f"routes?src={src}&dst={dst}")["hops"]
            leaf, out_port = hops[1]["node"], hops[1]["out_port"]
            far = lab.fabric.peer(leaf, out_port)
            assert far is not None
            near_end, far_end = (leaf, out_port), (far.node, far.port)
            since = lab.last_event()
            _set_cable(lab, near_end, far_end, cut, up=False)
            lab.wait_event("port_down", since)
            lab.ctl.ready(len(lab.fabric.switches))
            loads.append(os.getloadavg()[0])
            rows.append(_probe_change(lab, (src, dst), rate_pps, near_end, far_end, cut, up=True))
            lab.ctl.ready(len(lab.fabric.switches))
            time.sleep(0.2)
    lost = [r["lost"] for r in rows]
    clean = [r for r in rows if r["background_lost"] == 0]
    return {
        "rate_pps": rate_pps,
        "cut": cut,
        "pair": f"{src} -> {dst}",
        "restores": len(rows),
        "lost_packets": percentiles(lost, mean=True),
        "restores_without_loss": sum(1 for x in lost if x == 0),
        "reordered_packets": percentiles([r["reordered"] for r in rows], mean=True),
        "restores_with_reordering": sum(1 for r in rows if r["reordered"]),
        "clean_samples": len(clean),
        "restores_without_loss_clean_samples": sum(1 for r in clean if r["lost"] == 0),
        "controller_installed_ms": percentiles([r["installed_ms"] for r in rows], mean=True),
        "samples": rows,
        "target": {"lost": 0, "of": len(rows), "met": all(x == 0 for x in lost)},
        "load_avg_1min_during": percentiles(loads, mean=True),
    }


def _set_cable(lab: Lab, near: tuple[str, int], far: tuple[str, int], cut: str, up: bool) -> None:
    """One ioctl per end (no `ip` process to start first: its ~2-3 ms would count as outage)."""
    for end in [far, near] if cut == "both" else [far]:
        set_up(lab.net.veth_of(*end), up)


def _probe_change(
    lab: Lab,
    pair: tuple[str, str],
    rate: int,
    near: tuple[str, int],
    far: tuple[str, int],
    cut: str,
    up: bool,
) -> dict[str, float]:
    """A probe src -> dst with the cable set down (or up) 0.6 s in: the loss window around the change."""
    port_no, duration = 5999, 1.6
    src, dst = pair
    dst_ip = lab.addresses[(dst, 1)][1]
    recv_argv = [sys.executable, PROBE, "recv", str(port_no), str(duration + 0.8)]
    receiver = lab.net.popen(dst, recv_argv, stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    assert receiver.stdout.readline().strip() == "ready"
    send_argv = [sys.executable, PROBE, "send", dst_ip, str(port_no), str(rate), str(duration)]
    sender = lab.net.popen(src, send_argv, stdout=subprocess.PIPE, text=True)
    time.sleep(0.6)
    since = lab.last_event()
    changed_at = time.time()
    _set_cable(lab, near, far, cut, up=up)
    sent = json.loads(sender.communicate(timeout=30)[0])
    report = json.loads(receiver.communicate(timeout=30)[0])
    event = lab.wait_event("port_up" if up else "port_down", since)
    window, background = outage(report, sent, changed_at, rate)
    return {
        "window_ms": window,
        "lost": round(window * rate / 1000),
        "background_lost": background,
        # arrived behind a later packet (the path changed under the flow): late, not lost
        "reordered": int(report["out_of_order"]),
        "detected_ms": round(1000 * (event["detected_at"] - changed_at), 2),
        "installed_ms": float(event["installed_ms"]),
    }


def outage(report: dict[str, Any], sent: dict[str, Any], cut_at: float, rate: float) -> tuple[float, int]:
    """(loss window in ms, probes lost before the cut): missing sequence numbers, placed in time by when
    the sender sent them (seq / rate after its start)."""
    missing = missing_seqs(report["gaps"])
    missing += range(int(report["max_seq"]) + 1, int(sent["sent"]))
    sent_at = [float(sent["start"]) + seq / rate for seq in missing]
    window = sum(1 for t in sent_at if cut_at - 0.005 <= t <= cut_at + 1.0)
    background = sum(1 for t in sent_at if t < cut_at - 0.005)
    return round(1000.0 * window / rate, 2), background


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="flow_rate,reroute,loss_window,restore_loss")
    parser.add_argument("--failures", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rate",
        type=int,
        default=2000,
        help="UDP probe rate (packets/s; default 2000 = 0.5 ms resolution, within what the "
        "emulator carries cleanly on 2 cores: see `fabriclab emulate calibrate`)",
    )
    parser.add_argument(
        "--cut",
        choices=("far", "both"),
        default="far",
        help="loss_window: down the far end of the cable (the leaf loses carrier) or both ends",
    )
    parser.add_argument("--out", type=out_file, help="also write the JSON here")
    args = parser.parse_args()
    reason = ovs_available()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    failures = args.failures or (5 if args.quick else 20)
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {
        "machine": {"cpus": _cpus(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "quick": args.quick,
        "command": " ".join(sys.argv),
    }
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
                report["loss_window"] = loss_window(failures, args.rate, work, args.cut)
            if "restore_loss" in parts:
                report["restore_loss"] = restore_loss(failures, args.rate, work)
    finally:
        daemon.stop_if_started()
    report["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        write_out(args.out, text)
    return 0


def _cpus() -> int:
    import os  # noqa: PLC0415

    return os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
