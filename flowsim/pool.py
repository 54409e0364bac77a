"""What the engine is told (`SimConfig`), what it returns (`SimResult`), and its table of active flows.

The pool keeps active flows as numpy columns (a row per flow or flow class) and their routes as slices of
an append-only store, so starting, finishing and rerouting flows are array operations; the store is
compacted when most of it is garbage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controller.sm.policies import PolicyParams
from flowsim.maxmin import ranges
from flowsim.network import F64, I32, I64
from traffic.figures import Flows

BYTES_PER_GBIT = 1e9 / 8


@dataclass(frozen=True)
class SimConfig:
    policy: str = "static"
    params: PolicyParams = field(default_factory=PolicyParams)
    engine: str = "ftree"
    seed: int = 0
    #: "auto": aggregate one-phase batches larger than `aggregate_above` members; "always"; "never".
    aggregate: str = "auto"
    aggregate_above: int = 50_000
    #: The reference run: a non-blocking fabric (only the hosts' own links constrain).
    ideal: bool = False
    heat_bins: int = 64
    max_events: int = 2_000_000
    #: Extrapolate runs of identical collective steps that run in lockstep (exact; off only to test that).
    lockstep: bool = True
    #: local-ar: damped re-splits per event at most (each one max-min solve).
    local_ar_rounds: int = 8


@dataclass
class GroupResult:
    name: str
    start_s: float
    end_s: float | None
    collective: tuple[str, int, int] | None  # (kind, ranks, per-rank bytes) when scored like nccl-tests
    bus_factor: float | None = None
    skipped_steps: int = 0
    job: int = 0
    timed: bool = False


@dataclass
class SimResult:
    policy: str
    end_s: float
    groups: list[GroupResult]
    #: Every finished flow (a class counts `mult` flows): job, step, payload offered and delivered, post
    #: time, FCT, FCT alone (`traffic.figures.Flows`).
    flows: Flows
    fabric_links: I64
    link_bytes: F64  # per fabric link
    heat: F64  # bins x fabric links, bytes
    bin_s: float
    stats: dict[str, float]
    unfinished: int
    #: Sets wider than the controller's 16 slots that routes crossed (modelled as one slot per port).
    wide_sets: int = 0
    adaptive_reasons: tuple[str, ...] = ()


class Pool:
    """Active flows as columns; routes as slices of an append-only store."""

    COLS = (
        "mult",
        "size",
        "remaining",
        "sent",
        "cap",
        "start",
        "end",
        "rate",
        "src",
        "dst",
        "sport",
        "owner",
        "step",
        "pos",
        "off",
        "len",
        "agg",
        "job",
        "payload",
        "posted",
        "alone",
        "pacer",
        "sprayed",
    )

    def __init__(self) -> None:
        self.mult = np.zeros(0)
        self.size = np.zeros(0)
        self.remaining = np.zeros(0)
        self.sent = np.zeros(0)
        self.cap = np.zeros(0)
        self.start = np.zeros(0)
        self.end = np.zeros(0)
        self.rate = np.zeros(0)
        self.src = np.zeros(0, np.int32)
        self.dst = np.zeros(0, np.int32)
        self.sport = np.zeros(0, np.int32)
        self.owner = np.zeros(0, np.int32)  # >= 0 batch index, < 0: -1 - collective index
        self.step = np.zeros(0, np.int64)
        self.pos = np.zeros(0, np.int64)
        self.off = np.zeros(0, np.int64)
        self.len = np.zeros(0, np.int64)
        self.agg = np.zeros(0, bool)
        self.job = np.zeros(0, np.int64)
        self.payload = np.zeros(0)  # payload share of the wire bytes
        self.posted = np.zeros(0)  # when the flow was posted (FCTs count from here)
        self.alone = np.zeros(0)  # its FCT alone on an idle fabric
        self.pacer = np.zeros(0, np.int32)
        self.sprayed = np.zeros(0, bool)
        self.store_links = np.zeros(1 << 16, np.int32)
        self.store_weight = np.zeros(1 << 16)
        self.store_hop = np.zeros(1 << 16, np.int32)
        self.used = 0

    @property
    def n(self) -> int:
        return int(self.mult.size)

    def put_routes(self, indptr: I64, links: I32, weight: F64, hop: I32 | None = None) -> tuple[I64, I64]:
        need = self.used + links.size
        live = int(self.len.sum())
        if need > self.store_links.size:
            if live * 2 < self.used:  # mostly garbage: compact instead of growing
                idx = ranges(self.off, self.len)
                kept_l, kept_w, kept_h = self.store_links[idx], self.store_weight[idx], self.store_hop[idx]
                self.off = (
                    np.concatenate([[0], np.cumsum(self.len)[:-1]]).astype(np.int64) if self.n else self.off
                )
                self.used = kept_l.size
                self.store_links[: self.used], self.store_weight[: self.used] = kept_l, kept_w
                self.store_hop[: self.used] = kept_h
                need = self.used + links.size
            size = self.store_links.size
            while size < need:
                size *= 2
            if size > self.store_links.size:
                self.store_links = np.resize(self.store_links, size)
                self.store_weight = np.resize(self.store_weight, size)
                self.store_hop = np.resize(self.store_hop, size)
        self.store_links[self.used : need] = links
        self.store_weight[self.used : need] = weight
        self.store_hop[self.used : need] = hop if hop is not None else 0
        off = self.used + indptr[:-1]
        self.used = need
        return off.astype(np.int64), np.diff(indptr).astype(np.int64)

    def add(self, **cols: np.ndarray) -> None:
        n = cols["mult"].size
        cols.setdefault("size", cols["remaining"])
        cols.setdefault("sent", np.zeros(n))
        cols.setdefault("payload", np.ones(n))
        cols.setdefault("pacer", np.full(n, -1))
        cols.setdefault("sprayed", np.zeros(n, bool))
        for name in self.COLS:
            setattr(
                self,
                name,
                np.concatenate([getattr(self, name), cols[name].astype(getattr(self, name).dtype)]),
            )

    def keep(self, mask: np.ndarray) -> None:
        for name in self.COLS:
            setattr(self, name, getattr(self, name)[mask])


__all__ = ["BYTES_PER_GBIT", "GroupResult", "Pool", "SimConfig", "SimResult"]
