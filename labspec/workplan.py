"""A scenario's traffic expanded once: its jobs, and every RoCE message packet for packet.

Both instruments realise this expansion, so they answer one question about one workload: the emulator's
agents send exactly these messages (`emulation.rocerun`) and the flow-level simulator turns exactly these
rules into flows (`flowsim.scenario`).  What is fixed here and nowhere else:

* **Jobs.**  Every traffic item is a job, scored on its own: `udp`/`udp-permutation` are *timed* (open-loop
  flows sent at a rate for a duration), `roce-collective` runs its `steps` (a rank starts step s once it
  has sent and received all of step s-1) or `one-phase` (the whole traffic matrix at once), `trace` and
  `kv-transfer` are *posted* messages (each at its time, in order per queue pair), and so is
  `roce-incast` (one message per sender, each on a QP of its own, all posted at `start_s`).
* **Bytes on the wire** (`traffic.wire`): a probe datagram is `size_bytes + 42`, an RDMA WRITE
  `ceil(bytes / mtu)` packets of `mtu + 58`.  The links are shaped (and simulated) on these bytes; goodput
  counts payload.
* **Queue pairs and entropy.**  A collective gives every (src, dst) pair of ranks its own QP
  (`traffic.entropy.pair_qp`, dense per collective); a trace or KV transfer one QP per (src, connection).
  The UDP source port is Linux's for the QP (`traffic.entropy.flow_sport`), or a new one per packet when
  the job sprays.
* **Pacing.**  `rate_pps` paces a sender's packets of one job (all its QPs together, round robin); without
  it a sender goes at its NIC's line rate at the scenario's scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labspec.scenario import (
    KvTransfer,
    RoceCollective,
    RoceIncast,
    Scenario,
    TraceReplay,
    collective_plan,
    collective_ranks,
    incast_senders,
    trace_path,
)
from traffic.entropy import QP_BASE, QP_SPACE, flow_sport, pair_qp
from traffic.errors import parse_size
from traffic.kvcache import kv_transfer, model_shape
from traffic.trace import TraceRecord, read_trace
from traffic.wire import packets_of, roce_frame_bytes

#: Messages the emulator's agents can be given at most (each is a line of their plan).
MAX_EMULATED_MESSAGES = 200_000


@dataclass(frozen=True)
class Job:
    """One traffic item of the scenario, scored as one job."""

    index: int
    kind: str
    label: str
    #: timed | steps | one-phase | posted
    schedule: str
    #: (kind, ranks, per-rank bytes) for collectives, scored as nccl-tests does.
    collective: tuple[str, int, int] | None = None
    rate_pps: float | None = None
    mtu: int | None = None
    dscp: int | None = None
    #: The job's RoCE packets vary the UDP source port per packet.
    sprays: bool = False

    @property
    def roce(self) -> bool:
        return self.schedule != "timed"

    @property
    def frame_bytes(self) -> int | None:
        return roce_frame_bytes(self.mtu) if self.mtu is not None else None


@dataclass(frozen=True)
class Message:
    """One RDMA WRITE: `packets` packets of `mtu` payload on QP `qp`, from src to dst."""

    job: int
    src: str
    dst: str
    qp: int
    step: int
    post_s: float
    payload_bytes: int
    packets: int
    #: First PSN of the message on its QP (PSNs continue across a QP's messages).
    psn: int
    #: Index (in the plan's message list) of the message before it on its QP, or -1.
    after: int
    tag: str = ""


def jobs(scenario: Scenario) -> list[Job]:
    out: list[Job] = []
    for i, item in enumerate(scenario.spec.traffic):
        label = f"traffic[{i}] {item.kind}"
        if isinstance(item, RoceCollective):
            n = len(collective_ranks(item, [h.name for h in scenario.fabric.hosts]))
            out.append(Job(i, item.kind, f"{label} {item.collective}", item.schedule,
                           (item.collective, n, parse_size(item.size)), item.rate_pps, item.mtu, item.dscp,
                           scenario.sprays(item.entropy)))  # fmt: skip
        elif isinstance(item, KvTransfer | TraceReplay | RoceIncast):
            if isinstance(item, RoceIncast):
                what = f"{item.size} to {item.receiver}"
            else:
                what = item.model if isinstance(item, KvTransfer) else Path(item.file).name
            sprays = scenario.sprays("policy")
            rate, mtu, dscp = item.rate_pps, item.mtu, item.dscp
            job = Job(i, item.kind, f"{label} {what}", "posted", None, rate, mtu, dscp, sprays)
            out.append(job)
        else:
            out.append(Job(i, item.kind, label, "timed", dscp=item.dscp))
    return out


def trace_records(scenario: Scenario, index: int) -> list[TraceRecord]:
    """The records a `trace` or `kv-transfer` item posts (sizes and times not yet scaled)."""
    item = scenario.spec.traffic[index]
    if isinstance(item, TraceReplay):
        return read_trace(trace_path(item, scenario.file))
    assert isinstance(item, KvTransfer)
    from traffic.trace import from_kv  # noqa: PLC0415

    prefill = item.prefill if isinstance(item.prefill, list) else [h.strip() for h in item.prefill.split(",")]
    shape = model_shape(item.model)
    messages = kv_transfer(shape, item.prompt_tokens, prefill, item.decode, item.page_tokens, item.requests,
                           item.arrival_rate_per_s, item.layer_time_us, scenario.spec.seed)  # fmt: skip
    return from_kv(messages)


def posted(scenario: Scenario, index: int) -> list[tuple[float, str, str, int, int, str]]:
    """(post_s, src, dst, payload bytes, connection, tag) of a trace, KV or incast item, scaled as the
    scenario says; a connection is one (src, qp) of the trace (an incast: one per sender), numbered in order
    of first use."""
    item = scenario.spec.traffic[index]
    if isinstance(item, RoceIncast):
        senders = incast_senders(item, [h.name for h in scenario.fabric.hosts])
        size = parse_size(item.size)
        return [(item.start_s, src, item.receiver, size, k, "incast") for k, src in enumerate(senders)]
    time_scale = item.time_scale if isinstance(item, TraceReplay) else 1.0
    size_scale = item.size_scale if isinstance(item, TraceReplay) else 1.0
    assert isinstance(item, TraceReplay | KvTransfer)
    connections: dict[tuple[str, int], int] = {}
    rows = []
    for r in trace_records(scenario, index):
        conn = connections.setdefault((r.src, r.qp), len(connections))
        size = round(r.size_bytes * size_scale)
        rows.append((item.start_s + r.time_us * time_scale / 1e6, r.src, r.dst, size, conn, r.tag))
    return rows


def messages(scenario: Scenario, limit: int = MAX_EMULATED_MESSAGES) -> list[Message]:
    """Every RoCE message of the scenario, in posting order per QP (what the emulator's agents send)."""
    hosts = [h.name for h in scenario.fabric.hosts]
    out: list[Message] = []
    next_psn: dict[int, int] = {}
    last_on_qp: dict[int, int] = {}
    offset = 0

    def add(job: Job, src: str, dst: str, qp: int, step: int, post_s: float, size: int, tag: str) -> None:
        assert job.mtu is not None
        if len(out) >= limit:
            raise ValueError(f"more than {limit:,} RoCE messages: too large a workload to emulate")
        packets = packets_of(size, job.mtu)
        psn = next_psn.get(qp, 0)
        out.append(Message(job.index, src, dst, qp, step, post_s, size, packets, psn,
                           last_on_qp.get(qp, -1), tag))  # fmt: skip
        next_psn[qp] = (psn + packets) & 0xFFFFFF
        last_on_qp[qp] = len(out) - 1

    for job in jobs(scenario):
        item = scenario.spec.traffic[job.index]
        if isinstance(item, RoceCollective):
            plan = collective_plan(item, hosts)
            rank = {h: i for i, h in enumerate(plan.ranks)}
            n = len(plan.ranks)
            if job.schedule == "one-phase":
                for (src, dst), size in sorted(
                    plan.bytes_by_pair().items(), key=lambda p: (rank[p[0][0]], rank[p[0][1]])
                ):
                    add(job, src, dst, pair_qp(offset, rank[src], rank[dst], n), 0, 0.0, size, "")
            else:
                for step in plan.steps:
                    for t in step:
                        add(job, t.src, t.dst, pair_qp(offset, rank[t.src], rank[t.dst], n), t.step, 0.0,
                            t.size_bytes, t.tag)  # fmt: skip
            offset += n * (n - 1)
        elif job.schedule == "posted":
            qps: dict[int, int] = {}
            for post_s, src, dst, size, conn, tag in posted(scenario, job.index):
                qp = qps.setdefault(conn, (QP_BASE + offset + conn) % QP_SPACE)
                add(job, src, dst, qp, 0, post_s, size, tag)
            offset += len(qps)
    return out


def sport_of(qp: int) -> int:
    """The UDP source port of a QP's packets when the job does not spray."""
    return flow_sport(qp, qp)


def senders(plan: Sequence[Message]) -> list[str]:
    return sorted({m.src for m in plan})


__all__ = [
    "MAX_EMULATED_MESSAGES",
    "Job",
    "Message",
    "jobs",
    "messages",
    "posted",
    "senders",
    "sport_of",
    "trace_records",
]
