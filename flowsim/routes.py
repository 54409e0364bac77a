"""Routes of many flows at once, as the policies realise them on the controller's tables.

* `static`  — follow the LFT hop by hop (InfiniBand's destination routing).
* pinned    — a flow that keeps one UDP source port under a multipath policy (`ecmp`, or `entropy: fixed`):
              at every switch with equal-cost ports, the slot its source port picks in the controller's
              slot table (`flowsim.slots`), so two flows whose ports pick the same slot share a link, as on
              the emulated switches.
* sprayed   — a flow whose packets vary the source port (`spray`, `adaptive`): split over the set's ports
              in proportion to the slots each holds (or to local adaptive routing's weights).

Walks are vectorised over flows (one numpy step per hop); sets are looked up only for the (switch, target
switch) pairs that occur.  Routes are CSR arrays of fabric links (switch-to-switch and the last hop into
the destination host) with weights; the source host's own uplink is added by the engine.  With `usage`,
routes also say which slot-table set (and slot, for pinned flows) they cross with what share of the flow:
adaptive routing's per-slot counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import NO_PORT
from flowsim.maxmin import ranges
from flowsim.network import F64, I32, I64, Bool, Routing
from flowsim.slots import SlotTables, mix64

U64 = npt.NDArray[np.uint64]
#: Longest route followed (a 3-tier fat-tree needs 5 switch hops; loops are cut here and reported).
MAX_HOPS = 16
#: Hops whose port choice is packed into a route key (8 bits each); longer routes are never aggregated.
KEY_HOPS = 5
RoCE_DPORT = 4791


@dataclass(frozen=True)
class Routes:
    """CSR: flow i uses links[indptr[i]:indptr[i+1]] with those weights (fractions of its rate)."""

    indptr: I64
    links: I32
    weight: F64
    #: Routes that reach their destination (others: no route, a loop, or a host cut off).
    ok: Bool
    #: A key equal for flows between the same two switches on the same route (-1: do not aggregate).
    key: I64
    #: (flow, set, slot or -1 for sprayed, share of the flow, hop) per set crossed, when asked for.
    usage: tuple[I64, I32, I64, F64, I32] | None = None
    #: Hop of every entry of `links` (0: the first switch's egress): open-loop flows lose packets hop by hop.
    hop: I32 | None = None

    @property
    def n(self) -> int:
        return int(self.ok.size)


def five_tuple_hash(routing: Routing, src: I32, dst: I32, sport: I32, seed: int) -> U64:
    """The part of the ECMP hash that depends on the flow: (src LID/IP, dst LID/IP, UDP 17, sport, 4791)."""
    lids = routing.network.subnet.ep_lids.astype(np.uint64)
    word = lids[src] | (lids[dst] << np.uint64(16)) | (sport.astype(np.uint64) << np.uint64(32))
    with np.errstate(over="ignore"):
        word = word ^ (np.uint64(RoCE_DPORT) << np.uint64(48)) ^ (np.uint64(17) << np.uint64(60))
        return mix64(word ^ mix64(np.full(src.shape, seed & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)))


@dataclass(frozen=True)
class SlotPick:
    """How pinned flows choose at switches with equal-cost ports: by their source port's slot."""

    tables: SlotTables
    sport: I32
    flow_hash: U64
    usage: bool = False


