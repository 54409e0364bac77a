"""RoCEv2 traffic inside a scenario run: collectives, trace replays and KV-cache transfers as RDMA WRITEs.

The scenario's RoCE messages come from `labspec.workplan` (the same expansion the simulator uses): one
QP per collective pair or trace connection, packets of the job's MTU, PSNs continuing along a QP.  Every
host that sends or receives them runs one `traffic.rankagent`: it sends the host's messages (posted at
their times, in order per QP, a stepped collective's step only once this rank has finished the one before,
paced per job at `rate_pps` or at the NIC's line rate) and receives its peers' (PSN order, ICRC, and when
each message was complete).  All agents start at one wall-clock instant the runner gives them once every
one is ready, so posting times mean the same on every host.

A collective is scored as nccl-tests does: algbw = per-rank size / time, busbw = algbw x the bus factor,
its time from the first packet sent to the last message received.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.formats.partitions_file import load_partitions
from controller.sm.partitions import Partitions
from emulation.agents import AgentSet
from labspec import workplan
from labspec.scenario import Scenario, nic_gbps
from labspec.workplan import Job, Message
from topologies.model import PortRef
from traffic.patterns import bus_factor
from traffic.roce import DEFAULT_PKEY

#: A receive is given up this long after its QP went quiet, at least (see `traffic.rankagent`).
MIN_STALL_S = 0.2

#: The receivers count deliveries per job in bins this wide (from the common start), which an incast's
#: goodput while it oversubscribes its link is judged by.
ARRIVAL_BIN_S = 0.1


class Addressed(Protocol):
    """What an agent's plan needs of a fabric: the hosts' addresses and interface names."""

    @property
    def addresses(self) -> Mapping[tuple[str, int], tuple[str, str]]: ...

    def intf_name(self, node: str, port: int) -> str: ...


class _NoAgents:
    """The agents of a run that has none (or has not started them)."""

    def __len__(self) -> int:
        return 0

    def launch(self, plans: dict[str, dict[str, Any]]) -> None:
        raise RuntimeError("no agents to launch here")

    def go(self, start_at: float) -> None:
        pass

    def finished(self) -> bool:
        return False

    def reports(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        return {}

    def stop(self) -> None:
        pass


NO_AGENTS = _NoAgents()


@dataclass
class RoceRun:
    jobs: list[Job]
    messages: list[Message]
    pkeys: dict[tuple[str, str], int]
    #: The NIC speed of every host (bits/s) at the scenario's scale; None: unshaped.
    nic_bps: dict[str, float | None] = field(default_factory=dict)
    #: The rank agents, once started (`emulation.agents`); none before.
    agents: AgentSet = field(default_factory=lambda: NO_AGENTS)
    start_at: float | None = None
    #: Frames each agent's socket dropped (buffer full): the emulator's, counted before the socket closed.
    socket_drops: dict[str, int] = field(default_factory=dict)
    #: Each host's DCQCN parameters (`cc: dcqcn`, scaled; `traffic.dcqcn.DcqcnParams` fields); empty: none.
    dcqcn: dict[str, dict[str, float]] = field(default_factory=dict)


def pair_pkey(partitions: Partitions | None, src: str, dst: str) -> int:
    """The P_Key a RoCEv2 packet from `src` to `dst` carries: the lowest partition they may talk in, with
    the membership bit of the sender (no partitions file: 0xffff, full member of the default partition).
    A pair that shares none gets the default's limited key: the fabric drops its packets anyway."""
    if partitions is None:
        return DEFAULT_PKEY
    pkey = partitions.pkey_for(src, dst)
    return pkey if pkey is not None else DEFAULT_PKEY & 0x7FFF


