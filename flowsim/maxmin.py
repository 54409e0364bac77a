"""Max-min fair rates by progressive filling, vectorised over a CSR flow x link incidence.

Every unfrozen flow's rate rises together; a link saturates when its remaining capacity is used up by the
flows still rising through it, and those flows freeze there.  The per-link "rising demand" (sum of
multiplicity x weight of unfrozen flows) is updated incrementally, by subtracting only the flows frozen in a
round (found through the transposed incidence), so a solve costs O(nnz + rounds x links), not
O(rounds x nnz).

Rounds are batched, exactly: a link's saturation level (current level + remaining / rising) can only rise
when other flows freeze.  So the links with the lowest levels, taken in order, saturate exactly at their
own levels as long as no flow crosses two of them — those all freeze in one round, each flow at its link's
level, and everything else rises to the highest of those levels.  Links at the same level (within a
relative 1e-9) count as one, which makes the symmetric cases real fabrics are full of one round each.

A flow is a *class*: `mult` identical members, each at the returned rate (per member), each member putting
`weight` of its rate on each of its links (weights < 1 are sprayed fractions).  `rate_cap` caps a member
(a NIC or a paced sender).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowsim.network import F64, I32, I64

#: Relative tolerance under which a link counts as saturated / two levels as equal.
REL_TOL = 1e-9
#: Lowest-level links examined per round for a batch of independent bottlenecks (1: the textbook algorithm,
#: one bottleneck level per round — the benchmark's baseline).
BATCH_LINKS = 512


@dataclass(frozen=True)
class Allocation:
    rate: F64  # per member, Gb/s
    load: F64  # per link, Gb/s
    rounds: int


def ranges(starts: I64, lengths: I64) -> I64:
    """Concatenation of arange(start, start + length) for every row (vectorised)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - np.cumsum(lengths) + lengths, lengths)
    return offsets + np.arange(total, dtype=np.int64)


