"""Workload planners: collectives and synthetic patterns as steps of point-to-point transfers.

A plan says who sends how many bytes to whom in which step, and nothing about time or transport, so the
same plan drives the Mininet emulator (one RDMA WRITE per transfer, a barrier between steps) and a flow
simulator (max-min rates per step).  Steps are what make collectives interesting for a fabric: in a ring
every rank sends at once, so a step is a permutation and its completion time is set by the slowest link.

Sizes follow nccl-tests (doc/PERFORMANCE.md) so measured numbers compare with published ones: `size_bytes`
is the per-rank buffer S (for all-gather the output buffer, for reduce-scatter the input buffer), algbw =
S / time and busbw = algbw x `bus_factor`, which rescales every collective to what each rank's link
carried, so busbw is comparable to the link speed whatever the collective and n.

Buffers are cut into n chunks whose sizes sum exactly to S (the remainder goes one byte each to the first
chunks), so byte conservation holds exactly, not just up to rounding.  Transfers of zero bytes (chunks of a
tiny buffer) are left out: a rank with nothing to send sends nothing.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from traffic.errors import TrafficError, parse_hosts, parse_size

#: Host lists may be given as a sequence or as text for `parse_hosts` ("h1..h16").
Hosts = Sequence[str] | str
#: Sizes may be given as a byte count or as text for `parse_size` ("64MiB").
Size = int | str
_Raw = list[list[tuple[str, str, int, str]]]


@dataclass(frozen=True)
class Transfer:
    """One message of a step; `tag` says which piece of the buffer it is (for traces and debugging)."""

    step: int
    src: str
    dst: str
    size_bytes: int
    tag: str = ""


@dataclass(frozen=True)
class Plan:
    """Steps of transfers; a step may start only when the previous one is complete (data dependencies)."""

    name: str
    kind: str
    ranks: tuple[str, ...]
    size_bytes: int
    steps: tuple[tuple[Transfer, ...], ...]

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(t for step in self.steps for t in step)

    @property
    def total_bytes(self) -> int:
        return sum(t.size_bytes for step in self.steps for t in step)

    def bytes_by_pair(self) -> dict[tuple[str, str], int]:
        """Bytes per (src, dst): the traffic matrix a router has to place."""
        out: dict[tuple[str, str], int] = {}
        for t in self.transfers:
            out[t.src, t.dst] = out.get((t.src, t.dst), 0) + t.size_bytes
        return out


# --- bus bandwidth (nccl-tests) -------------------------------------------------------------------------

_FAMILY = {
    "allreduce": "allreduce",
    "allreduce-ring": "allreduce",
    "allreduce-hd": "allreduce",
    "alltoall": "alltoall",
    "allgather": "allgather",
    "reduce-scatter": "reduce-scatter",
    "broadcast": "broadcast",
}


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw for a collective of n ranks: what each rank's link carries per byte of buffer.

    All-reduce moves 2(n-1)/n x S per rank (reduce-scatter then all-gather), all-gather, reduce-scatter and
    all-to-all (n-1)/n x S, broadcast S; dividing by these would make busbw equal the link speed at best.
    """
    family = _FAMILY.get(kind)
    if family is None:
        raise TrafficError(f"no bus bandwidth for {kind!r} (known: {', '.join(_FAMILY)})", field="kind")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TrafficError(f"needs at least 1 rank, got {n!r}", field="ranks")
    if family == "allreduce":
        return 2 * (n - 1) / n
    if family == "broadcast":
        return 1.0
    return (n - 1) / n


