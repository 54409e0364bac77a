"""Traffic kinds of scenario files: one strict model per `kind:`, and the checks against the fabric.

Split from `labspec.scenario` (which composes them into a scenario) so each kind's fields and rules sit
together; both instruments expand them through `labspec.workplan`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from topologies.yamlio import Document
from traffic.errors import TrafficError, parse_hosts, parse_size
from traffic.kvcache import model_shape
from traffic.patterns import PLANNERS, Plan, plan
from traffic.trace import read_trace


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


Entropy = Literal["policy", "fixed", "spray"]


class UdpFlow(Strict):
    kind: Literal["udp"]
    src: str
    dst: str
    rate_pps: Annotated[float, Field(gt=0, le=50_000)]
    size_bytes: Annotated[int, Field(ge=32, le=8900)] = 512
    start_s: Annotated[float, Field(ge=0)] = 0.0
    duration_s: Annotated[float, Field(gt=0)] | None = None
    entropy: Entropy = "policy"
    #: The source port of a `fixed` flow (default: seeded).
    sport: Annotated[int, Field(ge=1, le=65535)] | None = None
    #: Traffic class (IP DSCP) the flow is marked with; QoS classifies by it (docs/qos.md).
    dscp: Annotated[int, Field(ge=0, le=63)] | None = None


class UdpPermutation(Strict):
    """Every host sends to one other: a seeded random permutation (whose flows leave their host, leaf or
    pod: `leave`), or a shift (host i to host i + `shift`, in topology order)."""

    kind: Literal["udp-permutation"]
    rate_pps: Annotated[float, Field(gt=0, le=50_000)]
    size_bytes: Annotated[int, Field(ge=32, le=8900)] = 512
    hosts: list[str] | None = None
    pattern: Literal["random", "shift"] = "random"
    shift: Annotated[int, Field(ge=1)] | None = None
    leave: Literal["host", "leaf", "pod"] = "host"
    #: Parallel flows from each host to its partner, each with entropy of its own (QPs of one transfer).
    flows_per_host: Annotated[int, Field(ge=1, le=16)] = 1
    entropy: Entropy = "policy"
    dscp: Annotated[int, Field(ge=0, le=63)] | None = None


Mtu = Literal[256, 512, 1024, 2048, 4096]
#: Packets per second a RoCE sender may be paced at (None: the NIC's line rate at the scenario's scale).
RatePps = Annotated[float, Field(gt=0, le=200_000)] | None


class RoceCollective(Strict):
    """A collective's bytes as RoCEv2 RDMA WRITE streams between the ranks (one QP per pair)."""

    kind: Literal["roce-collective"]
    collective: str
    ranks: str | list[str]
    size: str | int
    #: Each rank's sender paced at this many packets per second (all its QPs together); default: line rate.
    rate_pps: RatePps = None
    mtu: Mtu = 1024
    entropy: Entropy = "policy"
    #: "steps": the planner's dependent steps, rank by rank (a rank starts step s once it has sent and
    #: received all of step s-1), in the emulator and the simulator alike; "one-phase": the whole traffic
    #: matrix at once (each pair's bytes of every step as one message; MoE dispatch for an all-to-all).
    schedule: Literal["steps", "one-phase"] = "steps"
    #: Traffic class (DSCP) of its packets (default: the agent's RoCE default, 26).
    dscp: Annotated[int, Field(ge=0, le=63)] | None = None


class KvTransfer(Strict):
    """KV-cache transfers of disaggregated serving (`traffic.kvcache`): every page an RDMA WRITE, posted
    when its layer is computed, one QP per prefill -> decode pair."""

    kind: Literal["kv-transfer"]
    model: str
    prompt_tokens: Annotated[int, Field(ge=1)]
    prefill: str | list[str]
    decode: str
    page_tokens: Annotated[int, Field(ge=1)] = 16
    requests: Annotated[int, Field(ge=1, le=100_000)] = 1
    arrival_rate_per_s: Annotated[float, Field(ge=0)] = 0.0
    layer_time_us: Annotated[float, Field(ge=0)] = 0.0
    start_s: Annotated[float, Field(ge=0)] = 0.0
    mtu: Mtu = 1024
    rate_pps: RatePps = None
    dscp: Annotated[int, Field(ge=0, le=63)] | None = None


class TraceReplay(Strict):
    """A congestion trace (`traffic.trace`, JSON Lines) replayed from `start_s`: every record an RDMA WRITE
    posted at its time, messages of one (src, qp) in order.  `time_scale` stretches the trace's clock and
    `size_scale` its message sizes (a trace recorded at real speed replayed on a scaled fabric: both
    instruments apply the same factors)."""

    kind: Literal["trace"]
    file: str
    start_s: Annotated[float, Field(ge=0)] = 0.0
    time_scale: Annotated[float, Field(gt=0, le=1e9)] = 1.0
    size_scale: Annotated[float, Field(gt=0, le=1e9)] = 1.0
    mtu: Mtu = 1024
    rate_pps: RatePps = None
    dscp: Annotated[int, Field(ge=0, le=63)] | None = None