def prepare(scenario: Scenario) -> RoceRun:
    jobs = [j for j in workplan.jobs(scenario) if j.roce]
    messages = workplan.messages(scenario) if jobs else []
    file = scenario.partitions_file
    partitions = load_partitions(file, scenario.fabric) if file is not None else None
    pairs = {(m.src, m.dst) for m in messages}
    pkeys = {pair: pair_pkey(partitions, *pair) for pair in sorted(pairs)}
    nic: dict[str, float | None] = {}
    for host in sorted({h for pair in pairs for h in pair}):
        entry = scenario.fabric.port_map.get(PortRef(host, 1))
        speed = scenario.fabric.links[entry[0]].bw_gbps if entry is not None else None
        nic[host] = scenario.scale.mbps(speed) * 1e6 if scenario.scale is not None and speed else None
    dcqcn: dict[str, dict[str, float]] = {}
    for host in nic:
        params = (
            scenario.dcqcn(nic_gbps(scenario.fabric, host) or 0.0) if scenario.spec.cc == "dcqcn" else None
        )
        if params is not None:
            dcqcn[host] = dataclasses.asdict(params)
    return RoceRun(jobs, messages, pkeys, nic, dcqcn=dcqcn)


def _line_pps(run: RoceRun, host: str, job: Job) -> float | None:
    nic = run.nic_bps.get(host)
    frame = job.frame_bytes
    return nic / (8.0 * frame) if nic and frame else None


def rates(run: RoceRun) -> dict[str, float]:
    """Packets per second each host's agent may send (its jobs' paced rates, or line rate, together)."""
    rate: dict[str, float] = {}
    by_job = {j.index: j for j in run.jobs}
    for host, job in sorted({(m.src, m.job) for m in run.messages}):
        j = by_job[job]
        pps = j.rate_pps or _line_pps(run, host, j) or 0.0
        rate[host] = rate.get(host, 0.0) + pps
    return rate


def _stall_s(run: RoceRun) -> float:
    """Longest expected gap between two packets of one QP, times eight: a quieter QP lost the rest."""
    by_job = {j.index: j for j in run.jobs}
    concurrent: dict[tuple[str, int, int], set[int]] = {}
    for m in run.messages:
        concurrent.setdefault((m.src, m.job, m.step), set()).add(m.qp)
    gap = 0.0
    for (src, job, _), qps in concurrent.items():
        j = by_job[job]
        pps = j.rate_pps or _line_pps(run, src, j)
        if pps:
            gap = max(gap, len(qps) / pps)
    return max(MIN_STALL_S, 8.0 * gap)


def start(run: RoceRun, net: Addressed, agents: AgentSet, deadline_s: float) -> None:
    """One agent per host that sends or receives RoCE messages (`agents`: on this machine, or each on the
    machine holding its host); returns once all are ready."""
    if not run.messages:
        return
    stall = _stall_s(run)
    hosts = sorted({m.src for m in run.messages} | {m.dst for m in run.messages})
    run.agents = agents
    agents.launch({host: _agent_plan(run, net, host, deadline_s, stall) for host in hosts})


def _agent_plan(run: RoceRun, net: Addressed, host: str, deadline_s: float, stall_s: float) -> dict[str, Any]:
    """What `traffic.rankagent` on `host` sends and receives (`id`: the message's index in the run)."""
    by_job = {j.index: j for j in run.jobs}
    sends: list[dict[str, Any]] = []
    recvs: list[dict[str, Any]] = []
    steps: dict[int, set[int]] = {}
    for k, m in enumerate(run.messages):
        if host not in (m.src, m.dst):
            continue
        job = by_job[m.job]
        steps.setdefault(m.job, set()).add(m.step)
        if m.src == host:
            dst_mac, dst_ip = net.addresses[(m.dst, 1)]
            send = {"id": k, "job": m.job, "step": m.step, "qp": m.qp, "dst_mac": dst_mac, "dst_ip": dst_ip,
                    "mtu": job.mtu, "packets": m.packets, "psn": m.psn, "post_s": m.post_s,
                    "sport": None if job.sprays else workplan.sport_of(m.qp), "spray_offset": m.qp,
                    "pkey": run.pkeys.get((m.src, m.dst), DEFAULT_PKEY)}  # fmt: skip
            if job.dscp is not None:
                send["dscp"] = job.dscp
            sends.append(send)
        else:
            recvs.append(
                {"id": k, "job": m.job, "step": m.step, "qp": m.qp, "psn": m.psn, "packets": m.packets}
            )
    mac, ip = net.addresses[(host, 1)]
    jobs = {
        str(j.index): {"rate_pps": j.rate_pps, "frame_bytes": j.frame_bytes, "steps": j.schedule == "steps",
                       "rank_steps": sorted(steps.get(j.index, set()))}
        for j in run.jobs
    }  # fmt: skip
    return {"iface": net.intf_name(host, 1), "src_mac": mac, "src_ip": ip, "start_at": None,
            "deadline_s": deadline_s, "nic_bps": run.nic_bps.get(host), "stall_s": stall_s, "jobs": jobs,
            "sends": sends, "recvs": recvs, "cc": run.dcqcn.get(host),
            "arrival_bin_s": ARRIVAL_BIN_S}  # fmt: skip