def max_min(cap: F64, indptr: I64, links: I32, weight: F64, mult: F64, rate_cap: F64) -> Allocation:
    """Max-min fair member rates.  A flow without links gets its cap (0 if it has none)."""
    n_flows, n_links = mult.size, cap.size
    rate = np.zeros(n_flows)
    if n_flows == 0:
        return Allocation(rate, np.zeros(n_links), 0)
    counts = np.diff(indptr)
    flow_of = np.repeat(np.arange(n_flows, dtype=np.int64), counts)
    coef = mult[flow_of] * weight
    rising = np.bincount(links, weights=coef, minlength=n_links)
    remaining = cap.astype(np.float64).copy()
    # numpy radix-sorts 16-bit keys: O(nnz) for the transposed incidence of fabrics under 65,536 links
    by_link = np.argsort(links.astype(np.uint16) if n_links <= 1 << 16 else links, kind="stable")
    link_ptr = np.zeros(n_links + 1, dtype=np.int64)
    np.cumsum(np.bincount(links, minlength=n_links), out=link_ptr[1:])
    frozen = counts == 0
    rate[frozen] = np.where(np.isfinite(rate_cap[frozen]), rate_cap[frozen], 0.0)
    cap_order = np.argsort(rate_cap, kind="stable")
    cap_pos = 0
    level = 0.0
    rounds = 0
    left = int(n_flows - frozen.sum())
    share = np.empty(n_links)
    batch = min(8, BATCH_LINKS)
    while left > 0:
        rounds += 1
        live = rising > 1e-12
        share.fill(np.inf)
        np.divide(remaining, rising, out=share, where=live)
        while cap_pos < n_flows and frozen[cap_order[cap_pos]]:
            cap_pos += 1
        cap_level = float(rate_cap[cap_order[cap_pos]]) if cap_pos < n_flows else np.inf
        chosen, levels, whole = _independent_bottlenecks(
            share, level, cap_level, by_link, link_ptr, flow_of, frozen, batch
        )
        batch = min(BATCH_LINKS, batch * 2 if whole else max(8, chosen.size * 2))
        top = float(levels[-1]) if chosen.size else cap_level
        if not np.isfinite(top):
            break  # nothing limits the rest (cannot happen for flows with links)
        # flows freezing now: on a chosen link (at its level) or reaching their cap (at the top level)
        newly_rate: list[np.ndarray] = []
        newly: list[np.ndarray] = []
        if chosen.size:
            lens = link_ptr[chosen + 1] - link_ptr[chosen]
            entries = by_link[ranges(link_ptr[chosen], lens)]
            f = flow_of[entries]
            f_level = np.repeat(levels, lens)
            keep = ~frozen[f]
            f, f_level = f[keep], f_level[keep]
            if f.size > n_flows // 8:  # many: a mask over the flows is cheaper than sorting them
                at = np.full(n_flows, np.nan)
                at[f] = f_level  # a flow on two chosen links is on tied ones: same level either way
                f = np.flatnonzero(~np.isnan(at))
                newly.append(f)
                newly_rate.append(at[f])
            else:
                f, first = np.unique(f, return_index=True)
                newly.append(f)
                newly_rate.append(f_level[first])
        capped = []
        limit = top * (1 + REL_TOL)
        while cap_pos < n_flows and rate_cap[cap_order[cap_pos]] <= limit:
            c = int(cap_order[cap_pos])
            if not frozen[c]:
                capped.append(c)
            cap_pos += 1
        if capped:
            c_arr = np.array(capped, dtype=np.int64)
            if newly:
                c_arr = np.setdiff1d(c_arr, newly[0], assume_unique=True)
            newly.append(c_arr)
            newly_rate.append(rate_cap[c_arr])
        ids = np.concatenate(newly) if newly else np.zeros(0, np.int64)
        vals = np.concatenate(newly_rate) if newly_rate else np.zeros(0)
        # every rising flow advanced to `top`; frozen ones stopped at their own level: give the rest back
        remaining -= rising * (top - level)
        if ids.size:
            rate[ids] = vals
            frozen[ids] = True
            left -= int(ids.size)
            ent = ranges(indptr[ids], counts[ids])
            fo = np.repeat(np.arange(ids.size), counts[ids])
            rising -= np.bincount(links[ent], weights=coef[ent], minlength=n_links)
            remaining += np.bincount(links[ent], weights=coef[ent] * (top - vals[fo]), minlength=n_links)
        if chosen.size:
            rising[chosen] = 0.0
            remaining[chosen] = np.maximum(remaining[chosen], 0.0)
        level = top
        if ids.size == 0 and chosen.size == 0:  # pragma: no cover - defensive: no progress possible
            break
    rate = np.minimum(rate, rate_cap)
    load = np.bincount(links, weights=coef * rate[flow_of], minlength=n_links).astype(np.float64)
    return Allocation(rate, load, rounds)


def _independent_bottlenecks(
    share: F64,
    level: float,
    cap_level: float,
    by_link: I64,
    link_ptr: I64,
    flow_of: I64,
    frozen: np.ndarray,
    batch: int,
) -> tuple[I64, F64, bool]:
    """The lowest-level links that saturate exactly at their levels: a prefix (in level order) of links
    no flow crosses twice, links tied with the lowest level all included; none above the next cap.
    Looks at `batch` links beyond the tied ones; says whether all of them could be taken."""
    n = share.size
    k = max(1, min(batch, n))
    cand = np.argpartition(share, k - 1)[:k] if k < n else np.arange(n)
    cand = cand[np.isfinite(share[cand])]
    none = np.zeros(0, np.int64), np.zeros(0), False
    if cand.size == 0:
        return none
    cand = cand[np.argsort(share[cand], kind="stable")]
    lowest = level + share[cand[0]]
    if lowest > cap_level * (1 + REL_TOL):
        return none
    all_tied = np.flatnonzero(share <= share[cand[0]] * (1 + REL_TOL) + 1e-300)
    if all_tied.size >= cand.size:  # the tied group alone may exceed the batch: take it whole
        extra = cand[share[cand] > share[cand[0]] * (1 + REL_TOL) + 1e-300]
        cand = np.concatenate([all_tied, extra])
    lv = level + share[cand]
    tied = lv <= lowest * (1 + REL_TOL) + 1e-300
    lv[tied] = lowest
    lv = np.minimum(lv, np.inf)
    within = lv <= cap_level * (1 + REL_TOL)
    cut = int(np.argmin(within)) if not within.all() else cand.size
    cand, lv = cand[:cut], lv[:cut]
    n_tied = int(tied[:cut].sum())
    whole = cut == k
    if cand.size > n_tied:
        # rank of each candidate: the tied group is rank 0, others 1, 2, ...
        rank = np.maximum(np.arange(cand.size) - n_tied + 1, 0)
        lens = link_ptr[cand + 1] - link_ptr[cand]
        f = flow_of[by_link[ranges(link_ptr[cand], lens)]]
        r = np.repeat(rank, lens)
        live = ~frozen[f]
        f, r = f[live], r[live]
        key = f * (cand.size + 1) + r
        key.sort()
        f, r = key // (cand.size + 1), key % (cand.size + 1)
        dup = np.flatnonzero((f[1:] == f[:-1]) & (r[1:] > 0))
        if dup.size:
            conflict = int(r[1:][dup].min())  # the first rank whose link shares a flow with an earlier one
            cand, lv = cand[: n_tied + conflict - 1], lv[: n_tied + conflict - 1]
            whole = False
    return cand.astype(np.int64), lv, whole


