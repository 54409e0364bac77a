"""What the simulator runs: independent flow batches and collectives made of dependent steps.

Collectives are the planners of `traffic.patterns` (same steps, same byte counts, same nccl-tests bus
factors) generated as numpy arrays one step at a time, so a 16,384-rank ring all-reduce (32,766 steps of
16,384 transfers) never exists as half a billion Python objects; a test checks the arrays against the
planners transfer by transfer.  A step of a rank starts when that rank has finished its previous step
(both its sends and its receives), and a transfer starts when both its ends may start the step.

Ad hoc workloads for the CLI and sweeps: `permutation` (a seeded random derangement, as
`traffic.patterns.permutation`), `permutation:offleaf` (the same, every flow leaving its leaf), `alltoall`
(every pair at once, one phase), `alltoall:steps` (pairwise exchange, n-1 dependent steps), `shift:S`
(host i -> host i+S), `incast:N` (N senders into one host), `allreduce` (ring).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from flowsim.network import F64, I32, Network, SimInputError
from topologies.errors import clip
from traffic.entropy import flow_sports, pair_qp, seeded_sport_array
from traffic.errors import TrafficError
from traffic.figures import JobInfo
from traffic.patterns import Plan, bus_factor, split_bytes

StepArrays = tuple[I32, I32, F64]  # src rank index, dst rank index, bytes


@dataclass(frozen=True)
class FlowBatch:
    """Independent flows (no steps).  A flow is sized (`size_bytes`) or timed (inf size: it sends at its
    `rate_cap_gbps` from `start_s` for `duration_s`).  `after[i] >= 0` makes flow i wait for flow after[i]
    of the same batch (messages of one queue pair are delivered in order)."""

    name: str
    src: I32
    dst: I32
    size_bytes: F64
    start_s: F64
    rate_cap_gbps: F64
    duration_s: F64
    sport: I32
    after: I32 | None = None
    #: Scored like a collective (kind, ranks, per-rank size) when it is one, e.g. a one-phase all-to-all.
    collective: tuple[str, int, int] | None = None
    #: The job (scenario traffic item) the batch belongs to.
    job: int = 0
    #: Payload share of the bytes on the wire, per flow (None: every byte is payload).
    payload_frac: F64 | None = None
    #: Per flow: 0 follow the policy, 1 keep one source port (fixed), 2 a new port per packet (spray).
    entropy: npt.NDArray[np.int8] | None = None
    #: Per flow: the pacer it shares (index into `Workload.pacers_gbps`), -1 none.
    pacer: I32 | None = None

    @property
    def n(self) -> int:
        return int(self.src.size)


@dataclass(frozen=True)
class Collective:
    """A collective as dependent steps over `ranks` (endpoint indices), generated on demand."""

    name: str
    kind: str
    ranks: I32
    size_bytes: int
    n_steps: int
    step: Callable[[int], StepArrays]
    #: Steps with equal signatures move the same bytes between the same pairs (within one byte).
    signature: Callable[[int], object]
    start_s: float = 0.0
    job: int = 0
    #: RDMA WRITE MTU: a transfer becomes ceil(bytes / mtu) packets of mtu + headers on the wire
    #: (`labspec.workplan`); None: sizes are bytes on the wire.
    mtu: int | None = None
    #: Per rank: the pacer its sends share (index into `Workload.pacers_gbps`), -1 none.
    pacer: I32 | None = None
    #: QPs of the ranks' pairs start here (`labspec.workplan.pair_qp`): the flows' source ports.
    qp_offset: int = 0
    #: 0 follow the policy, 1 one source port per QP, 2 a new port per packet.
    entropy: int = 0

    @property
    def bus_factor(self) -> float:
        return bus_factor(self.kind, int(self.ranks.size))


@dataclass(frozen=True)
class Workload:
    batches: tuple[FlowBatch, ...] = ()
    collectives: tuple[Collective, ...] = ()
    faults: tuple[tuple[float, str, str], ...] = ()  # (at_s, action, target) as in scenario files
    label: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Capacity of every sender pacer (a job's `rate_pps` x its frame), Gb/s.
    pacers_gbps: F64 = field(default_factory=lambda: np.zeros(0))
    #: The jobs flows and collectives belong to (default: one per batch and collective, in order).
    jobs: tuple[JobInfo, ...] = ()
    #: A switch port's queue (`buffer_packets` x frame), bytes: what a saturated port adds to delay.
    buffer_bytes: float | None = None

    def job_infos(self) -> tuple[JobInfo, ...]:
        if self.jobs:
            return self.jobs
        infos = [JobInfo(b.job, b.name, False, b.collective, _bus(b.collective), timed=bool(
                 np.isinf(b.size_bytes).all())) for b in self.batches]  # fmt: skip
        infos += [JobInfo(c.job, c.name, True, (c.kind, int(c.ranks.size), c.size_bytes), c.bus_factor)
                  for c in self.collectives]  # fmt: skip
        return tuple(infos)

    @property
    def flows(self) -> int:
        return sum(b.n for b in self.batches) + sum(
            int(c.step(0)[0].size) * c.n_steps for c in self.collectives
        )


def _bus(collective: tuple[str, int, int] | None) -> float | None:
    return bus_factor(collective[0], collective[1]) if collective is not None else None


def _chunks(size: int, n: int) -> F64:
    return np.array(split_bytes(size, n), dtype=np.float64)


def ring(name: str, kind: str, ranks: I32, size: int, start_s: float = 0.0) -> Collective:
    """Ring all-reduce (reduce-scatter with lag 1, then all-gather with lag 0), all-gather or
    reduce-scatter, exactly as `traffic.patterns` plans them."""
    n = int(ranks.size)
    chunks = _chunks(size, n)
    idx = np.arange(n, dtype=np.int32)
    nxt = ((idx + 1) % n).astype(np.int32)
    phases = {"allreduce-ring": [1, 0], "allgather": [0], "reduce-scatter": [1]}[kind]

    def step(s: int) -> StepArrays:
        lag = phases[s // (n - 1)]
        k = s % (n - 1)
        return idx, nxt, chunks[(idx - k - lag) % n]

    return Collective(name, kind, ranks, size, len(phases) * (n - 1), step, lambda s: "ring", start_s)


def pairwise_alltoall(name: str, ranks: I32, size: int, start_s: float = 0.0) -> Collective:
    """Pairwise exchange: in step k (1..n-1) rank i sends its chunk for rank (i+k) mod n."""
    n = int(ranks.size)
    chunks = _chunks(size, n)
    idx = np.arange(n, dtype=np.int32)

    def step(s: int) -> StepArrays:
        dst = ((idx + s + 1) % n).astype(np.int32)
        return idx, dst, chunks[dst]

    return Collective(name, "alltoall", ranks, size, n - 1, step, lambda s: ("shift", s), start_s)


def from_plan(name: str, plan: Plan, network: Network, start_s: float = 0.0) -> Collective:
    """Any planner's steps (halving-doubling, broadcast, ...) as arrays; for plans small enough to exist."""
    ranks = network.hosts(plan.ranks, "ranks")
    where = {host: i for i, host in enumerate(plan.ranks)}
    steps = [
        (
            np.array([where[t.src] for t in st], dtype=np.int32),
            np.array([where[t.dst] for t in st], dtype=np.int32),
            np.array([t.size_bytes for t in st], dtype=np.float64),
        )
        for st in plan.steps
    ]
    kind = plan.kind
    return Collective(
        name, kind, ranks, plan.size_bytes, len(steps), lambda s: steps[s], lambda s: ("step", s), start_s
    )


