"""Scenario files for the simulator: the emulator's own parser and expansion, turned into a workload.

`fabriclab sim` reads exactly what `fabriclab scenario run` reads (`labspec.scenario.load_scenario`:
layered validation, file:line:field errors) and applies the rules of `labspec.workplan`, which the
emulator's agents follow too, so one scenario file describes one experiment:

* **speeds**: links at the scenario's `scale` (the speeds the emulator shapes), NICs included;
* `udp` / `udp-permutation`: timed, open-loop flows at `rate_pps` x (datagram + 42 bytes on the wire) for
  their duration — the emulator's seeded pairs and source ports;
* `roce-collective`: the planner's steps rank by rank (`one-phase`: the whole matrix at once), RDMA WRITEs of
  `mtu` + 58 bytes per packet, one QP (and its source port) per pair, each rank's sends paced together at
  `rate_pps` (default: line rate);
* `trace` / `kv-transfer`: every record (page) an RDMA WRITE posted at its (scaled) time, messages of one
  connection in order;
* `buffer_packets`: the switch ports' queues (default 1000 packets, the interface's, when links are
  shaped): a saturated port adds its full queue to the delay of what crosses it;
* `faults`: applied at their times; the controller's tables are recomputed for the degraded fabric.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from flowsim.ccsim import CcSetup
from flowsim.network import Network, SimInputError
from flowsim.workload import Collective, FlowBatch, Workload, collective
from labspec import workplan
from labspec.scenario import RoceCollective, RoceIncast, Scenario, collective_ranks, nic_gbps
from traffic.dcqcn import DcqcnParams
from traffic.entropy import QP_BASE, QP_SPACE, flow_sports, pair_qp
from traffic.figures import JobInfo
from traffic.patterns import bus_factor
from traffic.wire import packets_of, roce_frame_bytes, roce_wire_bytes, udp_frame_bytes

#: Posted messages beyond this many are merged per (post time, connection) (one flow per KV layer and QP).
MERGE_ABOVE = 50_000
#: The queue of a shaped interface when `buffer_packets` is not given (Linux's txqueuelen).
DEFAULT_QUEUE_PACKETS = 1000
_ENTROPY = {"policy": 0, "fixed": 1, "spray": 2}


def workload_of(scenario: Scenario, network: Network) -> Workload:
    spec = scenario.spec
    hosts = sorted(network.host_index)
    batches: list[FlowBatch] = []
    collectives: list[Collective] = []
    pacers: list[float] = []
    infos: list[JobInfo] = []
    frames: list[int] = []
    udp = defaultdict(list)
    for flow in scenario.with_policy("static").flows(0):  # pinned source ports as the emulator's
        udp[flow.job].append(flow)
    offset = 0
    for job in workplan.jobs(scenario):
        item = spec.traffic[job.index]
        stepped = job.schedule == "steps"
        infos.append(JobInfo(job.index, job.label, stepped, job.collective,
                             bus_factor(job.collective[0], job.collective[1]) if job.collective else None,
                             timed=job.schedule == "timed", posted=job.schedule == "posted"))  # fmt: skip
        if job.schedule == "timed":
            flows = udp[job.index]
            frame = np.array([udp_frame_bytes(f.size_bytes) for f in flows], dtype=np.float64)
            frames += frame.astype(int).tolist()
            entropy = np.array([_ENTROPY[getattr(item, "entropy", "policy")]] * len(flows), dtype=np.int8)
            batch = FlowBatch(
                job.label,
                network.hosts([f.src for f in flows], "src"),
                network.hosts([f.dst for f in flows], "dst"),
                np.full(len(flows), np.inf),
                np.array([f.start_s for f in flows]),
                np.array([f.rate_pps for f in flows]) * frame * 8 / 1e9,
                np.array([f.duration_s for f in flows]),
                np.array([f.sport or 0 for f in flows], dtype=np.int32),
                job=job.index,
                payload_frac=np.array([f.size_bytes for f in flows]) / frame,
                entropy=entropy,
            )
            batches.append(batch)
            continue
        assert job.mtu is not None and job.frame_bytes is not None
        frames.append(job.frame_bytes)
        pacer_gbps = job.rate_pps * job.frame_bytes * 8 / 1e9 if job.rate_pps else None
        if isinstance(item, RoceCollective):
            ranks = network.hosts(collective_ranks(item, hosts), "ranks")
            n = int(ranks.size)
            made = collective(job.label, item.collective, ranks, job.collective[2] if job.collective else 0,
                              network, one_phase=item.schedule == "one-phase")  # fmt: skip
            pacer = None
            if pacer_gbps is not None:
                pacer = (len(pacers) + np.arange(n)).astype(np.int32)
                pacers += [pacer_gbps] * n
            how = _ENTROPY[item.entropy]
            if isinstance(made, Collective):
                collectives.append(replace(made, job=job.index, mtu=job.mtu, pacer=pacer, qp_offset=offset,
                                           entropy=how))  # fmt: skip
            else:
                batches.append(_one_phase(made, job, ranks, pacer, offset, how, network))
            offset += n * (n - 1)
            continue
        rows = workplan.posted(scenario, job.index)
        batch, conns = _posted(job, rows, network, offset, pacers, pacer_gbps)
        batches.append(batch)
        offset += conns
    faults = tuple((f.at_s, f.action, f.port or f.switch or "") for f in spec.faults)
    queue = spec.buffer_packets or (DEFAULT_QUEUE_PACKETS if scenario.scale is not None else None)
    buffer = float(queue * max(frames)) if queue and frames else None
    return Workload(tuple(batches), tuple(collectives), faults, label=f"scenario {spec.name}",
                    pacers_gbps=np.array(pacers, dtype=np.float64), jobs=tuple(infos),
                    buffer_bytes=buffer)  # fmt: skip


def cc_setup(scenario: Scenario, network: Network, enabled: bool = True) -> CcSetup:
    """DCQCN for the scenario's RoCE senders at the network's speeds: `Scenario.dcqcn` of every host's NIC
    (at the scenario's scale, or at real speeds when the network is built without it), each job's packet
    size, and which jobs are incasts.  `enabled=False`: the same run with the controllers off."""
    at = scenario if network.scale is not None else replace(scenario, scale=None)
    if scenario.spec.cc != "dcqcn":
        at = at.with_cc("dcqcn")
    by_speed: dict[float, DcqcnParams] = {}
    line = np.zeros(network.n_hosts)
    for e, endpoint in enumerate(network.subnet.endpoints):
        speed = nic_gbps(scenario.fabric, endpoint.node) or float(network.subnet.ep_bw_gbps[e])
        if speed not in by_speed:
            params = at.dcqcn(speed)
            assert params is not None
            by_speed[speed] = params
        line[e] = by_speed[speed].line_rate_bps
    if not by_speed:
        raise SimInputError("dcqcn: the fabric has no hosts", "cc")
    params = next(iter(by_speed.values()))
    frames = {job.index: job.frame_bytes for job in workplan.jobs(scenario) if job.frame_bytes is not None}
    incasts = frozenset(i for i, item in enumerate(scenario.spec.traffic) if isinstance(item, RoceIncast))
    return CcSetup(params, line, enabled, frames, incasts)


def _one_phase(
    made: FlowBatch,
    job: workplan.Job,
    ranks: np.ndarray,
    pacer: np.ndarray | None,
    offset: int,
    entropy: int,
    network: Network,
) -> FlowBatch:
    """A one-phase collective's matrix with the workplan's wire bytes, QPs (source ports) and pacers."""
    assert job.mtu is not None
    n = int(ranks.size)
    pos = np.full(network.n_hosts, -1, dtype=np.int64)
    pos[ranks] = np.arange(n)
    i, j = pos[made.src], pos[made.dst]
    wire = roce_wire_bytes(made.size_bytes, job.mtu)
    sport = flow_sports(pair_qp(offset, i, j, n))
    return replace(made, size_bytes=wire, sport=sport, job=job.index, payload_frac=made.size_bytes / wire,
                   entropy=np.full(made.n, entropy, dtype=np.int8),
                   pacer=pacer[i].astype(np.int32) if pacer is not None else None)  # fmt: skip


def _posted(
    job: workplan.Job,
    rows: list[tuple[float, str, str, int, int, str]],
    network: Network,
    offset: int,
    pacers: list[float],
    pacer_gbps: float | None,
) -> tuple[FlowBatch, int]:
    """Posted messages as flows, each waiting for the previous one of its connection; returns the batch and
    how many connections (QPs) it used."""
    assert job.mtu is not None
    frame = roce_frame_bytes(job.mtu)
    post: list[float] = []
    srcs: list[str] = []
    dsts: list[str] = []
    wire: list[float] = []
    payload: list[float] = []
    conns: list[int] = []
    merge = len(rows) > MERGE_ABOVE
    for post_s, src, dst, size, conn, _ in rows:
        on_wire = float(packets_of(size, job.mtu) * frame)
        if merge and post and post[-1] == post_s and srcs[-1] == src and conns[-1] == conn:
            wire[-1] += on_wire
            payload[-1] += size
            continue
        post.append(post_s)
        srcs.append(src)
        dsts.append(dst)
        wire.append(on_wire)
        payload.append(float(size))
        conns.append(conn)
    n = len(post)
    after = np.full(n, -1, dtype=np.int32)
    previous: dict[int, int] = {}
    for k, conn in enumerate(conns):
        if conn in previous:
            after[k] = previous[conn]
        previous[conn] = k
    qps = (QP_BASE + offset + np.array(conns, dtype=np.int64)) % QP_SPACE
    src_ids = network.hosts(srcs, "src")
    pacer = None
    if pacer_gbps is not None:  # one pacer per sending host of the job
        senders = sorted(set(src_ids.tolist()))
        index = {e: len(pacers) + k for k, e in enumerate(senders)}
        pacers += [pacer_gbps] * len(senders)
        pacer = np.array([index[e] for e in src_ids.tolist()], dtype=np.int32)
    wire_bytes = np.array(wire)
    batch = FlowBatch(
        job.label,
        src_ids,
        network.hosts(dsts, "dst"),
        wire_bytes,
        np.array(post),
        np.full(n, np.inf),
        np.full(n, np.nan),
        flow_sports(qps),
        after=after,
        job=job.index,
        payload_frac=np.array(payload) / np.maximum(wire_bytes, 1e-300),
        pacer=pacer,
    )
    return batch, len(previous)


__all__ = ["cc_setup", "workload_of"]