def all_finished(run: RoceRun) -> bool:
    """Every agent has exited: each finished its sends and receives (or met its deadline)."""
    return run.agents.finished()


def go(run: RoceRun, start_at: float) -> None:
    """Every agent starts at `start_at` (wall clock, seconds)."""
    run.start_at = start_at
    run.agents.go(start_at)


def finish(run: RoceRun) -> dict[str, Any]:
    """The agents' reports merged: per message, per collective (as nccl-tests scores it)."""
    reports = run.agents.reports(120)
    for host in reports:
        run.socket_drops[host] = int(reports[host].get("socket_drops", 0))
    t0 = run.start_at or 0.0
    records = []
    for k, m in enumerate(run.messages):
        first, last, sent = reports.get(m.src, {}).get("sends", {}).get(str(k)) or [None, None, 0]
        received, done_at, complete = reports.get(m.dst, {}).get("recvs", {}).get(str(k)) or [0, None, False]
        records.append({"job": m.job, "src": m.src, "dst": m.dst, "qp": m.qp, "step": m.step,
                        "post_s": m.post_s, "payload_bytes": m.payload_bytes, "packets": m.packets,
                        "sent": sent, "received": received, "complete": complete,
                        "first_sent_s": _rel(first, t0), "last_sent_s": _rel(last, t0),
                        "done_s": _rel(done_at, t0)})  # fmt: skip
    qps: dict[int, dict[str, Any]] = {}
    arrivals: dict[int, dict[int, int]] = {}
    for report in reports.values():
        for qp, stats in report.get("qps", {}).items():
            qps[int(qp)] = stats
        for job, bins in report.get("arrivals", {}).items():
            mine = arrivals.setdefault(int(job), {})
            for b, n in bins.items():
                mine[int(b)] = mine.get(int(b), 0) + int(n)
    return {"collectives": _collectives(run, records, qps), "replays": _replays(run, records, arrivals),
            "messages": records, "start_at": t0, "cc": _cc(run, reports, records)}  # fmt: skip


def _replays(
    run: RoceRun, records: list[dict[str, Any]], arrivals: dict[int, dict[int, int]]
) -> list[dict[str, Any]]:
    """Per trace or KV-cache job: its messages, how much arrived, and first post to last delivery."""
    out = []
    for job in run.jobs:
        if job.schedule != "posted":
            continue
        mine = [r for r in records if r["job"] == job.index]
        ends = [r["done_s"] for r in mine if r["done_s"] is not None]
        start = min((r["post_s"] for r in mine), default=0.0)
        out.append({
            "job": job.index,
            "name": job.label,
            "messages": len(mine),
            "complete": sum(1 for r in mine if r["complete"]),
            "packets_expected": sum(r["packets"] for r in mine),
            "packets_received": sum(r["received"] for r in mine),
            "seconds": round(max(ends) - start, 4) if ends else None,
            "delivered": _series(arrivals.get(job.index, {})),
            **({"incast": incast_figures(run, job, mine, arrivals.get(job.index, {}))}
               if job.kind == "roce-incast" else {}),
        })  # fmt: skip
    return out


def _series(bins: dict[int, int]) -> dict[str, Any]:
    """The job's packets delivered per bin, from the common start to its last delivery: how fast each
    job's receivers got it over time (two flows converging are judged by this)."""
    last = max((b for b in bins if b >= 0), default=-1)
    return {"bin_s": ARRIVAL_BIN_S, "packets": [bins.get(b, 0) for b in range(last + 1)]}