def one_phase_alltoall(name: str, ranks: I32, size: int, start_s: float = 0.0) -> FlowBatch:
    """Every pair at once (MoE dispatch as one grouped send/recv): rank i sends chunk j to rank j."""
    n = int(ranks.size)
    chunks = _chunks(size, n)
    i = np.repeat(np.arange(n, dtype=np.int32), n - 1)
    k = np.tile(np.arange(1, n, dtype=np.int32), n)
    j = (i + k) % n
    return FlowBatch(
        name=name,
        src=ranks[i],
        dst=ranks[j],
        size_bytes=chunks[j],
        start_s=np.full(i.size, start_s),
        rate_cap_gbps=np.full(i.size, np.inf),
        duration_s=np.full(i.size, np.nan),
        sport=flow_sports(pair_qp(0, i.astype(np.int64), j.astype(np.int64), n)),  # one QP per pair
        collective=("alltoall", n, size),
    )


def sized_batch(name: str, src: I32, dst: I32, size: float, start_s: float = 0.0, seed: int = 0) -> FlowBatch:
    """Flows of `size` bytes, each from a QP of its own: a seeded random UDP source port (its entropy)."""
    n = int(src.size)
    return FlowBatch(
        name,
        src.astype(np.int32),
        dst.astype(np.int32),
        np.full(n, float(size)),
        np.full(n, start_s),
        np.full(n, np.inf),
        np.full(n, np.nan),
        seeded_sport_array(seed, n),
    )


