"""The event loop: flows arrive, share links max-min fairly, complete; collectives step; faults reroute;
adaptive routing re-places flows at its interval, local adaptive routing at every event.

Rates are piecewise constant between events (arrival, completion, timed end, fault, adaptive tick), so the
simulation jumps from event to event and recomputes rates only there.  Completions closer than a relative
`BATCH_TOL` of each other are processed together.  Nothing here reads files or prints: progress goes to a
callback.

Where flows go (tables, slot tables, counters) is `flowsim.placement`'s; runs of identical collective
steps in lockstep are advanced whole periods at a time by `flowsim.lockstep`.

Routes live in an append-only store (a flow's links and weights are a slice of it), so rerouting appends and
the solver gathers the active slices into a CSR matrix.  Large one-phase batches (a 4,096-GPU all-to-all is
16.8 M flows) are aggregated into classes of flows that share source leaf, destination leaf, route, size
and cap: a class is one row of `mult` members; host NICs of a leaf become one bundle link whose capacity is
the sum of the NICs of the hosts taking part, and each member is capped at its own NIC's speed.  That is
exact when the hosts of a leaf carry the same load (collectives), an approximation otherwise.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from flowsim.adaptive import LOCAL_AR_TOL
from flowsim.lockstep import Lockstep
from flowsim.maxmin import max_min, open_loop, ranges
from flowsim.network import F64, I32, I64, Network, fabric_link_index
from flowsim.placement import Placement
from flowsim.policies import sim_policies
from flowsim.pool import BYTES_PER_GBIT, GroupResult, Pool, SimConfig, SimResult
from flowsim.routes import Routes
from flowsim.steps import CollectiveState
from flowsim.workload import FlowBatch, Workload
from traffic.entropy import flow_sports, pair_qp
from traffic.figures import Flows
from traffic.wire import roce_wire_bytes

Progress = Callable[[float, str], None]
#: Flows that would complete within this fraction of the elapsed time of the next completion complete with
#: it (an FCT error of at most 0.1 % of the time so far); it cuts events severalfold on ECMP all-to-alls.
BATCH_TOL = 1e-3


def add_to_bins(heat: F64, bin_s: float, t0: float, t1: float, per_s: F64) -> float:
    """Add `per_s` (bytes/s per link) over [t0, t1) into the utilisation-over-time bins `heat` (rows of
    `bin_s` seconds), halving the resolution in place while the run outgrows them; the new `bin_s`."""
    bins = heat.shape[0]
    while t1 > bins * bin_s:
        heat[: bins // 2] = heat[0::2] + heat[1::2]
        heat[bins // 2 :] = 0.0
        bin_s *= 2
    first, last = int(t0 / bin_s), min(bins - 1, int(t1 / bin_s))
    for b in range(first, last + 1):
        overlap = min(t1, (b + 1) * bin_s) - max(t0, b * bin_s)
        if overlap > 0:
            heat[b] += per_s * overlap
    return bin_s


class Simulator(Lockstep):
    def __init__(
        self, network: Network, workload: Workload, config: SimConfig, progress: Progress | None = None
    ):
        self.net = network
        self.work = workload
        self.cfg = config
        self.policy = sim_policies().create(config.policy, config.params)
        self.progress = progress
        n_sw = network.subnet.n_switches
        self.cap = np.concatenate([network.cap_gbps, np.zeros(2 * n_sw), workload.pacers_gbps])
        self.link_bytes = np.zeros(self.cap.size)
        self.tick_bytes = np.zeros(self.cap.size)
        self.load = np.zeros(self.cap.size)
        self.place = Placement(network, self.policy, config.engine, config.seed, config.ideal, self.cap.size,
                               self._grow)  # fmt: skip
        self.base_up, self.base_down = self.place.base_up, self.place.base_down
        self.nic = network.nic_gbps
        self.bundle_src = np.zeros(network.n_hosts, bool)
        self.bundle_dst = np.zeros(network.n_hosts, bool)
        self.fabric_ids = np.flatnonzero(network.fabric_link).astype(np.int64)
        self.pool = Pool()
        self.now = 0.0
        self.heat = np.zeros((config.heat_bins, self.fabric_ids.size))
        self.bin_s = 1e-6
        self.stats: dict[str, float] = dict.fromkeys(
            ("events", "solves", "rounds", "moves", "reroutes", "classes", "members", "skipped_steps"), 0.0
        )
        self.done: list[Flows] = []
        self.batches = list(workload.batches)
        timed_jobs = {j.index for j in workload.job_infos() if j.timed}
        self.groups = [GroupResult(b.name, math.inf, None, b.collective, job=b.job, timed=b.job in timed_jobs)
                       for b in self.batches]  # fmt: skip
        self.colls = [CollectiveState.of(c) for c in workload.collectives]
        for c in workload.collectives:
            self.groups.append(GroupResult(c.name, c.start_s, None, (c.kind, int(c.ranks.size), c.size_bytes),
                                           c.bus_factor, job=c.job))  # fmt: skip
        for g in self.groups:
            if g.collective and g.bus_factor is None:
                from traffic.patterns import bus_factor  # noqa: PLC0415

                g.bus_factor = bus_factor(g.collective[0], g.collective[1])
        self.arrivals: list[tuple[float, int, int, I64]] = []  # (time, seq, batch, indices)
        self._seq = 0
        self.batch_left = [b.n for b in self.batches]
        self.successor: list[I64 | None] = []
        for bi, b in enumerate(self.batches):
            free = np.flatnonzero(b.after < 0) if b.after is not None else np.arange(b.n)
            nxt = None
            if b.after is not None:
                nxt = np.full(b.n, -1, dtype=np.int64)
                has = np.flatnonzero(b.after >= 0)
                nxt[b.after[has]] = has
            self.successor.append(nxt)
            times, inverse = np.unique(b.start_s[free], return_inverse=True)
            for k, t in enumerate(times):
                self._push(float(t), bi, free[inverse.ravel() == k])
        self.faults = sorted(workload.faults)
        self.total_members = float(sum(b.n for b in self.batches)) + sum(
            float(c.step(0)[0].size) * c.n_steps for c in workload.collectives
        )
        self.done_members = 0.0
        self.dirty = True
        self.next_tick = config.params.interval_ms / 1000.0 if self.place.adaptive is not None else math.inf
        self.started_members = 0.0
        self.disturbances = 0

    def _grow(self, need: int) -> None:
        """Link ids up to `need` exist (counters are added as slot-table sets appear)."""
        if need <= self.cap.size:
            return
        more = need - self.cap.size
        self.cap = np.concatenate([self.cap, np.full(more, np.inf)])
        self.link_bytes = np.concatenate([self.link_bytes, np.zeros(more)])
        self.tick_bytes = np.concatenate([self.tick_bytes, np.zeros(more)])
        self.load = np.concatenate([self.load, np.zeros(more)])

    def _full_routes(
        self, src: I32, dst: I32, sport: I32, sprayed: np.ndarray, pacer: I32, aggregated: bool
    ) -> tuple[Routes, I64, I32, F64, I32]:
        return self.place.full_routes(src, dst, sport, sprayed, pacer, aggregated)

    # --- starting flows -----------------------------------------------------------------------------

    def _push(self, t: float, batch: int, idx: I64) -> None:
        heapq.heappush(self.arrivals, (t, self._seq, batch, idx))
        self._seq += 1

    def _sprayed(self, entropy: np.ndarray) -> np.ndarray:
        """Per flow: its packets vary the source port (entropy 2, or 0 under a per-packet policy)."""
        out: np.ndarray = (entropy == 2) | ((entropy == 0) & self.policy.per_packet)
        return out

    def _alone(self, size: F64, cap: F64, src: I32, dst: I32, pacer: I32) -> F64:
        """FCT alone on an idle fabric: bytes at the slowest of its cap, NICs and pacer."""
        rate = np.minimum(np.minimum(cap, self.nic[src]), self.nic[dst])
        paced = pacer >= 0
        rate[paced] = np.minimum(rate[paced], self.cap[self.place.base_pacer + pacer[paced]])
        return size / (rate * BYTES_PER_GBIT)

    def start_all(self) -> None:
        """Place every flow of every batch now, grouped as the event loop starts them (by start time; a
        message that waits for another on its own), for a model that keeps its own clock (`flowsim.ccsim`)."""
        while self.arrivals:
            _, _, bi, idx = heapq.heappop(self.arrivals)
            self._start_batch(bi, idx)
        for bi, b in enumerate(self.batches):
            if b.after is not None and (waiting := np.flatnonzero(b.after >= 0)).size:
                self._start_batch(bi, waiting)

    def _start_batch(self, bi: int, idx: I64) -> None:
        b = self.batches[bi]
        self.groups[bi].start_s = min(self.groups[bi].start_s, self.now)
        mode = self.cfg.aggregate
        aggregate = (mode == "always" or (mode == "auto" and idx.size > self.cfg.aggregate_above)) and (
            b.after is None
        )
        if aggregate:
            self._start_classes(bi, b, idx)
            return
        src, dst = b.src[idx], b.dst[idx]
        sprayed = self._sprayed(_col(b.entropy, idx, 0))
        pacer = _col(b.pacer, idx, -1)
        _r, indptr, links, weight, hop = self._full_routes(src, dst, b.sport[idx], sprayed, pacer, False)
        off, length = self.pool.put_routes(indptr, links, weight, hop)
        timed = ~np.isfinite(b.size_bytes[idx])
        cap = b.rate_cap_gbps[idx]
        alone = np.where(timed, b.duration_s[idx], self._alone(b.size_bytes[idx], cap, src, dst, pacer))
        self.pool.add(
            mult=np.ones(idx.size),
            remaining=b.size_bytes[idx],
            cap=cap,
            start=np.full(idx.size, self.now),
            end=np.where(timed, self.now + b.duration_s[idx], np.inf),
            rate=np.zeros(idx.size),
            src=src,
            dst=dst,
            sport=b.sport[idx],
            owner=np.full(idx.size, bi),
            step=np.zeros(idx.size),
            pos=idx,
            off=off,
            len=length,
            agg=np.zeros(idx.size, bool),
            job=np.full(idx.size, b.job),
            payload=_col(b.payload_frac, idx, 1.0),
            posted=b.start_s[idx],
            alone=alone,
            pacer=pacer,
            sprayed=sprayed,
        )
        self.stats["members"] += idx.size
        self.started_members += idx.size
        self.dirty = True

    def _start_classes(self, bi: int, b: FlowBatch, idx: I64) -> None:
        """Aggregate members into (route, size, cap) classes; routes are built for one member per class."""
        net = self.net
        nic = self.nic
        self.bundle_src[b.src[idx]] = True
        self.bundle_dst[b.dst[idx]] = True
        leaf = net.leaf_of
        n_sw = net.subnet.n_switches
        up = np.bincount(leaf, weights=nic * self.bundle_src, minlength=n_sw)
        down = np.bincount(leaf, weights=nic * self.bundle_dst, minlength=n_sw)
        self.cap[self.base_up : self.base_up + n_sw] = up
        self.cap[self.base_down : self.base_down + n_sw] = down
        sprayed_all = self._sprayed(_col(b.entropy, idx, 0))
        pacer_all = _col(b.pacer, idx, -1)
        by_pair = self.cfg.ideal or bool(sprayed_all.all())  # routes depend on the pair only
        keys: list[I64] = []
        for lo in range(0, idx.size, 1 << 20):
            chunk = idx[lo : lo + (1 << 20)]
            src, dst = b.src[chunk], b.dst[chunk]
            if by_pair:
                ok = self.place.routing.reachable(src, dst)
                key = leaf[src].astype(np.int64) * n_sw + leaf[dst]
            else:
                r = self.place.routes(src, dst, b.sport[chunk], sprayed_all[lo : lo + chunk.size])
                ok, key = r.ok, r.key
            keys.append(np.where(ok & (key >= 0), key, -2 - chunk))  # unroutable or too long: on its own
        # class = (route key, size, cap, pacer): factorise each column, then one 1-D unique of the code
        cap_all = np.minimum(b.rate_cap_gbps[idx], np.minimum(nic[b.src[idx]], nic[b.dst[idx]]))
        code = np.zeros(idx.size, dtype=np.int64)
        for column in (np.concatenate(keys), b.size_bytes[idx], cap_all, pacer_all):
            values, inverse_col = np.unique(column, return_inverse=True)
            code = code * values.size + inverse_col.ravel()
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        mult = np.bincount(inverse.ravel(), minlength=first.size).astype(np.float64)
        cap_of_class = cap_all[first]
        rep = idx[first]
        src, dst = b.src[rep], b.dst[rep]
        pacer = pacer_all[first]
        sprayed = sprayed_all[first]
        _, indptr, links, weight, hop = self._full_routes(src, dst, b.sport[rep], sprayed, pacer, True)
        off, length = self.pool.put_routes(indptr, links, weight, hop)
        n = rep.size
        self.pool.add(
            mult=mult,
            remaining=b.size_bytes[rep],
            cap=cap_of_class,
            start=np.full(n, self.now),
            end=np.full(n, np.inf),
            rate=np.zeros(n),
            src=src,
            dst=dst,
            sport=b.sport[rep],
            owner=np.full(n, bi),
            step=np.zeros(n),
            pos=np.full(n, -1),
            off=off,
            len=length,
            agg=np.ones(n, bool),
            job=np.full(n, b.job),
            payload=_col(b.payload_frac, rep, 1.0),
            posted=b.start_s[rep],
            alone=self._alone(b.size_bytes[rep], cap_of_class, src, dst, pacer),
            pacer=pacer,
            sprayed=sprayed,
        )
        self.stats["classes"] += n
        self.stats["members"] += idx.size
        self.started_members += idx.size
        self.dirty = True

    def _start_collective_flows(self) -> None:
        for ci, state in enumerate(self.colls):
            if state.finished or self.now < state.spec.start_s:
                continue
            if state.started_at is None:
                state.started_at = self.now
                state.advance(self.now)
            spec = state.spec
            for st, positions in state.ready():
                ranks = spec.ranks
                i, j = st.src[positions], st.dst[positions]
                src, dst = ranks[i], ranks[j]
                n_ranks = int(ranks.size)
                qp = pair_qp(spec.qp_offset, i.astype(np.int64), j.astype(np.int64), n_ranks)
                sport = flow_sports(qp)
                wire = _wire(st.size[positions], spec.mtu)
                pacer = spec.pacer[i] if spec.pacer is not None else np.full(positions.size, -1, np.int32)
                sprayed = self._sprayed(np.full(positions.size, spec.entropy, dtype=np.int8))
                _r, indptr, links, weight, hop = self._full_routes(src, dst, sport, sprayed, pacer, False)
                off, length = self.pool.put_routes(indptr, links, weight, hop)
                m = positions.size
                self.pool.add(
                    mult=np.ones(m),
                    remaining=wire,
                    cap=np.full(m, np.inf),
                    start=np.full(m, self.now),
                    end=np.full(m, np.inf),
                    rate=np.zeros(m),
                    src=src,
                    dst=dst,
                    sport=sport,
                    owner=np.full(m, -1 - ci),
                    step=np.full(m, st.index),
                    pos=positions,
                    off=off,
                    len=length,
                    agg=np.zeros(m, bool),
                    job=np.full(m, spec.job),
                    payload=st.size[positions] / np.maximum(wire, 1e-300),
                    posted=np.full(m, self.now),
                    alone=self._alone(wire, np.full(m, np.inf), src, dst, pacer),
                    pacer=pacer,
                    sprayed=sprayed,
                )
                st.started[positions] = True
                st.fct[positions] = self.now
                self.started_members += m
                if st.first_start < 0:
                    st.first_start = self.now
                if st.started.all() and st.first_start == self.now:
                    st.all_started_at = self.now
                self.dirty = True

    # --- the loop -----------------------------------------------------------------------------------

    def run(self) -> SimResult:
        self._handle_events()
        events = 0
        while True:
            if self.dirty:
                self._solve()
            dt = self._next_dt()
            if not math.isfinite(dt):
                break
            self._advance(dt)
            self._handle_events()
            events += 1
            if events >= self.cfg.max_events:
                raise RuntimeError(f"simulation exceeded {self.cfg.max_events} events")
            if self.progress is not None and events % 200 == 0:
                self.progress(
                    min(1.0, self.done_members / max(self.total_members, 1.0)), f"t={self.now:.6g} s"
                )
        self.stats["events"] = events
        return self._result()

    def _solve_once(self) -> None:
        """Rates: open-loop (timed) flows first, as drop-tail links treat them (`open_loop`), then everything
        else max-min fairly in what they leave."""
        p = self.pool
        live = p.len > 0
        timed = live & np.isfinite(p.end)
        p.rate[:] = 0.0
        cap = self.cap
        self.load = np.zeros(cap.size)
        idx = np.flatnonzero(timed)
        if idx.size:
            indptr, sel = self._csr(idx)
            delivered, carried = open_loop(cap, indptr, p.store_links[sel], p.store_weight[sel],
                                           p.store_hop[sel], p.mult[idx], p.cap[idx])  # fmt: skip
            p.rate[idx] = delivered
            self.load += carried
            cap = np.where(np.isfinite(cap), np.maximum(cap - carried, 0.0), cap)
        idx = np.flatnonzero(live & ~timed)
        if idx.size:
            indptr, sel = self._csr(idx)
            alloc = max_min(cap, indptr, p.store_links[sel], p.store_weight[sel], p.mult[idx], p.cap[idx])
            p.rate[idx] = alloc.rate
            self.load += alloc.load
            self.stats["rounds"] += alloc.rounds
        self.stats["solves"] += 1

    def _csr(self, idx: I64) -> tuple[I64, I64]:
        p = self.pool
        indptr = np.zeros(idx.size + 1, np.int64)
        np.cumsum(p.len[idx], out=indptr[1:])
        return indptr, ranges(p.off[idx], p.len[idx])

    def _solve(self) -> None:
        self._solve_once()
        if self.place.local_ar and self.pool.n:
            for round_ in range(self.cfg.local_ar_rounds):
                frac, moved, change = self.place.local_step(self.load, self.cap)
                if change < LOCAL_AR_TOL:
                    break
                if round_ == 0:
                    self.stats["moves"] += moved
                self.place.frac = frac
                self._reroute_all()
                self._solve_once()
        self.dirty = False

    def _next_dt(self) -> float:
        p = self.pool
        candidates = [math.inf]
        moving = (p.rate > 0) & np.isfinite(p.remaining)
        if moving.any():
            candidates.append(float((p.remaining[moving] / (p.rate[moving] * BYTES_PER_GBIT)).min()))
        if p.n and np.isfinite(p.end).any():
            candidates.append(float(p.end.min()) - self.now)
        if self.arrivals:
            candidates.append(self.arrivals[0][0] - self.now)
        if self.faults:
            candidates.append(self.faults[0][0] - self.now)
        if p.n and math.isfinite(self.next_tick):
            candidates.append(self.next_tick - self.now)
        for state in self.colls:
            if state.started_at is None and not state.finished:
                candidates.append(state.spec.start_s - self.now)
        return max(0.0, min(candidates))

    def _advance(self, dt: float) -> None:
        p = self.pool
        if dt > 0 and p.n:
            finite = np.isfinite(p.remaining)
            p.remaining[finite] -= p.rate[finite] * BYTES_PER_GBIT * dt
            p.sent += p.rate * BYTES_PER_GBIT * dt
            step_bytes = self.load * BYTES_PER_GBIT * dt
            self.link_bytes += step_bytes
            self._bin(self.now, self.now + dt, self.load[self.fabric_ids] * BYTES_PER_GBIT)
        self.now += dt

    def _bin(self, t0: float, t1: float, per_s: F64) -> None:
        self.bin_s = add_to_bins(self.heat, self.bin_s, t0, t1, per_s)

    def _handle_events(self) -> None:
        p = self.pool
        now = self.now
        if p.n:
            finite = np.isfinite(p.remaining)
            eta = np.full(p.n, np.inf)
            moving = finite & (p.rate > 0)
            eta[moving] = p.remaining[moving] / (p.rate[moving] * BYTES_PER_GBIT)
            tol = BATCH_TOL * max(now, 1e-12)
            done = finite & ((p.remaining <= 1e-9) | (eta <= tol))
            ended = ~finite & (p.end <= now + tol)
            if done.any() or ended.any():
                self._finish(done, ended)
        while self.faults and self.faults[0][0] <= now + 1e-12:
            self._fault(*self.faults.pop(0)[1:])
        if now >= self.next_tick - 1e-12:
            self._adaptive_tick()
            self.next_tick += self.cfg.params.interval_ms / 1000.0
        while self.arrivals and self.arrivals[0][0] <= now + 1e-12:
            _, _, bi, idx = heapq.heappop(self.arrivals)
            self._start_batch(bi, idx)
        before = self.pool.n
        self._start_collective_flows()
        if self.pool.n != before and self.cfg.lockstep:
            self._maybe_skip()

    def _queue_delay(self, rows: I64) -> F64:
        """What saturated switch queues on each open-loop flow's route add to its last byte's delay (open-loop
        senders overfill a saturated port: its queue is full, `buffer_bytes` deep), weighted by the share of
        the flow crossing it.  Closed-loop (sized) flows do not fill queues in a fluid model."""
        buffer = self.work.buffer_bytes
        if not buffer or rows.size == 0:
            return np.zeros(rows.size)
        p = self.pool
        lens = p.len[rows]
        at = ranges(p.off[rows], lens)
        links = p.store_links[at]
        share = p.store_weight[at]
        real = links < self.net.n_links
        sat = np.zeros(links.size, dtype=bool)
        sat[real] = self.net.switch_egress[links[real]] & (
            self.load[links[real]] >= self.cap[links[real]] * (1 - 1e-6)
        )
        delay = np.where(sat, buffer / (self.cap[np.where(real, links, 0)] * BYTES_PER_GBIT), 0.0) * share
        owner = np.repeat(np.arange(rows.size), lens)
        return np.bincount(owner, weights=delay, minlength=rows.size).astype(np.float64)

    def _finish(self, done: np.ndarray, ended: np.ndarray) -> None:
        p = self.pool
        now = self.now
        fin = np.flatnonzero(done)
        timed = np.flatnonzero(ended)
        if fin.size:
            payload = p.size[fin] * p.payload[fin]
            self.done.append(Flows(p.job[fin], p.step[fin].astype(np.int64), payload, payload, p.posted[fin],
                                   now - p.posted[fin], p.alone[fin], p.mult[fin]))  # fmt: skip
        if timed.size:
            duration = now - p.start[timed]
            offered = p.cap[timed] * BYTES_PER_GBIT * duration * p.payload[timed]
            delivered = p.sent[timed] * p.payload[timed]
            self.done.append(Flows(p.job[timed], np.zeros(timed.size, dtype=np.int64), offered, delivered,
                                   p.posted[timed], duration + self._queue_delay(timed), p.alone[timed],
                                   p.mult[timed]))  # fmt: skip
        gone = np.concatenate([fin, timed])
        self.done_members += float(p.mult[gone].sum())
        owner = p.owner[gone]
        for bi in np.unique(owner[owner >= 0]):
            sel = gone[owner == bi]
            self.batch_left[bi] -= int(p.mult[sel].sum())
            if self.batch_left[bi] <= 0:
                self.groups[bi].end_s = now
            nxt = self.successor[bi]
            if nxt is not None:
                b = self.batches[bi]
                for f in nxt[p.pos[sel]]:
                    if f >= 0:
                        self._push(max(now, float(b.start_s[f])), int(bi), np.array([f], dtype=np.int64))
        for ci in np.unique(-1 - owner[owner < 0]):
            state = self.colls[ci]
            sel = gone[owner == -1 - ci]
            for st in np.unique(p.step[sel]):
                state.completed(int(st), p.pos[sel[p.step[sel] == st]].astype(np.int32), now)
            state.advance(now)
            if state.finished:
                self.groups[len(self.batches) + ci].end_s = state.finished_at
        keep = np.ones(p.n, bool)
        keep[gone] = False
        p.keep(keep)
        self.dirty = True

    # --- faults, adaptive re-placement, lockstep skipping ------------------------------------------------

    def _fault(self, action: str, target: str) -> None:
        down = action.endswith("_down")
        if action.startswith("link"):
            node, _, port = target.rpartition(":")
            self.place.fault(fabric_link_index(self.net.fabric, node, int(port)), None, down)
        else:
            self.place.fault(None, target, down)
        self.stats["reroutes"] += 1
        self._reroute_all()

    def _reroute_all(self) -> None:
        self.disturbances += 1
        p = self.pool
        if not p.n:
            return
        for agg in (False, True):
            rows = np.flatnonzero(p.agg == agg)
            if rows.size:
                _, indptr, links, weight, hop = self._full_routes(
                    p.src[rows], p.dst[rows], p.sport[rows], p.sprayed[rows], p.pacer[rows], agg
                )
                p.off[rows], p.len[rows] = self.pool.put_routes(indptr, links, weight, hop)
        self.dirty = True

    def _adaptive_tick(self) -> None:
        delta = self.link_bytes - self.tick_bytes
        self.tick_bytes = self.link_bytes.copy()
        if not self.pool.n:
            return
        if self.place.adaptive_sample(delta, self.cap, self.cfg.params):
            assert self.place.adaptive is not None
            self.stats["moves"] = float(self.place.adaptive.moves)
            self._reroute_all()

    def _result(self) -> SimResult:
        return SimResult(
            policy=self.policy.name,
            end_s=self.now,
            groups=self.groups,
            flows=Flows.concat(self.done),
            fabric_links=self.fabric_ids,
            link_bytes=self.link_bytes[self.fabric_ids],
            heat=self.heat,
            bin_s=self.bin_s,
            stats=self.stats,
            unfinished=int(self.pool.mult.sum()) + sum(len(a[3]) for a in self.arrivals),
            wide_sets=self.place.tables.wide,
            adaptive_reasons=tuple(self.place.adaptive.reasons) if self.place.adaptive is not None else (),
        )


def _col(values: np.ndarray | None, idx: I64, default: float) -> np.ndarray:
    if values is None:
        return np.full(idx.size, default, dtype=np.int32 if isinstance(default, int) else np.float64)
    return values[idx]


def _wire(size: F64, mtu: int | None) -> F64:
    """Bytes on the wire of RDMA WRITEs of `size` payload at `mtu` (`traffic.wire`); no MTU: as they are."""
    return size.astype(np.float64) if mtu is None else roce_wire_bytes(size, mtu)


__all__ = ["BATCH_TOL", "BYTES_PER_GBIT", "Progress", "SimConfig", "SimResult", "Simulator"]