def incast_figures(
    run: RoceRun, job: Job, mine: list[dict[str, Any]], arrivals: dict[int, int] | None = None
) -> dict[str, Any]:
    """An incast as the issue scores it: packets lost, the receiver link's goodput, Jain's fairness of the
    senders' delivered rates, and each sender's rate (also as a fraction of the job's `rate_pps`, the
    victim's figure).

    Goodput is frames delivered per second over the link's rate, twice: `bottleneck_goodput` while the
    incast oversubscribes the link (from the first packet sent until the senders still sending could offer
    no more than the link carries, each at most its `rate_pps` and its NIC), counted from the receiver's
    0.1 s arrival bins — what congestion control is answerable for; and `span_goodput` over the whole span,
    first packet sent to last delivered, which also has the tail where fewer senders than the link needs
    are left (DCQCN's senders finish a little apart, since its random marks never split a link exactly
    evenly)."""
    sent = sum(int(r["sent"]) for r in mine)
    got = sum(int(r["received"]) for r in mine)
    rates = []
    for r in mine:
        first, done = r["first_sent_s"], r["done_s"]
        rates.append(r["received"] / (done - first) if first is not None and done is not None and done > first
                     else 0.0)  # fmt: skip
    starts = [r["first_sent_s"] for r in mine if r["first_sent_s"] is not None]
    ends = [r["done_s"] for r in mine if r["done_s"] is not None]
    span = max(ends) - min(starts) if starts and ends else 0.0
    receiver = mine[0]["dst"] if mine else None
    link_bps = run.nic_bps.get(receiver) if receiver else None
    frame = job.frame_bytes or 0
    goodput = got * frame * 8 / span / link_bps if span > 0 and link_bps else None
    window = _oversubscribed(run, job, mine, link_bps)
    busy = _window_goodput(arrivals or {}, window, frame, link_bps)
    square = sum(x * x for x in rates)
    return {
        "senders": len(mine),
        "receiver": receiver,
        "sent_packets": sent,
        "received_packets": got,
        "loss_pct": round(100.0 * (sent - got) / sent, 3) if sent else None,
        "span_s": round(span, 4),
        "oversubscribed_s": [round(t, 3) for t in window] if window else None,
        "bottleneck_goodput": round(busy, 4) if busy is not None else None,
        "span_goodput": round(goodput, 4) if goodput is not None else None,
        "jain": round(sum(rates) ** 2 / (len(rates) * square), 4) if square > 0 else None,
        "sender_pps": [round(x, 2) for x in rates],
        "rate_fraction": [round(x / job.rate_pps, 4) for x in rates] if job.rate_pps else None,
    }


def _oversubscribed(
    run: RoceRun, job: Job, mine: list[dict[str, Any]], link_bps: float | None
) -> tuple[float, float] | None:
    """From the first packet sent until the senders still sending can offer at most `link_bps` (a sender
    offers its `rate_pps` frames, or its NIC's rate, whichever is less); None if they never could."""
    frame_bits = 8.0 * (job.frame_bytes or 0)
    spans = [(r["first_sent_s"], r["last_sent_s"], r["src"]) for r in mine
             if r["first_sent_s"] is not None and r["last_sent_s"] is not None]  # fmt: skip
    if not spans or not link_bps or not frame_bits:
        return None
    offers = []
    for _, last, src in spans:
        nic = run.nic_bps.get(src) or float("inf")
        offers.append((last, min(nic, job.rate_pps * frame_bits) if job.rate_pps else nic))
    offered = sum(o for _, o in offers)
    if offered <= link_bps:
        return None
    start = min(first for first, _, _ in spans)
    for last, offer in sorted(offers):
        offered -= offer
        if offered <= link_bps:
            return (start, last)
    return None  # unreachable: the last sender leaves nothing on offer