def derangement(n: int, seed: int) -> I32:
    """The derangement `traffic.patterns.permutation` draws (same seed, same pairs)."""
    rng, dst = random.Random(seed), list(range(n))
    while True:
        rng.shuffle(dst)
        if all(a != b for a, b in enumerate(dst)):
            return np.array(dst, dtype=np.int32)


def offleaf_derangement(leaf: I32, seed: int) -> I32:
    """A random permutation in which every host sends to (and receives from) a host on another leaf.

    A uniform shuffle, then each same-leaf pair swaps destinations with a random partner for which both
    new pairs leave their leaves (seeded; needs at least two leaves and no leaf with more than half the
    hosts)."""
    n = leaf.size
    counts = np.bincount(leaf)
    if (counts > n // 2).any():
        raise SimInputError("a leaf holds more than half the hosts: no off-leaf permutation", "traffic")
    rng = np.random.default_rng(seed)
    dst = rng.permutation(n).astype(np.int32)
    for _ in range(100):
        bad = np.flatnonzero(leaf[dst] == leaf)
        if bad.size == 0:
            return dst
        for i in bad:
            if leaf[dst[i]] != leaf[i]:
                continue
            for j in rng.permutation(n):
                if leaf[dst[j]] != leaf[i] and leaf[dst[i]] != leaf[j]:
                    dst[i], dst[j] = dst[j], dst[i]
                    break
    raise SimInputError("could not build an off-leaf permutation", "traffic")  # pragma: no cover


ADHOC = (
    "permutation",
    "permutation:offleaf",
    "alltoall",
    "alltoall:steps",
    "shift:S",
    "incast:N",
    "allreduce",
)


def adhoc(
    spec: str, network: Network, size_bytes: int, seed: int, hosts: Sequence[str] | None = None
) -> Workload:
    """An ad hoc workload by name (see module docstring), over `hosts` (default: every host)."""
    names = list(hosts) if hosts is not None else [e.node for e in network.subnet.endpoints]
    eps = network.hosts(names, "hosts")
    n = eps.size
    if n < 2:
        raise SimInputError("needs at least two hosts", "hosts")
    if size_bytes < 1:
        raise SimInputError(f"must be at least 1 byte, got {size_bytes}", "size")
    kind, _, arg = spec.partition(":")
    label = f"{spec} over {n} hosts, {size_bytes} B"
    if kind == "permutation" and arg in ("", "offleaf"):
        perm = derangement(n, seed) if arg == "" else offleaf_derangement(network.leaf_of[eps], seed)
        return Workload(batches=(sized_batch(spec, eps, eps[perm], size_bytes, seed=seed),), label=label)
    if kind == "alltoall" and arg == "":
        return Workload(batches=(one_phase_alltoall(spec, eps, size_bytes),), label=label)
    if kind == "alltoall" and arg == "steps":
        return Workload(collectives=(pairwise_alltoall(spec, eps, size_bytes),), label=label)
    if kind == "allreduce" and arg in ("", "ring"):
        return Workload(collectives=(ring(spec, "allreduce-ring", eps, size_bytes),), label=label)
    if kind == "shift":
        shift = _int_arg(arg, spec, 1, n - 1)
        dst = eps[(np.arange(n) + shift) % n]
        return Workload(batches=(sized_batch(spec, eps, dst, size_bytes, seed=seed),), label=label)
    if kind == "incast":
        senders = _int_arg(arg, spec, 1, n - 1)
        order = np.random.default_rng(seed).permutation(n)
        receiver, chosen = eps[order[0]], eps[np.sort(order[1 : senders + 1])]
        batch = sized_batch(spec, chosen, np.full(senders, receiver, dtype=np.int32), size_bytes, seed=seed)
        return Workload(batches=(batch,), label=label)
    raise SimInputError(f"unknown workload {spec!r} (known: {', '.join(ADHOC)})", "traffic")


def _int_arg(arg: str, spec: str, low: int, high: int) -> int:
    if not arg.isdigit() or len(arg) > 12 or not low <= int(arg) <= high:
        raise SimInputError(f"{clip(repr(spec))}: needs an integer in {low}..{high} after ':'", "traffic")
    return int(arg)


def collective(
    name: str,
    kind: str,
    ranks: I32,
    size: int,
    network: Network,
    one_phase: bool = False,
    start_s: float = 0.0,
) -> Collective | FlowBatch:
    """A collective by planner name: native generators where the plan could be huge, the planner itself
    otherwise.  `one_phase` only for all-to-all (all pairs at once)."""
    from traffic.patterns import plan  # noqa: PLC0415 - only for the planners without a native generator

    if kind == "alltoall":
        return (
            one_phase_alltoall(name, ranks, size, start_s)
            if one_phase
            else pairwise_alltoall(name, ranks, size, start_s)
        )
    if kind in ("allreduce-ring", "allgather", "reduce-scatter"):
        if one_phase:
            return one_phase_ring(name, kind, ranks, size, start_s)
        return ring(name, kind, ranks, size, start_s)
    names = [network.subnet.endpoints[int(e)].node for e in ranks]
    try:
        made = from_plan(name, plan(kind, names, size), network, start_s)
    except TrafficError as exc:
        raise SimInputError(exc.message, exc.field or "collective") from None
    return matrix_of(made) if one_phase else made


def one_phase_ring(name: str, kind: str, ranks: I32, size: int, start_s: float = 0.0) -> FlowBatch:
    """A ring collective's whole traffic matrix at once: rank i sends rank i+1 every chunk of every phase
    but the one it never forwards, (i + 1 - lag) mod n (the step generator's chunks, summed)."""
    n = int(ranks.size)
    chunks = _chunks(size, n)
    idx = np.arange(n)
    lags = {"allreduce-ring": [1, 0], "allgather": [0], "reduce-scatter": [1]}[kind]
    total = sum(float(size) - chunks[(idx + 1 - lag) % n] for lag in lags)
    return FlowBatch(name, ranks, ranks[(idx + 1) % n].astype(np.int32), np.asarray(total, dtype=np.float64),
                     np.full(n, start_s), np.full(n, np.inf), np.full(n, np.nan),
                     np.zeros(n, dtype=np.int32), collective=(kind, n, size))  # fmt: skip


def matrix_of(c: Collective) -> FlowBatch:
    """A collective's steps summed into one traffic matrix (every pair's bytes as one flow)."""
    totals: dict[tuple[int, int], float] = {}
    for s in range(c.n_steps):
        src, dst, size = c.step(s)
        for a, b, x in zip(src.tolist(), dst.tolist(), size.tolist(), strict=True):
            totals[(a, b)] = totals.get((a, b), 0.0) + x
    pairs = sorted(totals)
    n = len(pairs)
    return FlowBatch(c.name, c.ranks[[a for a, _ in pairs]], c.ranks[[b for _, b in pairs]],
                     np.array([totals[p] for p in pairs]), np.full(n, c.start_s), np.full(n, np.inf),
                     np.full(n, np.nan), np.zeros(n, dtype=np.int32),
                     collective=(c.kind, int(c.ranks.size), c.size_bytes))  # fmt: skip


__all__ = [
    "ADHOC",
    "Collective",
    "FlowBatch",
    "Workload",
    "adhoc",
    "collective",
    "derangement",
    "from_plan",
    "offleaf_derangement",
    "one_phase_alltoall",
    "pairwise_alltoall",
    "ring",
    "sized_batch",
]