class RoceIncast(Strict):
    """Every sender writes `size` bytes to one receiver at `start_s`, one QP each: an incast, whose
    bottleneck is the receiver's link (the case congestion control exists for).  Posted like a trace."""

    kind: Literal["roce-incast"]
    senders: str | list[str]
    receiver: str
    size: str | int
    start_s: Annotated[float, Field(ge=0)] = 0.0
    #: Each sender's QP at most this many packets per second (DCQCN's highest rate); default: line rate.
    rate_pps: RatePps = None
    mtu: Mtu = 1024
    dscp: Annotated[int, Field(ge=0, le=63)] | None = None


Traffic = Annotated[
    UdpFlow | UdpPermutation | RoceCollective | KvTransfer | TraceReplay | RoceIncast,
    Field(discriminator="kind"),
]
#: The model of each traffic kind (what `kind:` selects; the scenario's key checker suggests its fields).
TRAFFIC_MODELS: dict[str, type[BaseModel]] = {
    "udp": UdpFlow,
    "udp-permutation": UdpPermutation,
    "roce-collective": RoceCollective,
    "kv-transfer": KvTransfer,
    "trace": TraceReplay,
    "roce-incast": RoceIncast,
}
#: Kinds whose packets are RoCEv2 RDMA WRITEs sent by the hosts' agents (the rest are UDP probe flows).
RoceTraffic = RoceCollective | KvTransfer | TraceReplay | RoceIncast


def collective_plan(item: RoceCollective, hosts: Sequence[str]) -> Plan:
    ranks = item.ranks if isinstance(item.ranks, list) else parse_hosts(item.ranks, hosts)
    return plan(item.collective, ranks, parse_size(item.size))


def collective_ranks(item: RoceCollective, hosts: Sequence[str]) -> list[str]:
    """The ranks of a collective, checked against the fabric's hosts (TrafficError naming `ranks`)."""
    return parse_hosts(",".join(item.ranks) if isinstance(item.ranks, list) else item.ranks, hosts)


#: Collectives up to this many ranks are checked by planning them; bigger ones (a 4,096-rank all-to-all
#: is 16.8 M transfers) by their parts, so checking a large scenario stays instant.
PLAN_CHECK_RANKS = 256


def check_collective(item: RoceCollective, hosts: Sequence[str]) -> None:
    ranks = collective_ranks(item, hosts)
    if len(ranks) <= PLAN_CHECK_RANKS:
        plan(item.collective, ranks, parse_size(item.size))
        return
    if item.collective not in PLANNERS:
        raise TrafficError(f"unknown kind {item.collective!r} (known: {', '.join(PLANNERS)})", field="kind")
    if parse_size(item.size) < 1:
        raise TrafficError("must be at least 1 byte", field="size")
    if item.collective == "allreduce-hd" and len(ranks) & (len(ranks) - 1):
        raise TrafficError("halving-doubling needs a power-of-two number of ranks", field="ranks")


def check_kv(item: KvTransfer, hosts: Sequence[str], doc: Document, i: int) -> None:
    try:
        model_shape(item.model)
        names = item.prefill if isinstance(item.prefill, str) else ",".join(item.prefill)
        prefill = parse_hosts(names, hosts, field="prefill")
        parse_hosts(item.decode, hosts, field="decode")
        if item.decode in prefill:
            raise TrafficError(f"{item.decode!r} is also a prefill host", field="decode")
    except TrafficError as exc:
        raise doc.error(["traffic", i, exc.field or "model"], exc.message) from None


def trace_path(item: TraceReplay, scenario_file: Path) -> Path:
    return (scenario_file.parent / item.file).resolve()


def check_trace(item: TraceReplay, hosts: set[str], doc: Document, i: int, path: Path) -> None:
    file = trace_path(item, path)
    try:
        records = read_trace(file)
    except TrafficError as exc:
        raise doc.error(["traffic", i, "file"], str(exc)) from None
    for n, record in enumerate(records, 1):
        for name in (record.src, record.dst):
            if name not in hosts:
                raise doc.error(["traffic", i, "file"], f"{file}: record {n}: unknown host {name!r}")


def incast_senders(item: RoceIncast, hosts: Sequence[str]) -> list[str]:
    """The senders of an incast, checked against the fabric's hosts (TrafficError naming `senders`)."""
    names = item.senders if isinstance(item.senders, str) else ",".join(item.senders)
    return parse_hosts(names, hosts, field="senders")


def check_incast(item: RoceIncast, hosts: Sequence[str], doc: Document, i: int) -> None:
    try:
        senders = incast_senders(item, hosts)
        parse_hosts(item.receiver, hosts, field="receiver")
        if item.receiver in senders:
            raise TrafficError(f"{item.receiver!r} is also a sender", field="receiver")
        if parse_size(item.size) < 1:
            raise TrafficError("must be at least 1 byte", field="size")
    except TrafficError as exc:
        raise doc.error(["traffic", i, exc.field or "senders"], exc.message) from None


__all__ = [
    "PLAN_CHECK_RANKS",
    "TRAFFIC_MODELS",
    "Entropy",
    "KvTransfer",
    "RoceCollective",
    "RoceIncast",
    "RoceTraffic",
    "Strict",
    "TraceReplay",
    "Traffic",
    "UdpFlow",
    "UdpPermutation",
    "check_collective",
    "check_incast",
    "check_kv",
    "check_trace",
    "collective_plan",
    "collective_ranks",
    "incast_senders",
    "trace_path",
]