def _window_goodput(
    arrivals: dict[int, int], window: tuple[float, float] | None, frame_bytes: int, link_bps: float | None
) -> float | None:
    """Frames delivered in the arrival bins wholly inside `window`, over what the link carries in them;
    None when fewer than 10 bins (1 s) fit."""
    if window is None or not link_bps or not frame_bytes:
        return None
    first, last = math.ceil(window[0] / ARRIVAL_BIN_S), math.floor(window[1] / ARRIVAL_BIN_S)
    if last - first < 10:
        return None
    got = sum(arrivals.get(b, 0) for b in range(first, last))
    return got * frame_bytes * 8 / ((last - first) * ARRIVAL_BIN_S) / link_bps


def _cc(run: RoceRun, reports: dict[str, dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Congestion control as the agents saw it: CNPs both ways, rate cuts, the marked fraction of data
    packets received, and every QP's rate over time (seconds from the common start)."""
    if not run.dcqcn:
        return {"cc": "none"}
    parts = [r["cc"] for r in reports.values() if isinstance(r.get("cc"), dict)]
    total = {k: sum(int(p.get(k, 0)) for p in parts)
             for k in ("cnps_sent", "cnps_received", "cnps_unknown_qp", "ce_received", "data_received",
                       "rate_cuts")}  # fmt: skip
    owner = {r["qp"]: (r["src"], r["dst"], r["job"]) for r in records}
    qps = {}
    for part in parts:
        for qp, stats in part.get("qps", {}).items():
            src, dst, job = owner.get(int(qp), (None, None, None))
            qps[qp] = {"src": src, "dst": dst, "job": job, **stats}
    data = total["data_received"]
    return {"cc": "dcqcn", **total, "agents_reporting": len(parts), "agents": len(run.agents),
            "marked_fraction": round(total["ce_received"] / data, 6) if data else None,
            "params": next(iter(run.dcqcn.values())), "qps": qps}  # fmt: skip


def _rel(at: float | None, t0: float) -> float | None:
    return round(at - t0, 6) if at is not None else None


def _collectives(
    run: RoceRun, records: list[dict[str, Any]], qps: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for job in run.jobs:
        if job.collective is None:
            continue
        kind, n, size = job.collective
        mine = [r for r in records if r["job"] == job.index]
        expected = sum(r["packets"] for r in mine)
        got = sum(r["received"] for r in mine)
        qp_ids = sorted({r["qp"] for r in mine})
        starts = [r["first_sent_s"] for r in mine if r["first_sent_s"] is not None]
        ends = [r["done_s"] for r in mine if r["done_s"] is not None]
        seconds = max(ends) - min(starts) if starts and ends else 0.0
        algbw = size / seconds / 1e9 if seconds > 0 else 0.0
        stats = [qps[q] for q in qp_ids if q in qps]
        by_qp: dict[int, float] = {}
        for r in mine:
            if r["done_s"] is not None and starts:
                by_qp[r["qp"]] = max(by_qp.get(r["qp"], 0.0), r["done_s"] - min(starts))
        out.append({
            "job": job.index,
            "collective": kind,
            "ranks": n,
            "size_bytes": size,
            "schedule": job.schedule,
            "qps": len(qp_ids),
            "packets_expected": expected,
            "packets_received": got,
            "lost": expected - got,
            "out_of_order": sum(int(s.get("out_of_order", 0)) for s in stats),
            "bad_icrc": sum(int(s.get("bad_icrc", 0)) for s in stats),
            "seconds": round(seconds, 4),
            "algbw_GBps": float(f"{algbw:.6g}"),
            "busbw_GBps": float(f"{algbw * bus_factor(kind, n):.6g}"),
            "qp_fct_s": sorted(round(v, 4) for v in by_qp.values()),
            "sprayed": job.sprays,
            "dscp": job.dscp,
            "mtu": job.mtu,
        })  # fmt: skip
    return out


@contextlib.contextmanager
def session(scenario: Scenario) -> Iterator[RoceRun]:
    """The scenario's RoCE traffic, its agents killed on the way out whatever happened."""
    run = prepare(scenario)
    try:
        yield run
    finally:
        stop(run)


def stop(run: RoceRun) -> None:
    """Kill agents still running (a run that failed before `finish`)."""
    run.agents.stop()


__all__ = [
    "RoceRun",
    "finish",
    "go",
    "incast_figures",
    "pair_pkey",
    "prepare",
    "rates",
    "session",
    "start",
    "stop",
]