def score(kind: str, n: int, size_bytes: Size, seconds: float) -> dict[str, float]:
    """algbw and busbw in GB/s (1e9 bytes/s, as nccl-tests prints them, not GiB/s and not Gbit/s)."""
    size = parse_size(size_bytes)
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise TrafficError(f"must be a positive time, got {seconds!r}", field="seconds")
    algbw = size / seconds / 1e9
    return {"algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(kind, n)}


# --- helpers --------------------------------------------------------------------------------------------


def split_bytes(total: int, parts: int) -> list[int]:
    """`parts` sizes summing exactly to `total`; the first `total % parts` get one byte more."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _hosts(hosts: Hosts, field: str, minimum: int = 2) -> tuple[str, ...]:
    names = parse_hosts(hosts, field=field) if isinstance(hosts, str) else list(hosts)
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise TrafficError(f"bad host name {name!r}", field=field)
        if name in seen:
            raise TrafficError(f"{name!r} is listed twice", field=field)
        seen.add(name)
    if len(names) < minimum:
        raise TrafficError(f"needs at least {minimum}, got {len(names)}", field=field)
    return tuple(names)


def _size(size_bytes: Size) -> int:
    size = parse_size(size_bytes)
    if size < 1:
        raise TrafficError("must be at least 1 byte", field="size")
    return size


def _plan(kind: str, ranks: tuple[str, ...], size: int, raw: _Raw) -> Plan:
    steps = tuple(
        tuple(Transfer(i, src, dst, nbytes, tag) for src, dst, nbytes, tag in step if nbytes > 0)
        for i, step in enumerate(raw)
    )
    return Plan(f"{kind}-{len(ranks)}", kind, ranks, size, steps)


def _span(first: int, end: int) -> str:
    return f"c{first}" if end == first + 1 else f"c{first}..c{end - 1}"


def _ring(ranks: tuple[str, ...], chunks: list[int], phase: str, lag: int) -> _Raw:
    """n-1 steps; in step s rank i sends chunk (i - s - lag) mod n to its successor.

    With lag 1 (reduce-scatter) rank i ends holding the fully reduced chunk i; with lag 0 (all-gather)
    rank i starts by forwarding its own chunk i.  Every rank sends and receives exactly once per step.
    """
    n = len(ranks)
    return [
        [
            (ranks[i], ranks[(i + 1) % n], chunks[(i - s - lag) % n], f"{phase} c{(i - s - lag) % n}")
            for i in range(n)
        ]
        for s in range(n - 1)
    ]


# --- collectives ----------------------------------------------------------------------------------------


def ring_allreduce(ranks: Hosts, size_bytes: Size) -> Plan:
    """Ring all-reduce (NCCL's default for large buffers): reduce-scatter, then all-gather, 2(n-1) steps.

    Bandwidth-optimal (each rank sends 2(n-1)/n x S) but latency grows with n, and every step loads each
    ring edge once: a ring laid out along one rail never leaves the rail leaf.
    """
    r, size = _hosts(ranks, "ranks"), _size(size_bytes)
    chunks = split_bytes(size, len(r))
    return _plan(
        "allreduce-ring", r, size, _ring(r, chunks, "reduce-scatter", 1) + _ring(r, chunks, "all-gather", 0)
    )


def halving_doubling_allreduce(ranks: Hosts, size_bytes: Size) -> Plan:
    """Rabenseifner all-reduce: halving (reduce-scatter) then doubling (all-gather), 2 log2(n) steps.

    Same bytes as the ring in far fewer steps, but partners are 1, 2, 4, ... ranks apart, so the traffic
    crosses ever larger parts of the fabric; that contrast with the ring is why both are here.  Only
    defined for a power-of-two number of ranks.
    """
    r, size = _hosts(ranks, "ranks"), _size(size_bytes)
    n = len(r)
    if n & (n - 1):
        raise TrafficError(
            f"halving-doubling needs a power-of-two number of ranks, got {n} (use allreduce-ring)",
            field="ranks",
        )
    chunks = split_bytes(size, n)
    offset = [0]
    for c in chunks:
        offset.append(offset[-1] + c)
    lo, hi = [0] * n, [n] * n
    raw: _Raw = []
    for k in range(n.bit_length() - 1):  # step k: partner i ^ 2^k, S / 2^(k+1) each
        bit, step = 1 << k, []
        for i in range(n):
            mid = (lo[i] + hi[i]) // 2
            (a, b), keep = ((lo[i], mid), (mid, hi[i])) if i & bit else ((mid, hi[i]), (lo[i], mid))
            step.append((r[i], r[i ^ bit], offset[b] - offset[a], f"reduce-scatter {_span(a, b)}"))
            lo[i], hi[i] = keep
        raw.append(step)
    for k in reversed(range(n.bit_length() - 1)):  # mirror: partner i ^ 2^k, ranges double back
        bit, step = 1 << k, []
        for i in range(n):
            step.append(
                (r[i], r[i ^ bit], offset[hi[i]] - offset[lo[i]], f"all-gather {_span(lo[i], hi[i])}")
            )
            width = hi[i] - lo[i]
            lo[i], hi[i] = (lo[i] - width, hi[i]) if i & bit else (lo[i], hi[i] + width)
        raw.append(step)
    return _plan("allreduce-hd", r, size, raw)


def alltoall(ranks: Hosts, size_bytes: Size) -> Plan:
    """Pairwise exchange: in step k (1..n-1) rank i sends its chunk for rank (i+k) mod n.

    Each step is a shift permutation, the classic adversary of static ECMP/fat-tree routing, and the whole
    collective is every pair exactly once (MoE expert parallelism's dispatch/combine).
    """
    r, size = _hosts(ranks, "ranks"), _size(size_bytes)
    n, chunks = len(r), split_bytes(size, len(r))
    raw = [
        [(r[i], r[(i + k) % n], chunks[(i + k) % n], f"c{(i + k) % n}") for i in range(n)]
        for k in range(1, n)
    ]
    return _plan("alltoall", r, size, raw)


def allgather_ring(ranks: Hosts, size_bytes: Size) -> Plan:
    """Ring all-gather: n-1 steps of S/n; S is the gathered (output) buffer, as in nccl-tests."""
    r, size = _hosts(ranks, "ranks"), _size(size_bytes)
    return _plan("allgather", r, size, _ring(r, split_bytes(size, len(r)), "all-gather", 0))


def reduce_scatter_ring(ranks: Hosts, size_bytes: Size) -> Plan:
    """Ring reduce-scatter: n-1 steps of S/n; S is the input buffer and rank i ends with chunk i."""
    r, size = _hosts(ranks, "ranks"), _size(size_bytes)
    return _plan("reduce-scatter", r, size, _ring(r, split_bytes(size, len(r)), "reduce-scatter", 1))


def broadcast(ranks: Hosts, size_bytes: Size, root: str | None = None, chunks: int = 8) -> Plan:
    """Pipelined chain broadcast root -> next -> ... : chunk c leaves chain position j in step j + c.

    Pipelining is why a broadcast costs ~S per link instead of S x hops; the chain follows the rank order
    starting at the root, so a rail-aware rank order keeps it on the rail too.
    """
    r, size = _hosts(ranks, "ranks"), _size(size_bytes)
    origin = r[0] if root is None else root
    if origin not in r:
        raise TrafficError(f"{origin!r} is not one of the ranks", field="root")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise TrafficError(f"must be an integer >= 1, got {chunks!r}", field="chunks")
    start = r.index(origin)
    chain = r[start:] + r[:start]
    pieces = split_bytes(size, min(chunks, size))
    raw: _Raw = [[] for _ in range(len(chain) - 2 + len(pieces))]
    for j in range(len(chain) - 1):
        for c, piece in enumerate(pieces):
            raw[j + c].append((chain[j], chain[j + 1], piece, f"c{c}"))
    return _plan("broadcast", r, size, raw)


# --- synthetic traffic patterns (one step each; size_bytes is per flow) --------------------------------


def incast(senders: Hosts, receiver: str, size_bytes: Size) -> Plan:
    """Every sender to one receiver at once: the many-to-one burst that fills a switch egress queue."""
    s, size = _hosts(senders, "senders", minimum=1), _size(size_bytes)
    if not isinstance(receiver, str) or not receiver:
        raise TrafficError(f"bad host name {receiver!r}", field="receiver")
    if receiver in s:
        raise TrafficError(f"{receiver!r} is also a sender", field="receiver")
    return _plan("incast", (*s, receiver), size, [[(src, receiver, size, "") for src in s]])


def permutation(hosts: Hosts, size_bytes: Size, seed: int = 0) -> Plan:
    """A uniformly random derangement: every host sends to one other and receives from one other.

    A permutation loads every NIC exactly once, so any congestion it shows is the fabric's (routing, ECMP
    collisions), never the endpoints'.  Rejection sampling keeps it uniform; ~e shuffles on average.
    """
    h, size = _hosts(hosts, "hosts"), _size(size_bytes)
    rng, dst = random.Random(seed), list(h)
    while True:
        rng.shuffle(dst)
        if all(a != b for a, b in zip(h, dst, strict=True)):
            break
    return _plan("permutation", h, size, [[(a, b, size, "") for a, b in zip(h, dst, strict=True)]])


def hotspot(hosts: Hosts, hot: str, size_bytes: Size, fraction: float = 0.5, seed: int = 0) -> Plan:
    """Each host sends one flow: to `hot` with probability `fraction`, else to a random host (not itself,
    not `hot`, so the hot share is exactly `fraction` in expectation).  `hot` itself sends to a random other.
    """
    h, size = _hosts(hosts, "hosts"), _size(size_bytes)
    if hot not in h:
        raise TrafficError(f"{hot!r} is not one of the hosts", field="hot")
    if not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
        raise TrafficError(f"must be between 0 and 1, got {fraction!r}", field="fraction")
    rng, flows = random.Random(seed), []
    for src in h:
        others = [d for d in h if d not in (src, hot)]
        if src == hot:
            dst = rng.choice([d for d in h if d != hot])
        elif rng.random() < fraction or not others:
            dst = hot
        else:
            dst = rng.choice(others)
        flows.append((src, dst, size, "hot" if dst == hot else ""))
    return _plan("hotspot", h, size, [flows])


def uniform(hosts: Hosts, size_bytes: Size, flows: int, seed: int = 0) -> Plan:
    """`flows` independent random (src, dst) pairs, src != dst; pairs may repeat, as in real mixes."""
    h, size = _hosts(hosts, "hosts"), _size(size_bytes)
    if isinstance(flows, bool) or not isinstance(flows, int) or flows < 1:
        raise TrafficError(f"must be an integer >= 1, got {flows!r}", field="flows")
    rng = random.Random(seed)
    pairs = [rng.sample(h, 2) for _ in range(flows)]
    return _plan("uniform", h, size, [[(a, b, size, "") for a, b in pairs]])


# --- rank order -----------------------------------------------------------------------------------------


def rail_aware_order(
    hosts: Sequence[str], rail_of: Mapping[str, int], server_of: Mapping[str, str]
) -> list[str]:
    """Ranks reordered so ring neighbours share a rail: all rail-0 NICs, then all rail-1 NICs, ...

    In a rail-optimised fabric NIC i of every server hangs off rail leaf i, so two same-rail NICs are one
    leaf apart while different rails meet only at the spine.  A ring in host order (h1, h2, ... = the GPUs
    of one server, then the next) would send almost every edge across the spine; grouped by rail, only the
    edges between runs leave a leaf.  Runs alternate server direction (snake) so each change of rail happens
    between two NICs of the same server, which a real system bridges over NVLink/PCIe, not the fabric.
    """
    h = _hosts(hosts, "hosts", minimum=1)
    for name in h:
        if name not in rail_of:
            raise TrafficError(f"no rail for host {name!r}", field="rail_of")
        if name not in server_of:
            raise TrafficError(f"no server for host {name!r}", field="server_of")
    server_rank: dict[str, int] = {}
    for name in h:
        server_rank.setdefault(server_of[name], len(server_rank))
    by_rail: dict[int, list[str]] = {}
    for name in h:
        by_rail.setdefault(rail_of[name], []).append(name)
    order: list[str] = []
    for run, rail in enumerate(sorted(by_rail)):
        members = sorted(by_rail[rail], key=lambda name: server_rank[server_of[name]])
        order.extend(reversed(members) if run % 2 else members)
    return order


# --- registry -------------------------------------------------------------------------------------------

PLANNERS: dict[str, Callable[..., Plan]] = {
    "allreduce-ring": ring_allreduce,
    "allreduce-hd": halving_doubling_allreduce,
    "alltoall": alltoall,
    "allgather": allgather_ring,
    "reduce-scatter": reduce_scatter_ring,
    "broadcast": broadcast,
}


def plan(kind: str, ranks: Hosts, size_bytes: Size, **kw: object) -> Plan:
    """A collective by name, for CLIs and scenario files; an option a planner lacks is a TrafficError."""
    planner = PLANNERS.get(kind)
    if planner is None:
        raise TrafficError(f"unknown kind {kind!r} (known: {', '.join(PLANNERS)})", field="kind")
    options = set(inspect.signature(planner).parameters) - {"ranks", "size_bytes"}
    for key in kw:
        if key not in options:
            known = f" (options: {', '.join(sorted(options))})" if options else ""
            raise TrafficError(f"{kind} has no option {key!r}{known}", field=key)
    return planner(ranks, size_bytes, **kw)