def walk(routing: Routing, src: I32, dst: I32, pick: SlotPick | None) -> Routes:
    """Single-path routes: the LFT's (pick None) or each flow's slot among the equal-cost ports."""
    subnet = routing.subnet
    n_flows = src.size
    ok = routing.reachable(src, dst)
    lsrc = np.where(ok, routing.ep_local[src], 0)
    ldst = np.where(ok, routing.ep_local[dst], 0)
    cur = subnet.ep_switch[lsrc].astype(np.int32)
    tgt = subnet.ep_switch[ldst].astype(np.int32)
    lid = subnet.ep_lids[ldst]
    guids = routing.network.subnet.switch_guids[routing.sw_map]
    hop_links: list[I32] = []
    used: list[tuple[I64, I32, I64, int]] = []
    choice_key = np.zeros(n_flows, dtype=np.int64)
    done = ~ok
    for hop in range(MAX_HOPS):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        s, t = cur[act], tgt[act]
        port = routing.tables.lft[s, lid[act]].astype(np.int32)
        if pick is not None:
            transit = np.flatnonzero(s != t)
            if transit.size:
                sid = pick.tables.set_ids(s[transit], t[transit])
                multi = sid >= 0
                if multi.any():
                    rows = transit[multi]
                    f = act[rows]
                    slot = pick.tables.pinned_slot(
                        sid[multi], pick.sport[f], pick.flow_hash[f], guids[s[rows]]
                    )
                    port[rows] = pick.tables.pinned_port(sid[multi], slot)
                    if pick.usage:
                        used.append((f.astype(np.int64), sid[multi], slot, hop))
        bad = (port == NO_PORT) | (port <= 0)
        links = np.full(n_flows, -1, dtype=np.int32)
        safe = np.where(bad, 0, port)
        links[act] = np.where(bad, -1, routing.link_of[s, safe])
        hop_links.append(links)
        if hop < KEY_HOPS:  # transit hops only: the last port (into the host) is not part of the route key
            transit_port = np.where(s != t, safe, 0).astype(np.int64)
            choice_key[act] |= (transit_port & 0xFF) << (8 * hop)
        arrived = (s == t) & ~bad
        nxt = subnet.nbr[s, safe]
        dead = bad | (~arrived & (nxt < 0))
        ok[act[dead]] = False
        done[act[dead | arrived]] = True
        cur[act] = np.where(arrived | dead, s, nxt)
    ok &= done  # still walking after MAX_HOPS: a loop
    matrix = np.stack(hop_links, axis=1) if hop_links else np.full((n_flows, 0), -1, dtype=np.int32)
    matrix[~ok] = -1
    counts = (matrix >= 0).sum(axis=1)
    indptr = np.zeros(n_flows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    links_flat = matrix[matrix >= 0].astype(np.int32)  # row-major: flow by flow, hop order kept
    hops_flat = np.broadcast_to(np.arange(matrix.shape[1], dtype=np.int32), matrix.shape)[matrix >= 0]
    hops = counts
    pair = routing.sw_map[subnet.ep_switch[lsrc]].astype(np.int64) * routing.network.subnet.n_switches
    pair += routing.sw_map[tgt]
    key = np.where(ok & (hops <= KEY_HOPS + 1), (pair << 40) | (choice_key & ((1 << 40) - 1)), -1)
    usage = None
    if pick is not None and pick.usage:
        flows = np.concatenate([u[0] for u in used]) if used else np.zeros(0, dtype=np.int64)
        sets = np.concatenate([u[1] for u in used]) if used else np.zeros(0, dtype=np.int32)
        slots = np.concatenate([u[2] for u in used]) if used else np.zeros(0, dtype=np.int64)
        hops = np.concatenate([np.full(u[0].size, u[3], dtype=np.int32) for u in used]) if used else np.zeros(
            0, dtype=np.int32)  # fmt: skip
        keep = ok[flows]
        usage = (flows[keep], sets[keep], slots[keep], np.ones(int(keep.sum())), hops[keep])
    return Routes(indptr, links_flat, np.ones(links_flat.size), ok, key.astype(np.int64), usage,
                  hops_flat.astype(np.int32))  # fmt: skip


def spray(
    routing: Routing, src: I32, dst: I32, tables: SlotTables, frac: F64 | None = None, usage: bool = False
) -> Routes:
    """Per-packet routes: at every hop the set's ports in proportion to their slots (or `frac`, per set and
    port index); computed once per (source, target) switch pair."""
    subnet = routing.subnet
    n_sw = subnet.n_switches
    ok = routing.reachable(src, dst)
    lsrc = np.where(ok, routing.ep_local[src], 0)
    ldst = np.where(ok, routing.ep_local[dst], 0)
    s0 = subnet.ep_switch[lsrc].astype(np.int64)
    t0 = subnet.ep_switch[ldst].astype(np.int64)
    pairs, pair_of_flow = np.unique(s0 * n_sw + t0, return_inverse=True)
    pair_of_flow = pair_of_flow.ravel()
    p_links, p_weight, p_ok, p_usage, p_hop = _spray_pairs(
        routing, (pairs // n_sw).astype(np.int32), (pairs % n_sw).astype(np.int32), tables, frac
    )
    # the last hop, from the target switch into the host: its LFT port
    last_port = routing.tables.lft[t0, subnet.ep_lids[ldst]].astype(np.int32)
    last_ok = (last_port != NO_PORT) & (last_port > 0)
    last = np.where(last_ok, routing.link_of[t0, np.where(last_ok, last_port, 0)], -1)
    ok &= last_ok & p_ok[pair_of_flow]
    # assemble per flow: the pair's links, then the last hop
    p_count = np.diff(p_links[0])
    counts = np.where(ok, p_count[pair_of_flow] + 1, 0)
    indptr = np.zeros(src.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    links = np.empty(int(indptr[-1]), dtype=np.int32)
    weight = np.empty(int(indptr[-1]), dtype=np.float64)
    hop = np.empty(int(indptr[-1]), dtype=np.int32)
    good = np.flatnonzero(ok)
    body = counts[good] - 1
    starts = p_links[0][pair_of_flow[good]]
    idx = ranges(starts, body)
    dest = ranges(indptr[good], body)
    links[dest] = p_links[1][idx]
    weight[dest] = p_weight[idx]
    hop[dest] = p_hop[idx]
    links[indptr[good + 1] - 1] = last[good]
    weight[indptr[good + 1] - 1] = 1.0
    last_hop = np.zeros(p_ok.size, dtype=np.int32)  # one past the pair's deepest hop
    if p_hop.size:
        np.maximum.at(last_hop, np.repeat(np.arange(p_ok.size), np.diff(p_links[0])), p_hop + 1)
    hop[indptr[good + 1] - 1] = last_hop[pair_of_flow[good]]
    full_n = routing.network.subnet.n_switches
    key = np.where(ok, routing.sw_map[s0].astype(np.int64) * full_n + routing.sw_map[t0], -1)
    used = None
    if usage:
        u_ptr, u_set, u_w, u_hop = p_usage
        u_count = np.diff(u_ptr)
        flows = np.repeat(good.astype(np.int64), u_count[pair_of_flow[good]])
        at = ranges(u_ptr[pair_of_flow[good]], u_count[pair_of_flow[good]])
        used = (flows, u_set[at], np.full(flows.size, -1, dtype=np.int64), u_w[at], u_hop[at])
    return Routes(indptr, links, weight, ok, key, used, hop)


def _spray_pairs(
    routing: Routing, s0: I32, t0: I32, tables: SlotTables, frac: F64 | None
) -> tuple[tuple[I64, I32], F64, Bool, tuple[I64, I32, F64, I32], I32]:
    """Fabric links (CSR by pair) and fractions for per-hop splitting from s0 to t0, and the sets crossed
    (CSR by pair: set, share of the pair's traffic arriving there)."""
    subnet = routing.subnet
    n_sw = subnet.n_switches
    n_pairs = s0.size
    frontier_pair = np.arange(n_pairs, dtype=np.int64)
    frontier_sw = s0.astype(np.int32)
    frontier_w = np.ones(n_pairs)
    out_pair: list[I64] = []
    out_link: list[I32] = []
    out_w: list[F64] = []
    out_hop: list[I32] = []
    set_hop: list[I32] = []
    set_pair: list[I64] = []
    set_id: list[I32] = []
    set_w: list[F64] = []
    ok = np.ones(n_pairs, dtype=bool)
    for depth in range(MAX_HOPS):
        moving = frontier_sw != t0[frontier_pair]
        frontier_pair, frontier_sw, frontier_w = (
            frontier_pair[moving],
            frontier_sw[moving],
            frontier_w[moving],
        )
        if frontier_pair.size == 0:
            break
        target = t0[frontier_pair]
        sid = tables.set_ids(frontier_sw, target)
        multi = np.flatnonzero(sid >= 0)
        single = np.flatnonzero(sid < 0)
        rows_m, port_m, share_m = tables.split(sid[multi], None if frac is None else frac)
        rep_m = multi[rows_m]
        # rows with one equal-cost port (or none: unreachable) take it
        bits = np.unpackbits(routing.tables.alt[frontier_sw[single], target[single]], axis=1,
                             count=subnet.n_ports)  # fmt: skip
        has = bits.any(axis=1)
        if (~has).any():
            ok[frontier_pair[single[~has]]] = False
        rep_s = single[has]
        port_s = bits[has].argmax(axis=1).astype(np.int32)
        rep = np.concatenate([rep_m, rep_s]).astype(np.int64)
        port = np.concatenate([port_m, port_s]).astype(np.int32)
        share = np.concatenate([share_m, np.ones(rep_s.size)])
        set_pair.append(frontier_pair[multi])
        set_id.append(sid[multi])
        set_w.append(frontier_w[multi])
        set_hop.append(np.full(multi.size, depth, dtype=np.int32))
        sw = frontier_sw[rep]
        link = routing.link_of[sw, port]
        nxt = subnet.nbr[sw, port]
        w = frontier_w[rep] * share
        pair = frontier_pair[rep]
        bad = (link < 0) | (nxt < 0)
        if bad.any():
            ok[pair[bad]] = False
        out_pair.append(pair)
        out_link.append(link)
        out_w.append(w)
        out_hop.append(np.full(pair.size, depth, dtype=np.int32))
        # merge fractions arriving at the same switch for the same pair
        merged, inv = np.unique(pair * n_sw + np.where(bad, 0, nxt), return_inverse=True)
        frontier_w = np.bincount(inv.ravel(), weights=w).astype(np.float64)
        frontier_pair = merged // n_sw
        frontier_sw = (merged % n_sw).astype(np.int32)
    else:
        ok[np.unique(frontier_pair)] = False  # never arrived: a loop
    pair_all = np.concatenate(out_pair) if out_pair else np.zeros(0, dtype=np.int64)
    link_all = np.concatenate(out_link) if out_link else np.zeros(0, dtype=np.int32)
    w_all = np.concatenate(out_w) if out_w else np.zeros(0)
    hop_all = np.concatenate(out_hop) if out_hop else np.zeros(0, dtype=np.int32)
    # one entry per (pair, link): fractions of the same link summed; then each pair's entries by hop
    merged, inv = np.unique(pair_all * (1 << 32) + np.maximum(link_all, 0), return_inverse=True)
    w_sum = np.bincount(inv.ravel(), weights=w_all).astype(np.float64) if merged.size else np.zeros(0)
    hops = np.zeros(merged.size, dtype=np.int32)
    if merged.size:
        np.maximum.at(hops, inv.ravel(), hop_all)
    by_hop = np.lexsort((hops, merged >> 32))
    merged, w_sum, hops = merged[by_hop], w_sum[by_hop], hops[by_hop]
    pair_of = merged >> 32
    links = (merged & 0xFFFFFFFF).astype(np.int32)
    indptr = np.zeros(n_pairs + 1, dtype=np.int64)
    np.cumsum(np.bincount(pair_of, minlength=n_pairs), out=indptr[1:])
    sp = np.concatenate(set_pair) if set_pair else np.zeros(0, dtype=np.int64)
    order = np.argsort(sp, kind="stable")
    s_ptr = np.zeros(n_pairs + 1, dtype=np.int64)
    np.cumsum(np.bincount(sp, minlength=n_pairs), out=s_ptr[1:])
    s_ids = (np.concatenate(set_id) if set_id else np.zeros(0, dtype=np.int32))[order]
    s_w = (np.concatenate(set_w) if set_w else np.zeros(0))[order]
    s_hop = (np.concatenate(set_hop) if set_hop else np.zeros(0, dtype=np.int32))[order]
    return (indptr, links), w_sum, ok.astype(bool), (s_ptr, s_ids, s_w, s_hop), hops


__all__ = ["Routes", "SlotPick", "five_tuple_hash", "mix64", "spray", "walk"]