__all__ = ["BATCH_LINKS", "REL_TOL", "Allocation", "max_min", "ranges"]


def open_loop(
    cap: F64, indptr: I64, links: I32, weight: F64, hop: I32, mult: F64, rate: F64, rounds: int = 16
) -> tuple[F64, F64]:
    """What open-loop flows (a fixed sending rate, no congestion control) deliver through drop-tail links:
    a link offered more than its capacity passes each arriving packet with probability capacity / offered
    (senders jittered, so drops fall in proportion to arrivals, not max-min), and what a flow lost on one
    hop no longer loads the hops after it.  Entries carry their hop number (0 at the sender); a flow split
    over several links at one hop (spraying) survives that hop in proportion to their shares (mean field).
    Links of infinite capacity (counters) pass everything and do not count towards survival.

    Returns (delivered rate per member, load carried per link: what left each link, counters: what
    arrived).  A fixed point of survival probabilities, iterated hop-ordered until it settles."""
    n_flows, n_links = mult.size, cap.size
    if n_flows == 0 or links.size == 0:
        return rate.copy(), np.zeros(n_links)
    counts = np.diff(indptr)
    flow_of = np.repeat(np.arange(n_flows, dtype=np.int64), counts)
    order = np.lexsort((hop, flow_of))
    load: F64 = np.zeros(n_links)
    f, h, lk, w = flow_of[order], hop[order].astype(np.int64), links[order], weight[order]
    real = np.isfinite(cap[lk])
    span = int(h.max()) + 2
    seg_key = f * span + np.maximum(h, 0)
    new_seg = np.ones(seg_key.size, dtype=bool)
    new_seg[1:] = seg_key[1:] != seg_key[:-1]
    seg_start = np.flatnonzero(new_seg)
    seg_of = np.cumsum(new_seg) - 1
    seg_flow = f[seg_start]
    first_seg = np.ones(seg_start.size, dtype=bool)
    first_seg[1:] = seg_flow[1:] != seg_flow[:-1]
    den = np.add.reduceat(np.where(real, w, 0.0), seg_start)
    survive = np.ones(n_links)
    offered = mult[f] * rate[f] * w
    log_avg = np.zeros(seg_start.size)
    for _ in range(rounds):
        num = np.add.reduceat(np.where(real, w * survive[lk], 0.0), seg_start)
        avg = np.where(den > 0, num / np.maximum(den, 1e-300), 1.0)
        log_avg = np.log(np.maximum(avg, 1e-300))
        cum = np.cumsum(log_avg)
        before = cum - log_avg  # inclusive sums up to the previous segment
        base = np.maximum.accumulate(np.where(first_seg, np.arange(seg_start.size), 0))
        exclusive = before - before[base]  # within the flow: survival of every earlier hop
        load = np.bincount(lk, weights=offered * np.exp(exclusive[seg_of]), minlength=n_links).astype(
            np.float64
        )
        new = np.where(load > cap, cap / np.maximum(load, 1e-300), 1.0)
        settled = bool(np.abs(new - survive).max() < 1e-12)
        survive = new
        if settled:
            break
    total = np.bincount(seg_flow, weights=log_avg, minlength=n_flows)
    delivered = rate * np.exp(total)
    carried = np.where(np.isfinite(cap), np.minimum(load, cap), load)
    return delivered, carried
