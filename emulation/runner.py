"""Runs a scenario on Mininet with the controller, and writes what a person wants to look at.

Per repetition: a fresh controller process and Mininet fabric, the all-pairs check, traffic (sequence-
numbered UDP probes inside the hosts), faults at their times on the real interfaces, and OVS port counters
polled through the controller's REST API at a fixed interval.  Then everything is torn down (only what this
run created) and the results folder gets `summary.json` (every figure), `report.md`, and PNG plots: link
utilisation over time (heatmap), per-flow throughput, and loss windows around faults.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.formats.partitions_file import load_partitions
from controller.sm.manager import SubnetManager
from emulation import ccrun, fleet, isolation, probe, rocerun
from emulation.agents import LocalAgents
from emulation.cluster import ClusterFabric
from emulation.controlproc import ControllerProcess
from emulation.headroom import (
    Counters,
    TxBufferSampler,
    assess,
    capacity_ratio,
    modelled_delay_bound_ms,
    sender_late_bound_ms,
    snapshot_of,
)
from emulation.mesh import check_all_pairs
from emulation.mnfabric import MininetFabric
from emulation.qosreport import class_summary
from emulation.report import write_outputs
from emulation.sharded import ShardedFabric
from labspec.scenario import FlowPlan, Scenario, ScenarioError, emulator_refuses
from topologies.tiers import Tiers

BASE_PORT = 6000
Progress = Callable[[float, str], None]
#: How far ahead a run across machines sets its start time (each machine's fleet is told by a Dask call).
CLUSTER_START_MARGIN_S = 1.0
#: Loss in the second after a fault is the fault's (failover, reroute), not the emulator's.
FAULT_WINDOW_S = 1.0


def offered_load(scenario: Scenario, flows: list[FlowPlan]) -> dict[str, float]:
    """Packets per second the scenario asks of the emulator: the busiest host's and all hosts' together."""
    per_host: dict[str, float] = {}
    for flow in flows:
        per_host[flow.src] = per_host.get(flow.src, 0.0) + flow.rate_pps
    for host, rate in rocerun.rates(rocerun.prepare(scenario)).items():
        per_host[host] = per_host.get(host, 0.0) + rate
    return {
        "per_host": max(per_host.values(), default=0.0),
        "total": sum(per_host.values()),
        "senders": float(len(per_host)),
    }


def capacity_warnings(scenario: Scenario, capacity: dict[str, Any] | None) -> list[str]:
    """What to tell the user before running: the load asked for against the calibrated capacity."""
    offered = offered_load(scenario, scenario.flows(0))
    if capacity is None:
        return [
            f"no calibration of {scenario.fabric.name} on this machine (`fabriclab emulate calibrate "
            f"TOPOLOGY`): cannot tell in advance whether it carries {offered['per_host']:g} pkt/s per host "
            f"({offered['total']:g} in total); the run still measures its own headroom"
        ]
    per_host, total = float(capacity["per_host_pps"]), float(capacity["total_pps"])
    if capacity_ratio(offered, capacity) <= 1.0:
        return []
    return [
        f"the scenario asks for {offered['per_host']:g} pkt/s per host ({offered['total']:g} in total), "
        f"above the clean capacity calibrated on this machine ({per_host:g} per host, {total:g} in total, "
        f"{capacity.get('measured_at', '?')}): expect the emulator, not the modelled fabric, to drop packets"
    ]


def run_scenario(
    scenario: Scenario,
    out_dir: Path,
    progress: Progress | None = None,
    capacity: dict[str, Any] | None = None,
    write: bool = True,
    shards: int = 1,
    crossing: str = "veth",
    cluster: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    """Run every repetition and write the results folder (unless `write` is False: a comparison writes its
    own).  `capacity` is the fabric's calibration (`emulation.calibrate`), if there is one: the load asked
    for is compared with it.  `shards`/`crossing`: the fabric on several ovs-vswitchd
    (`emulation.sharded`); `cluster`: (Dask scheduler, address the workers reach the controller at or
    None) to place those shards on the scheduler's emulation workers (`emulation.cluster`)."""
    refused = emulator_refuses(scenario) or ccrun.refuses(scenario, shards)
    refused = refused or (cluster_refuses(scenario) if cluster is not None else None)
    if refused:  # before anything is built or written
        raise ScenarioError(refused, file=str(scenario.file))
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = progress or (lambda fraction, what: None)
    warnings = capacity_warnings(scenario, capacity)
    reps = []
    for rep in range(scenario.spec.repetitions):

        def rep_progress(fraction: float, what: str, rep: int = rep) -> None:
            total = scenario.spec.repetitions
            progress((rep + fraction) / total, f"rep {rep + 1}/{total}: {what}")

        reps.append(_run_once(scenario, rep, out_dir / f"rep{rep + 1}", rep_progress, capacity,
                              (shards, crossing), cluster))  # fmt: skip
    overloaded = [r["repetition"] for r in reps if r["headroom"]["emulator_overloaded"]]
    summary = {
        "scenario": scenario.spec.name,
        "file": str(scenario.file),
        "fabric": scenario.fabric.summary(),
        "seed": scenario.spec.seed,
        "controller": scenario.spec.controller.model_dump(),
        "scale": scenario.spec.scale,
        "duration_s": scenario.spec.duration_s,
        "cc": scenario.spec.cc,
        "shards": _shards_summary(shards, crossing, cluster),
        "emulator_overloaded": bool(overloaded),
        "overloaded_repetitions": overloaded,
        "capacity": capacity,
        "warnings": warnings,
        "repetitions": reps,
    }
    if write:
        write_outputs(summary, out_dir)
    progress(1.0, "done")
    return summary


