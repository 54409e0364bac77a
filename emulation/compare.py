"""`fabriclab compare`: one scenario run once per routing policy — same seed, traffic and faults — on the
emulated fabric, and the figures that tell the policies apart.

Each policy gets a fresh controller (started with that policy) and a fresh Mininet fabric, exactly as
`scenario run` does (`emulation.runner`); only the policy differs, and the senders follow it (one seeded
source port per flow, or another port per packet under a per-packet policy).  Around each run's traffic
the emulator's own drops are counted (`measure_headroom`), so a result the emulator distorted says so.

Per policy (`figures`): completion time, algbw/busbw of collectives, per-flow goodput and flow completion
times (p50/p99), max and mean link utilisation, flows per link (exact, from the controller's placement of
each flow's source port), reordered and lost packets, adaptive moves, and the headroom verdict.  The plots
and the report are `emulation.compare_report`'s.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emulation.mnfabric import MininetFabric
from emulation.runner import Progress, run_scenario
from emulation.scenario import Scenario

#: A run is clean when the emulator itself dropped at most this share of the packets offered (the same
#: criterion as the calibration of the reliability work).
CLEAN_LOSS = 0.001
#: A switch-to-switch link direction below this utilisation (mean over the run) counts as idle.
IDLE_UTIL = 0.02
#: Loss in the second after a fault is the fault's (failover, reroute), not the emulator's.
FAULT_WINDOW_S = 1.0


# --- the emulator's headroom -------------------------------------------------------------------------------


def _qdisc_drops(tc_json: str, devices: set[str] | None) -> dict[str, int]:
    try:
        rows = json.loads(tc_json or "[]")
    except json.JSONDecodeError:
        return {}
    return {
        r["dev"]: int(r.get("drops", 0))
        for r in rows
        if r.get("kind") == "htb" and (devices is None or r.get("dev") in devices)
    }


def _socket_drops(ss_out: str, devices: set[str] | None) -> dict[str, int]:
    """Drops of packet sockets (`ss -0 -m`: skmem ... d<N>) by the interface they are bound to."""
    drops: dict[str, int] = {}
    for line in ss_out.splitlines():
        bound = next((w[2:] for w in line.split() if w.startswith("*:")), None)
        if bound is None or (devices is not None and bound not in devices) or "skmem:(" not in line:
            continue
        fields = line.split("skmem:(", 1)[1].rstrip(") ").split(",")
        dropped = next((int(f[1:]) for f in fields if f.startswith("d") and f[1:].isdigit()), 0)
        drops[bound] = drops.get(bound, 0) + dropped
    return drops


def _snapshot(net: MininetFabric) -> dict[str, dict[str, int]]:
    """Drop counters of one fabric: shaped-link (HTB) drops, veth drops and OVS's packet-socket drops on
    the switch side; UDP receive-buffer overflows, packet-socket and veth drops and host-link HTB drops in
    every host's namespace."""
    fabric = net.fabric
    switch_ifs = {net.intf_name(r.node, r.port) for r in fabric.port_map if fabric.nodes[r.node].is_switch}

    def run(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout

    counts: dict[str, dict[str, int]] = {
        "shaped": _qdisc_drops(run(["tc", "-s", "-j", "qdisc", "show"]), switch_ifs),
        "ovs_socket": _socket_drops(run(["ss", "-0", "-m", "-n", "-H"]), switch_ifs),
        "veth": {},
        "rcvbuf": {},
        "host_socket": {},
    }
    for name in switch_ifs:  # tx only: rx_dropped also counts frames no protocol wanted (LLDP at a host)
        try:
            stats = Path("/sys/class/net") / name / "statistics"
            counts["veth"][name] = int((stats / "tx_dropped").read_text())
        except OSError:
            continue
    script = "; echo @@; ".join(
        ["cat /proc/net/snmp", "ss -0 -m -n -H", "tc -s -j qdisc show", "cat /proc/net/dev"]
    )
    for host in fabric.hosts:
        pid = net.node(host.name).pid
        out = run(["nsenter", f"--net=/proc/{pid}/ns/net", "sh", "-c", script]).split("@@\n")
        if len(out) < 4:
            continue
        udp = [line.split() for line in out[0].splitlines() if line.startswith("Udp:")]
        if len(udp) >= 2:
            counts["rcvbuf"][host.name] = int(dict(zip(udp[0], udp[1], strict=False)).get("RcvbufErrors", 0))
        counts["host_socket"][host.name] = sum(_socket_drops(out[1], None).values())
        for dev, n in _qdisc_drops(out[2], None).items():
            counts["shaped"][f"{host.name}/{dev}"] = n
        for line in out[3].splitlines()[2:]:
            dev, _, numbers = line.partition(":")
            cols = numbers.split()
            if len(cols) >= 12 and dev.strip() != "lo":
                counts["veth"][f"{host.name}/{dev.strip()}"] = int(cols[11])
    return counts


def measure_headroom(
    net: MininetFabric, scenario: Scenario, capacity: dict[str, Any] | None = None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Counters before the traffic; the returned function reads them again after it and says whether the
    emulator, rather than the modelled links, dropped packets (`emulator_overloaded`): the drops counted
    inside the emulator (OVS's packet sockets, veths, hosts' receive buffers) plus every packet lost that
    no shaped link (modelled congestion) or cut cable accounts for.

    `capacity` is the fabric's calibrated clean capacity on this machine ({"per_host_pps", "total_pps"},
    `fabriclab emulate calibrate` of the reliability work) when there is one: the load asked for is then
    compared with it as well.  Drops on links a fault cut are counted apart (the fault is the experiment)."""
    before = _snapshot(net)
    faulted = _faulted_interfaces(net, scenario)
    sampler = _TxBufferSampler()

    def finish(measured: dict[str, Any]) -> dict[str, Any]:
        peak = sampler.stop()
        after = _snapshot(net)
        delta = {
            kind: {k: max(0, v - before[kind].get(k, 0)) for k, v in values.items()}
            for kind, values in after.items()
        }
        by_cause = {
            "ovs_port_socket_overflow": sum(v for k, v in delta["ovs_socket"].items() if k not in faulted),
            "veth_drops": sum(v for k, v in delta["veth"].items() if k not in faulted),
            "host_udp_rcvbuf_overflow": sum(delta["rcvbuf"].values()),
            "host_packet_socket_overflow": sum(delta["host_socket"].values()),
        }
        offered = sum(int(s.get("sent", 0)) for s in measured["senders"].values())
        offered += sum(int(c["packets_expected"]) for c in measured["collectives"])
        received = sum(int(r.get("received", 0)) for r in measured["receivers"].values())
        received += sum(int(c["packets_received"]) for c in measured["collectives"])
        modelled = sum(v for k, v in delta["shaped"].items() if k not in faulted)
        fault = sum(
            v for kind in ("shaped", "veth", "ovs_socket") for k, v in delta[kind].items() if k in faulted
        )
        counted = sum(by_cause.values())
        # Conservation: what was sent and neither arrived nor was dropped by a shaped (modelled) link or a
        # cut cable was lost inside the emulator, counted or not (OVS drops some packets under CPU
        # starvation without any counter saying so; the kernel's per-CPU backlog drops are global).
        lost = max(0, offered - received)
        in_fault_windows = _fault_window_losses(measured)
        unaccounted = max(0, lost - modelled - fault - counted - in_fault_windows)
        emulator = counted + unaccounted
        result: dict[str, Any] = {
            "emulator_overloaded": emulator > max(1.0, CLEAN_LOSS * offered),
            "offered_packets": offered,
            "received_packets": received,
            "emulator_drops": emulator,
            "emulator_drop_pct": round(100.0 * emulator / offered, 4) if offered else 0.0,
            "emulator_drops_by_cause": {**by_cause, "unaccounted": unaccounted},
            "modelled_congestion_drops": modelled,
            "fault_drops": fault,
            "lost_in_fault_windows": in_fault_windows,
            # OVS sends every port's packets through one packet socket whose send buffer the packets
            # queued in shaped links hold: full, OVS drops on every port without counting it
            "ovs_tx_buffer_peak": peak,
        }
        result["offered_pps"] = round(offered / scenario.spec.duration_s, 1)
        if capacity is not None:  # the calibration hook: the load asked for against the clean capacity
            result["capacity_pps"] = dict(capacity)
            result["offered_vs_capacity"] = round(result["offered_pps"] / float(capacity["total_pps"]), 3)
        return result

    return finish


def _fault_window_losses(measured: dict[str, Any]) -> int:
    """Packets the probe receivers missed in gaps that began within `FAULT_WINDOW_S` after a fault: the
    fault's own cost (packets sent into a cable as it was cut), not the emulator's."""
    walls = [f["wall"] for f in measured["faults"]]
    return sum(
        int(g["missing"])
        for r in measured["receivers"].values()
        for g in r.get("gaps", [])
        if any(w - 0.05 <= g["from"] <= w + FAULT_WINDOW_S for w in walls)
    )


class _TxBufferSampler:
    """The fullest OVS's shared transmit socket got (used / size of its send buffer), sampled every 100 ms
    while the traffic runs: the unbound packet socket (`ss -0`: `[0]:*`) through which ovs-vswitchd's
    userspace datapath sends to every port.  Near 1.0 it refuses packets for all ports alike."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name="txbuf", daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            out = subprocess.run(["ss", "-0", "-m", "-n", "-H"], capture_output=True, text=True, check=False)
            self._parse(out.stdout)

    def _parse(self, out: str) -> None:
        for line in out.splitlines():
            if "[0]:*" not in line or "skmem:(" not in line:
                continue
            memory = {}
            for item in line.split("skmem:(", 1)[1].split(")")[0].split(","):
                name = item.rstrip("0123456789")
                memory[name] = item[len(name) :]
            used, size = memory.get("t", ""), memory.get("tb", "")
            if used.isdigit() and size.isdigit() and int(size):
                self.peak = max(self.peak, int(used) / int(size))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(2)
        return round(self.peak, 3)


def _faulted_interfaces(net: MininetFabric, scenario: Scenario) -> set[str]:
    """Both ends of every cable a fault cuts (a dead switch: all of its cables): what is dropped there is
    the fault, not the emulator."""
    fabric = net.fabric
    ends: set[tuple[str, int]] = set()
    for fault in scenario.spec.faults:
        if fault.port:
            node, _, text = fault.port.rpartition(":")
            ends.add((node, int(text)))
        elif fault.switch:
            ends |= {(r.node, r.port) for r in fabric.port_map if r.node == fault.switch}
    names: set[str] = set()
    for node, port in list(ends):
        peer = fabric.peer(node, port)
        for name, number in [(node, port)] + ([(peer.node, peer.port)] if peer else []):
            if fabric.nodes[name].is_switch:
                names.add(net.intf_name(name, number))
            else:
                names.add(f"{name}/{net.intf_name(name, number)}")
    return names


# --- figures -----------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _links_of(path: str) -> list[str]:
    """Switch-to-switch link directions of a path as the runner records it ("h1:1 1>leaf1>3 1>agg1>3 ...")."""
    hops = [h.split(">") for h in path.split() if h.count(">") == 2]
    return [f"{a[1]}:{a[2]}" for a, _ in itertools.pairwise(hops)]


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The comparison's figures of one policy's run (all repetitions together)."""
    flows = [f for rep in summary["repetitions"] for f in rep["flows"]]
    collectives = [c for rep in summary["repetitions"] for c in rep["collectives"]]
    reps = summary["repetitions"]
    goodput = [float(f["goodput_mbps"]) for f in flows]
    fcts = [float(f["fct_s"]) for f in flows if f.get("fct_s") is not None]
    fcts += [t for c in collectives for t in c.get("qp_fct_s", [])]
    sent = sum(int(f["sent"]) for f in flows) + sum(int(c["packets_expected"]) for c in collectives)
    lost = sum(int(f["lost"]) for f in flows) + sum(int(c["lost"]) for c in collectives)
    reordered = sum(int(f["out_of_order"]) for f in flows) + sum(int(c["out_of_order"]) for c in collectives)
    util_means: list[float] = []
    for rep in reps:
        groups = rep["utilisation"].get("groups", {})
        for name, series in rep["utilisation"]["links"].items():
            if groups.get(name, "").startswith("host"):
                continue  # hosts' own links: what they send, not how the fabric spreads it
            busy = series[1:-1] or series  # the first and last interval straddle the traffic's edges
            if busy:
                util_means.append(statistics.fmean(busy))
    placed = Counter(link for f in flows if f["path"] != "sprayed" for link in _links_of(f["path"]))
    headroom = [rep.get("headroom") for rep in reps if rep.get("headroom")]
    moves = sum(1 for rep in reps for e in rep["events"] if e["kind"] == "adaptive_move")
    result: dict[str, Any] = {
        "completion_s": _completion(flows, collectives),
        "algbw_gbps": _mean([c["algbw_gbps"] for c in collectives]),
        "busbw_gbps": _mean([c["busbw_gbps"] for c in collectives]),
        "aggregate_goodput_mbps": round(sum(goodput) / max(1, len(reps)), 3),
        "goodput_mbps": {
            "min": min(goodput, default=None),
            "p50": _percentile(goodput, 0.5),
            "max": max(goodput, default=None),
            "per_flow": {f["name"]: f["goodput_mbps"] for f in reps[0]["flows"]} if reps else {},
        },
        "fct_p50_s": _percentile(fcts, 0.5),
        "fct_p99_s": _percentile(fcts, 0.99),
        "fct_s": sorted(fcts),
        "max_link_util": round(max(util_means, default=0.0), 4),
        "mean_link_util": round(statistics.fmean(util_means), 4) if util_means else 0.0,
        "idle_links": sum(1 for u in util_means if u < IDLE_UTIL),
        "links_measured": len(util_means),
        "flows_per_link": {
            "max": max(placed.values(), default=0),
            "links_with_2plus_flows": sum(1 for n in placed.values() if n >= 2),
            "placed_flows": sum(1 for f in flows if f["path"] != "sprayed"),
            "sprayed_flows": sum(1 for f in flows if f["path"] == "sprayed"),
        },
        "reordered_packets": reordered,
        "lost_packets": lost,
        "loss_pct": round(100.0 * lost / sent, 4) if sent else 0.0,
        "adaptive_moves": moves,
        "emulator_overloaded": any(h["emulator_overloaded"] for h in headroom) if headroom else None,
        "headroom": headroom,
    }
    return result


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 6) if values else None


def _completion(flows: list[dict[str, Any]], collectives: list[dict[str, Any]]) -> float | None:
    """The collective's time when there is one (as nccl-tests measures it), else the slowest flow's FCT."""
    if collectives:
        return _mean([c["seconds"] for c in collectives])
    fcts = [float(f["fct_s"]) for f in flows if f.get("fct_s") is not None]
    return max(fcts, default=None)


# --- running -----------------------------------------------------------------------------------------------


def run_compare(
    scenario: Scenario,
    policies: list[str],
    out_dir: Path,
    progress: Progress | None = None,
    capacity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `scenario` once per policy (fresh controller and fabric each) and write the comparison."""
    from emulation.compare_report import write_comparison  # noqa: PLC0415 - matplotlib only when writing

    progress = progress or (lambda fraction, what: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    for index, policy in enumerate(policies):

        def step(fraction: float, what: str, index: int = index, policy: str = policy) -> None:
            progress((index + fraction) / len(policies), f"{policy}: {what}")

        variant = scenario.with_policy(policy)
        runs[policy] = run_scenario(
            variant,
            out_dir / policy,
            step,
            around_traffic=lambda net, sc: measure_headroom(net, sc, capacity),
            write=False,
        )
    summary = {
        "scenario": scenario.spec.name,
        "file": str(scenario.file),
        "fabric": scenario.fabric.summary(),
        "seed": scenario.spec.seed,
        "scale": scenario.spec.scale,
        "duration_s": scenario.spec.duration_s,
        "repetitions": scenario.spec.repetitions,
        "engine": scenario.spec.controller.engine,
    }
    by_policy = {p: {"controller": runs[p]["controller"], **figures(runs[p])} for p in policies}
    summary["policies"] = by_policy
    summary["emulator_overloaded"] = any(f["emulator_overloaded"] for f in by_policy.values())
    write_comparison(summary, runs, out_dir)
    progress(1.0, "done")
    return summary


__all__ = ["CLEAN_LOSS", "figures", "measure_headroom", "run_compare"]
