"""Routes of many flows at once, as the policies realise them on the controller's tables.

* `static`  — follow the LFT hop by hop (InfiniBand's destination routing).
* `ecmp`    — at every switch with more than one equal-cost port (`RoutingTables.alt`, the ports of the
              controller's select group, sorted), pick one by a seeded hash of the flow's 5-tuple salted
              with the switch's GUID, as Ethernet switches do: two flows that hash alike share a link.
* `spray`   — split evenly over the equal-cost ports at every hop: a flow becomes fractions of its rate on
              many links (per-packet spraying seen at flow level).
* `adaptive`— `spray` over the subset of equal-cost ports the controller currently allows (see
              `flowsim.adaptive`).

Walks are vectorised over flows (one numpy step per hop); alternatives are unpacked only for the
(switch, target switch) pairs that occur.  Routes are CSR arrays of fabric links (switch-to-switch and the
last hop into the destination host) with weights; the source host's own uplink is added by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controller.sm.subnet import NO_PORT
from flowsim.maxmin import ranges
from flowsim.network import F64, I32, I64, Bool, Routing

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

    @property
    def n(self) -> int:
        return int(self.ok.size)


def mix64(x: U64) -> U64:
    """splitmix64 finaliser: a well-mixed 64-bit hash, vectorised (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def five_tuple_hash(routing: Routing, src: I32, dst: I32, sport: I32, seed: int) -> U64:
    """The part of the ECMP hash that depends on the flow: (src LID/IP, dst LID/IP, UDP 17, sport, 4791)."""
    lids = routing.network.subnet.ep_lids.astype(np.uint64)
    word = lids[src] | (lids[dst] << np.uint64(16)) | (sport.astype(np.uint64) << np.uint64(32))
    with np.errstate(over="ignore"):
        word = word ^ (np.uint64(RoCE_DPORT) << np.uint64(48)) ^ (np.uint64(17) << np.uint64(60))
        return mix64(word ^ mix64(np.full(src.shape, seed & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)))


def _alternatives(
    routing: Routing, s: I32, t: I32, alt: npt.NDArray[np.uint8] | None = None
) -> tuple[I32, I32, I32]:
    """For (switch, target switch) rows: the index of the unique pair, its sorted equal-cost ports padded
    (U, P), and how many there are (U,)."""
    subnet = routing.subnet
    n = subnet.n_switches
    pair = s.astype(np.int64) * n + t
    uniq, inverse = np.unique(pair, return_inverse=True)
    table = routing.tables.alt if alt is None else alt
    bits = np.unpackbits(table[uniq // n, uniq % n], axis=1, count=subnet.n_ports).astype(bool)
    order = np.argsort(~bits, axis=1, kind="stable").astype(np.int32)  # set ports first, ascending
    return inverse.astype(np.int32), order, bits.sum(axis=1).astype(np.int32)


def walk(routing: Routing, src: I32, dst: I32, flow_hash: U64 | None) -> Routes:
    """Single-path routes: the LFT's (flow_hash None) or a hashed choice among the equal-cost ports."""
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
    choice_key = np.zeros(n_flows, dtype=np.int64)
    done = ~ok
    for hop in range(MAX_HOPS):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        s, t = cur[act], tgt[act]
        port = routing.tables.lft[s, lid[act]].astype(np.int32)
        if flow_hash is not None:
            transit = np.flatnonzero(s != t)
            if transit.size:
                inverse, order, count = _alternatives(routing, s[transit], t[transit])
                k = count[inverse]
                multi = k > 1
                if multi.any():
                    rows = transit[multi]
                    f = act[rows]
                    salted = mix64(flow_hash[f] ^ guids[s[rows]].astype(np.uint64))
                    pick = (salted % k[multi].astype(np.uint64)).astype(np.int32)
                    port[rows] = order[inverse[multi], pick]
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
    hops = counts
    pair = routing.sw_map[subnet.ep_switch[lsrc]].astype(np.int64) * routing.network.subnet.n_switches
    pair += routing.sw_map[tgt]
    key = np.where(ok & (hops <= KEY_HOPS + 1), (pair << 40) | (choice_key & ((1 << 40) - 1)), -1)
    return Routes(indptr, links_flat, np.ones(links_flat.size), ok, key.astype(np.int64))


def spray(routing: Routing, src: I32, dst: I32, alt: npt.NDArray[np.uint8] | None = None) -> Routes:
    """Even split over the equal-cost ports at every hop (or over the `alt` subset the adaptive policy
    allows); computed once per (source, target) switch pair."""
    subnet = routing.subnet
    n_sw = subnet.n_switches
    ok = routing.reachable(src, dst)
    lsrc = np.where(ok, routing.ep_local[src], 0)
    ldst = np.where(ok, routing.ep_local[dst], 0)
    s0 = subnet.ep_switch[lsrc].astype(np.int64)
    t0 = subnet.ep_switch[ldst].astype(np.int64)
    pairs, pair_of_flow = np.unique(s0 * n_sw + t0, return_inverse=True)
    p_links, p_weight, p_ok = _spray_pairs(
        routing, (pairs // n_sw).astype(np.int32), (pairs % n_sw).astype(np.int32), alt
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
    good = np.flatnonzero(ok)
    body = counts[good] - 1
    starts = p_links[0][pair_of_flow[good]]
    idx = ranges(starts, body)
    dest = ranges(indptr[good], body)
    links[dest] = p_links[1][idx]
    weight[dest] = p_weight[idx]
    links[indptr[good + 1] - 1] = last[good]
    weight[indptr[good + 1] - 1] = 1.0
    full_n = routing.network.subnet.n_switches
    key = np.where(ok, routing.sw_map[s0].astype(np.int64) * full_n + routing.sw_map[t0], -1)
    return Routes(indptr, links, weight, ok, key)


def _spray_pairs(
    routing: Routing, s0: I32, t0: I32, alt: npt.NDArray[np.uint8] | None
) -> tuple[tuple[I64, I32], F64, Bool]:
    """Fabric links (CSR by pair) and fractions for even per-hop splitting from s0 to t0."""
    subnet = routing.subnet
    n_sw = subnet.n_switches
    n_pairs = s0.size
    frontier_pair = np.arange(n_pairs, dtype=np.int64)
    frontier_sw = s0.astype(np.int32)
    frontier_w = np.ones(n_pairs)
    out_pair: list[I64] = []
    out_link: list[I32] = []
    out_w: list[F64] = []
    ok = np.ones(n_pairs, dtype=bool)
    for _ in range(MAX_HOPS):
        moving = frontier_sw != t0[frontier_pair]
        frontier_pair, frontier_sw, frontier_w = (
            frontier_pair[moving],
            frontier_sw[moving],
            frontier_w[moving],
        )
        if frontier_pair.size == 0:
            break
        inverse, order, count = _alternatives(routing, frontier_sw, t0[frontier_pair], alt)
        k = count[inverse]
        # a row without alternatives falls back to its LFT port toward the target switch
        none = k == 0
        if none.any():
            ok[frontier_pair[none]] = False
        rep = np.repeat(np.arange(frontier_pair.size), np.maximum(k, 0))
        j = ranges(np.zeros(frontier_pair.size, dtype=np.int64), np.maximum(k, 0))
        port = order[inverse[rep], j]
        sw = frontier_sw[rep]
        link = routing.link_of[sw, port]
        nxt = subnet.nbr[sw, port]
        w = frontier_w[rep] / k[rep]
        pair = frontier_pair[rep]
        bad = (link < 0) | (nxt < 0)
        if bad.any():
            ok[pair[bad]] = False
        out_pair.append(pair)
        out_link.append(link)
        out_w.append(w)
        # merge fractions arriving at the same switch for the same pair
        merged, inv = np.unique(pair * n_sw + np.where(bad, 0, nxt), return_inverse=True)
        frontier_w = np.bincount(inv, weights=w).astype(np.float64)
        frontier_pair = merged // n_sw
        frontier_sw = (merged % n_sw).astype(np.int32)
    else:
        ok[np.unique(frontier_pair)] = False  # never arrived: a loop
    pair_all = np.concatenate(out_pair) if out_pair else np.zeros(0, dtype=np.int64)
    link_all = np.concatenate(out_link) if out_link else np.zeros(0, dtype=np.int32)
    w_all = np.concatenate(out_w) if out_w else np.zeros(0)
    # one entry per (pair, link): fractions of the same link summed
    merged, inv = np.unique(pair_all * (1 << 32) + np.maximum(link_all, 0), return_inverse=True)
    w_sum = np.bincount(inv, weights=w_all).astype(np.float64) if merged.size else np.zeros(0)
    pair_of = merged >> 32
    links = (merged & 0xFFFFFFFF).astype(np.int32)
    indptr = np.zeros(n_pairs + 1, dtype=np.int64)
    np.cumsum(np.bincount(pair_of, minlength=n_pairs), out=indptr[1:])
    return (indptr, links), w_sum, ok.astype(bool)


__all__ = ["Routes", "five_tuple_hash", "mix64", "spray", "walk"]