def _shards_summary(shards: int, crossing: str, cluster: tuple[str, str | None] | None) -> Any:
    if shards < 2:
        return None
    if cluster is not None:
        return {"count": shards, "crossing": "vxlan", "dask": cluster[0]}
    return {"count": shards, "crossing": crossing}


def cluster_refuses(scenario: Scenario) -> str | None:
    """Why `scenario` cannot run across machines yet (None: it can).  Its UDP flows, RoCE jobs, faults,
    shaped links, QoS queues and partitions can; DCQCN's ECN markers run on one machine only."""
    if scenario.spec.cc == "dcqcn":
        return "cc: dcqcn runs on one machine only (its ECN marking sits on the switch ports there)"
    return None


def run_name_prefix() -> str:
    """Node names of this process's runs (r<pid>s0, r<pid>h3, ...): a scenario may run beside a fabric of
    the same topology in its network namespace and OVS (`compose exec fabric fabriclab scenario run`)."""
    return f"r{os.getpid() % 10000}"


def _run_once(
    scenario: Scenario,
    rep: int,
    work: Path,
    progress: Progress,
    capacity: dict[str, Any] | None,
    sharding: tuple[int, str] = (1, "veth"),
    cluster: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    spec, fabric = scenario.spec, scenario.fabric
    sm = SubnetManager(fabric)
    addresses = sm.addresses.as_strings()
    file = scenario.partitions_file
    partitions = load_partitions(file, fabric) if file is not None else None
    isolated: dict[str, Any] | None = None
    args = spec.controller.controller_args()
    args += ["--stats-interval", str(spec.poll_interval_s)]
    args += ["--capacity-scale", str(scenario.scale)] if scenario.scale is not None else []
    args += ["--partitions", str(scenario.partitions_file)] if scenario.partitions_file is not None else []
    topology = (scenario.file.parent / spec.topology).resolve()
    args += ["--qos", str((scenario.file.parent / spec.qos).resolve())] if spec.qos is not None else []
    kwargs: dict[str, Any] = {
        "scale": scenario.scale,
        "name_prefix": run_name_prefix(),
        "qos": scenario.qos,
        "buffer_packets": spec.buffer_packets,
        "burst_bytes": spec.burst_bytes,
    }
    of_host: str | None = None
    net: MininetFabric | ClusterFabric
    if cluster is not None:
        net = ClusterFabric(fabric, addresses, sharding[0], *cluster, **kwargs)
        of_host = net.prepare_control()  # the controller listens where the workers reach it
    elif sharding[0] > 1:
        sharded = ShardedFabric(fabric, addresses, *sharding, **kwargs)
        net = sharded
        of_host = sharded.prepare_control()  # the controller listens on the shards' network
    else:
        net = MininetFabric(fabric, addresses, **kwargs)
    ctl = ControllerProcess(topology, work / "state", work / "controller.log", *args, of_host=of_host)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    progress(0.0, "starting controller")
    try:
        ctl.start()
    except BaseException:
        net.stop()
        raise
    net.controller = ctl.openflow
    try:
        progress(0.02, "building the fabric")
        try:
            net.start()
        except UnicodeDecodeError:  # Mininet's RemoteController probe decodes the OpenFlow HELLO as text
            net.start()  # start() tore down what it built; once more (the reliability work removes the probe)
        timings.update({k: round(v, 3) for k, v in net.timings.items()})
        ctl.ready(len(fabric.switches))
        timings["tables_installed_s"] = round(time.perf_counter() - start, 3)
        pairs = net.check_all_pairs() if isinstance(net, ClusterFabric) else check_all_pairs(net.endpoints())
        timings["all_pairs_verified_s"] = round(time.perf_counter() - start, 3)
        bad = [f"{s}->{d}" for (s, d), ok in pairs.items() if not ok]
        progress(0.1, f"{len(pairs) - len(bad)}/{len(pairs)} pairs reachable")
        flows = scenario.flows(rep)
        drops_before = _read_drops(net) if partitions is not None else {}
        placement = {f.name: _placement(ctl, f) for f in flows}
        since = int(ctl.get("events")[-1]["id"]) if ctl.get("events") else 0
        before = _counters(net)
        sampler = TxBufferSampler()
        try:
            measured = _traffic_and_faults(scenario, net, ctl, flows, progress, work)
        finally:
            tx_buffer_peak = sampler.stop()
        after = _counters(net)
        for host, drops in measured["receiver_socket_drops"].items():  # their sockets are closed by now
            after.host_socket_drops[host] = after.host_socket_drops.get(host, 0) + drops
        faulted = _faulted_interfaces(scenario, net)
        if partitions is not None:
            macs = {mac: host for (host, _), (mac, _) in addresses.items()}
            isolated = isolation.report(partitions, macs, drops_before, _read_drops(net), pairs)
        events = [e for e in ctl.get(f"events?since={since}&limit=1000") if e["kind"] != "switch_connect"]
    finally:
        net.stop()
        ctl.stop()
    flow_results = _flow_results(flows, placement, measured["senders"], measured["receivers"])
    offered = sum(int(f["sent"]) for f in flow_results)
    offered += sum(int(m["sent"]) for m in measured["roce_messages"])
    p99s = [f["latency_ms"]["p99"] for f in flow_results if f.get("latency_ms")]
    received = sum(int(f["received"]) for f in flow_results)
    received += sum(int(m["received"]) for m in measured["roce_messages"])
    headroom = assess(before, after, offered, faulted, max(p99s, default=None),
                      offered_load(scenario, flows), capacity, received_packets=received,
                      fault_window_losses=_fault_window_losses(flow_results, measured["faults"]),
                      tx_buffer_peak=tx_buffer_peak,
                      delay_bound_ms=_delay_bound_ms(scenario, flows),
                      senders_late_ms=_senders_late(scenario, flow_results),
                      partition_drops=_partition_drops(isolated))  # fmt: skip
    return {
        "repetition": rep + 1,
        "timings_s": timings,
        "all_pairs": {"pairs": len(pairs), "reachable": len(pairs) - len(bad), "unreachable": bad[:50]},
        "flows": flow_results,
        "headroom": headroom,
        "collectives": measured["collectives"],
        "replays": measured["replays"],
        "roce_messages": measured["roce_messages"],
        "faults": measured["faults"],
        "loss_windows": _loss_windows(flows, measured["receivers"], measured["faults"]),
        "events": events,
        "utilisation": measured["utilisation"],
        "cc": measured["cc"],
        **({"isolation": isolated} if isolated is not None else {}),
        **(
            {"qos_classes": class_summary(scenario.qos, flow_results, measured["collectives"])}
            if scenario.qos is not None
            else {}
        ),
    }


def _counters(net: MininetFabric | ClusterFabric) -> Counters:
    """The headroom counters of the whole fabric (of every machine's part)."""
    return net.counters() if isinstance(net, ClusterFabric) else snapshot_of(net)


def _read_drops(net: MininetFabric | ClusterFabric) -> isolation.Drops:
    return net.read_drops() if isinstance(net, ClusterFabric) else isolation.read_drops(net)


def _placement(ctl: ControllerProcess, flow: FlowPlan) -> str:
    """Where the controller sends the flow: the table's path, the path of its source port under a multipath
    policy, or "sprayed" when every packet has a port of its own."""
    if flow.spray is not None:
        return "sprayed"
    sport = f"&sport={flow.sport}" if flow.sport is not None else ""
    path: str = ctl.get(f"routes?src={flow.src}&dst={flow.dst}{sport}")["path"]
    return path


def _traffic_and_faults(
    scenario: Scenario,
    net: MininetFabric | ClusterFabric,
    ctl: ControllerProcess,
    flows: list[FlowPlan],
    progress: Progress,
    work: Path,
) -> dict[str, Any]:
    with rocerun.session(scenario) as roce:
        if isinstance(net, ClusterFabric):  # no ECN marking across machines (refused before)
            return _send_and_measure(scenario, net, ctl, flows, (progress, work), roce)
        with ccrun.marking(scenario, net) as marks:
            measured = _send_and_measure(scenario, net, ctl, flows, (progress, work), roce)
        if marks.markers:
            measured["cc"] = {**measured["cc"], "marking": ccrun.summary(marks)}
        return measured


def _send_and_measure(
    scenario: Scenario,
    net: MininetFabric | ClusterFabric,
    ctl: ControllerProcess,
    flows: list[FlowPlan],
    where: tuple[Progress, Path],
    roce: rocerun.RoceRun,
) -> dict[str, Any]:
    spec = scenario.spec
    progress, work = where
    total = spec.duration_s + spec.settle_s
    # RoCE agents run inside their hosts: here, or each on the machine that holds its host
    agents = net.rank_agents(work) if isinstance(net, ClusterFabric) else LocalAgents(net, work)
    rocerun.start(roce, net, agents, total + 1.0)
    # Every flow's socket is open before the run's clock starts, and one fleet process sends them all, each
    # in its window, and receives them all (`emulation.fleet`): sixteen sender processes fell ~90 ms behind
    # their schedules at 420 pkt/s each on a 2-core machine, and a process started per flow began late by
    # however long Python took to start.
    ip_of = {host: ip for (host, _), (_, ip) in sorted(net.addresses.items(), reverse=True)}
    mac_of = {host: mac for (host, _), (mac, _) in sorted(net.addresses.items(), reverse=True)}
    denied = _denied(scenario, flows)
    plan = [{"src_host": flow.src, "dst_host": flow.dst, "dst": ip_of[flow.dst],
             "neighbour": mac_of[flow.dst] if flow.name in denied else None,
             "port": BASE_PORT + i, "rate_pps": flow.rate_pps, "size": flow.size_bytes, "sport": flow.sport,
             "spray": flow.spray, "dscp": flow.dscp, "start_s": flow.start_s, "duration_s": flow.duration_s}
            for i, flow in enumerate(flows)]  # fmt: skip
    if isinstance(net, MininetFabric):  # across machines each machine's fleet places its own (`ShardHost`)
        plan = fleet.place_sides(plan, net.endpoints())
    spec_ = {"flows": plan, "seconds": total, "bucket_s": 0.1, "grace_s": 1.0}
    with net.fleet(spec_) if isinstance(net, ClusterFabric) else fleet.local(spec_) as probes:
        faults = sorted(spec.faults, key=lambda f: f.at_s)
        fault_log: list[dict[str, Any]] = []
        samples: list[tuple[float, list[dict[str, Any]]]] = []
        poller_stop = threading.Event()

        def poll() -> None:
            while not poller_stop.is_set():
                with contextlib.suppress(Exception):  # a missed sample is a gap in the plot, not a failed run
                    links = ctl.get("links?counters=true")
                    at = next((lk["counters_at"] for lk in links if lk.get("counters_at")), None)
                    if at is not None and (not samples or at > samples[-1][0]):  # the controller polled anew
                        samples.append((at, links))
                poller_stop.wait(spec.poll_interval_s / 2)

        poller = threading.Thread(target=poll, name="counters", daemon=True)
        # across machines the start time must reach every machine's fleet before it comes
        cluster = isinstance(net, ClusterFabric)
        wall0 = time.time() + (CLUSTER_START_MARGIN_S if cluster else probe.START_MARGIN_S)
        if probes is not None:
            probes.go(wall0)
        rocerun.go(roce, wall0)
        time.sleep(max(0.0, wall0 - time.time()))
        t0 = time.monotonic()
        poller.start()
        while True:
            now = time.monotonic() - t0
            while faults and faults[0].at_s <= now:
                fault = faults.pop(0)
                target = fault.port or fault.switch or ""
                at = time.time()
                if fault.action.startswith("link"):
                    node, _, port = target.rpartition(":")
                    net.set_link(node, int(port), up=fault.action == "link_up")
                else:
                    net.set_switch(target, up=fault.action == "switch_up")
                fault_log.append({"at_s": fault.at_s, "action": fault.action, "target": target, "wall": at})
            if now >= total:
                break
            if not flows and not faults and rocerun.all_finished(roce):
                # RoCE work only, all of it done: waiting out `duration_s` would measure nothing more
                progress(0.95, f"t={now:5.1f} s: every RoCE agent finished")
                break
            progress(0.1 + 0.85 * now / total, f"t={now:5.1f}/{total:.1f} s")
            time.sleep(min(0.05, max(0.0, total - now)))
        poller_stop.set()
        records = probes.collect(60) if probes is not None else {"senders": [], "receivers": []}
        sent = {flow.name: r for flow, r in zip(flows, records["senders"], strict=True)}
        received = {flow.name: r for flow, r in zip(flows, records["receivers"], strict=True)}
    poller.join(5)
    roce_result = rocerun.finish(roce)
    return {
        "senders": sent,
        "receivers": received,
        "faults": fault_log,
        "utilisation": _utilisation(scenario, samples),
        "collectives": roce_result["collectives"],
        "replays": roce_result["replays"],
        "roce_messages": roce_result["messages"],
        "receiver_socket_drops": roce.socket_drops,
        "cc": roce_result["cc"],
    }


def _denied(scenario: Scenario, flows: list[FlowPlan]) -> set[str]:
    """The flows the scenario's partitions deny.  Their sources get a fixed neighbour entry for the
    destination (`fleet.pin_neighbour`): the subnet manager answers no ARP across partitions, so without
    it the packets would die in the source's kernel, counted as the emulator's loss, and never meet the
    switch's deny flow that P_Key enforcement is about."""
    if scenario.partitions_file is None:
        return set()
    partitions = load_partitions(scenario.partitions_file, scenario.fabric)
    return {f.name for f in flows if not partitions.permitted(f.src, f.dst)}


def _flow_results(
    flows: list[FlowPlan], placement: dict[str, str], sent: dict[str, Any], received: dict[str, Any]
) -> list[dict[str, Any]]:
    result = []
    for flow in flows:
        tx, rx = sent.get(flow.name, {"sent": 0}), received[flow.name]
        lost = max(0, int(tx["sent"]) - int(rx["received"]))
        result.append(
            {
                "name": flow.name,
                "job": flow.job,
                "src": flow.src,
                "dst": flow.dst,
                "path": placement[flow.name],
                "rate_pps": flow.rate_pps,
                "size_bytes": flow.size_bytes,
                "start_s": flow.start_s,
                "duration_s": flow.duration_s,
                "sent": tx["sent"],
                "received": rx["received"],
                "lost": lost,
                "loss_pct": round(100.0 * lost / tx["sent"], 3) if tx["sent"] else 0.0,
                "out_of_order": rx["out_of_order"],
                "reorder_max": rx.get("reorder_max", 0),
                "send_errors": tx.get("send_errors", 0),
                # how far behind its schedule the sender fell (then sent its backlog in one burst)
                "sender_late_max_ms": tx.get("late_max_ms"),
                "entropy": flow.entropy,
                "sport": flow.sport,
                "goodput_mbps": round(rx["bytes"] * 8 / flow.duration_s / 1e6, 3),
                # flow completion: first packet sent to last packet received (what was lost never came)
                "fct_s": round(rx["last"] - tx["start"], 4) if rx.get("last") and tx.get("start") else None,
                "throughput": {"bucket_s": rx["bucket_s"], "packets": rx["buckets"]},
                "gaps": rx["gaps"],
                "latency_ms": rx.get("latency_ms"),
                "dscp": flow.dscp,
            }
        )
    return result


def _partition_drops(isolated: dict[str, Any] | None) -> int:
    """Packets the partition layer dropped (deny and guard flows): the experiment's, not the emulator's."""
    return sum(int(n) for n in isolated["dropped_packets"].values()) if isolated else 0


def _faulted_interfaces(scenario: Scenario, net: MininetFabric | ClusterFabric) -> list[str]:
    """Interfaces of every cable a fault of the scenario cuts (their drops are the experiment's)."""
    found: list[str] = []
    for fault in scenario.spec.faults:
        if fault.port is not None:
            node, _, port = fault.port.rpartition(":")
            found += net.cable_interfaces(node, int(port))
        elif fault.switch is not None:
            for number in sorted(r.port for r in scenario.fabric.port_map if r.node == fault.switch):
                found += net.cable_interfaces(fault.switch, number)
    return found


def _delay_bound_ms(scenario: Scenario, flows: list[FlowPlan]) -> float:
    """What the slowest shaped link may add to a probe's delay on the longest path (see
    `headroom.modelled_delay_bound_ms`)."""
    fabric = scenario.fabric
    slowest = min((link.bw_gbps for link in fabric.links), default=None)
    mbps = scenario.scale.mbps(slowest) if scenario.scale is not None and slowest is not None else None
    size = max((f.size_bytes for f in flows), default=64)
    hops = 2 * max(1, Tiers(fabric).top)  # up to the top tier and down again
    return modelled_delay_bound_ms(mbps, size, hops, scenario.spec.buffer_packets)


def _senders_late(scenario: Scenario, flows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per probe flow: (how far its sender fell behind, the bound for its rate and the scenario's buffer)."""
    return {
        f["name"]: (float(f["sender_late_max_ms"]),
                    sender_late_bound_ms(float(f["rate_pps"]), scenario.spec.buffer_packets))
        for f in flows
        if f.get("sender_late_max_ms") is not None
    }  # fmt: skip


def _fault_window_losses(flows: list[dict[str, Any]], faults: list[dict[str, Any]]) -> int:
    """Packets the probe receivers missed in gaps that began within `FAULT_WINDOW_S` after a fault: the
    fault's own cost (packets sent into a cable as it was cut), not the emulator's."""
    walls = [f["wall"] for f in faults]
    return sum(
        int(g["missing"])
        for f in flows
        for g in f.get("gaps", [])
        if any(w - 0.05 <= g["from"] <= w + FAULT_WINDOW_S for w in walls)
    )


def _loss_windows(
    flows: list[FlowPlan], received: dict[str, Any], faults: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per fault and flow: packets lost in the gap that starts within 2 s after the fault, as time."""
    windows = []
    for fault in faults:
        for flow in flows:
            gaps = [
                g
                for g in received[flow.name]["gaps"]
                if fault["wall"] - 0.05 <= g["from"] <= fault["wall"] + 2.0
            ]
            missing = sum(int(g["missing"]) for g in gaps)
            windows.append(
                {
                    "fault": f"{fault['action']} {fault['target']} @ {fault['at_s']} s",
                    "flow": flow.name,
                    "lost_packets": missing,
                    "loss_window_ms": round(1000.0 * missing / flow.rate_pps, 2),
                }
            )
    return windows


def _utilisation(scenario: Scenario, samples: list[tuple[float, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per link direction and polling interval: transmitted bits per second (and share of the scaled
    capacity when links are shaped), from consecutive samples of OVS port counters."""
    fabric = scenario.fabric
    tiers = Tiers(fabric)
    rows: dict[str, list[float]] = {}
    groups: dict[str, str] = {}
    times: list[float] = []
    for (t1, links1), (t2, links2) in itertools.pairwise(samples):
        dt = t2 - t1
        if dt <= 0:
            continue
        times.append(round(t2 - samples[0][0], 3))
        for before, after in zip(links1, links2, strict=True):
            for side, far in (("a", "b"), ("b", "a")):
                c1, c2 = before.get(f"{side}_counters"), after.get(f"{side}_counters")
                if not c1 or not c2 or not fabric.nodes[after[far].rpartition(":")[0]].is_switch:
                    continue
                bps = max(0, c2["tx_bytes"] - c1["tx_bytes"]) * 8 / dt
                capacity = after["bw_gbps"] * 1e9
                if scenario.scale is not None:
                    capacity = scenario.scale.mbps(after["bw_gbps"]) * 1e6
                name = f"{after[side]}->{after[far]}"
                rows.setdefault(name, []).append(round(bps / capacity, 5))
                src, dst = after[side].rpartition(":")[0], after[far].rpartition(":")[0]
                groups[name] = f"{tiers.of(src)} → {tiers.of(dst)}"
    # bottom up, each tier's way up before its way down
    levels = {
        f"{a} → {b}": (min(i, j), i > j) for i, a in enumerate(tiers.names) for j, b in enumerate(tiers.names)
    }
    order = sorted(set(groups.values()), key=lambda g: levels.get(g, (99, False)))
    return {
        "times_s": times,
        "unit": "fraction of (scaled) capacity",
        "links": dict(sorted(rows.items())),
        "groups": groups,
        "group_order": order,
    }


__all__ = ["Progress", "capacity_warnings", "offered_load", "run_name_prefix", "run_scenario"]
