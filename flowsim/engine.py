"""The event loop: flows arrive, share links max-min fairly, complete; collectives step; faults reroute;
the adaptive policy re-places flows every interval.

Rates are piecewise constant between events (arrival, completion, timed end, fault, adaptive tick), so the
simulation jumps from event to event and recomputes rates only there.  Completions closer than a relative
1e-6 of each other are processed together.  Nothing here reads files or prints: progress goes to a callback.

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

from controller.sm.policies import default_policies
from flowsim.adaptive import next_allowed
from flowsim.maxmin import max_min, ranges
from flowsim.network import F64, I32, I64, Network, Routing, fabric_link_index, route_fabric
from flowsim.pool import BYTES_PER_GBIT, GroupResult, Pool, SimConfig, SimResult
from flowsim.routes import Routes, five_tuple_hash, spray, walk
from flowsim.steps import CollectiveState, SyncMark, equivalent_run, lockstep_candidate
from flowsim.workload import FlowBatch, Workload

Progress = Callable[[float, str], None]
#: Flows that would complete within this fraction of the elapsed time of the next completion complete with
#: it (an FCT error of at most 0.1 % of the time so far); it cuts events severalfold on ECMP all-to-alls.
BATCH_TOL = 1e-3


class Simulator:
    def __init__(
        self, network: Network, workload: Workload, config: SimConfig, progress: Progress | None = None
    ):
        self.net = network
        self.work = workload
        self.cfg = config
        self.policy = default_policies().create(config.policy, config.params)
        self.progress = progress
        n_sw = network.subnet.n_switches
        self.base_up = network.n_links
        self.base_down = network.n_links + n_sw
        self.cap = np.concatenate([network.cap_gbps, np.zeros(2 * n_sw)])
        self.bundle_src = np.zeros(network.n_hosts, bool)
        self.bundle_dst = np.zeros(network.n_hosts, bool)
        self.fabric_ids = np.flatnonzero(network.fabric_link).astype(np.int64)
        self.down_links: set[int] = set()
        self.down_switches: set[str] = set()
        self._routings: dict[tuple[frozenset[int], frozenset[str]], Routing] = {}
        self.routing = self._routing()
        self.allowed = self.routing.tables.alt.copy()
        self.pool = Pool()
        self.now = 0.0
        self.link_bytes = np.zeros(self.cap.size)
        self.heat = np.zeros((config.heat_bins, self.fabric_ids.size))
        self.bin_s = 1e-6
        self.stats: dict[str, float] = dict.fromkeys(
            ("events", "solves", "rounds", "moves", "reroutes", "classes", "members", "skipped_steps"), 0.0
        )
        self.done_fct: list[F64] = []
        self.done_size: list[F64] = []
        self.done_mult: list[F64] = []
        self.timed: list[tuple[F64, F64, F64]] = []
        self.batches = list(workload.batches)
        self.groups = [GroupResult(b.name, math.inf, None, b.collective) for b in self.batches]
        self.colls = [CollectiveState.of(c) for c in workload.collectives]
        for c in workload.collectives:
            self.groups.append(
                GroupResult(c.name, c.start_s, None, (c.kind, int(c.ranks.size), c.size_bytes), c.bus_factor)
            )
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
                self._push(float(t), bi, free[inverse == k])
        self.faults = sorted(workload.faults)
        self.total_members = float(sum(b.n for b in self.batches)) + sum(
            float(c.step(0)[0].size) * c.n_steps for c in workload.collectives
        )
        self.done_members = 0.0
        self.dirty = True
        self.next_tick = (
            config.params.interval_ms / 1000.0 if self.policy.adaptive and not config.ideal else math.inf
        )
        self.tick_bytes = self.link_bytes.copy()
        self.started_members = 0.0
        self.disturbances = 0
        self.load = np.zeros(self.cap.size)

    # --- routing ------------------------------------------------------------------------------------

    def _routing(self) -> Routing:
        key = (frozenset(self.down_links), frozenset(self.down_switches))
        if key not in self._routings:
            self._routings[key] = route_fabric(self.net, self.cfg.engine, *key)
        return self._routings[key]

    def _routes(self, src: I32, dst: I32, sport: I32) -> Routes:
        """Fabric part of the routes (ending with the hop into the destination host) under the policy."""
        if self.cfg.ideal:
            n = src.size
            ok = self.routing.reachable(src, dst)
            indptr = np.arange(n + 1, dtype=np.int64)
            leaf = self.net.leaf_of.astype(np.int64)
            key = leaf[src] * self.net.subnet.n_switches + leaf[dst]
            return Routes(indptr, self.net.host_down[dst], np.ones(n), ok, key)
        if self.policy.name == "spray":
            return spray(self.routing, src, dst)
        if self.policy.name == "adaptive":
            return spray(self.routing, src, dst, self.allowed)
        if self.policy.name == "static":
            return walk(self.routing, src, dst, None)
        return walk(self.routing, src, dst, five_tuple_hash(self.routing, src, dst, sport, self.cfg.seed))

    def _full_routes(self, src: I32, dst: I32, sport: I32, aggregated: bool) -> tuple[Routes, I64, I32, F64]:
        """Routes with the source's uplink (or its leaf's bundle) in front; returns CSR and ok."""
        r = self._routes(src, dst, sport)
        counts = np.diff(r.indptr)
        n = src.size
        new_counts = np.where(r.ok, counts + 1, 0)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new_counts, out=indptr[1:])
        links = np.empty(int(indptr[-1]), dtype=np.int32)
        weight = np.empty(int(indptr[-1]))
        good = np.flatnonzero(r.ok)
        leaf = self.net.leaf_of
        first = np.where(aggregated, self.base_up + leaf[src[good]], self.net.host_up[src[good]])
        links[indptr[good]] = first
        weight[indptr[good]] = 1.0
        body = ranges(indptr[good] + 1, counts[good])
        links[body] = r.links[ranges(r.indptr[good], counts[good])]
        weight[body] = r.weight[ranges(r.indptr[good], counts[good])]
        if aggregated:  # the last hop (into the host) becomes the destination leaf's bundle
            links[indptr[good + 1] - 1] = self.base_down + leaf[dst[good]]
        return r, indptr, links, weight

    # --- starting flows -----------------------------------------------------------------------------

    def _push(self, t: float, batch: int, idx: I64) -> None:
        heapq.heappush(self.arrivals, (t, self._seq, batch, idx))
        self._seq += 1

    def _start_batch(self, bi: int, idx: I64) -> None:
        b = self.batches[bi]
        self.groups[bi].start_s = min(self.groups[bi].start_s, self.now)
        mode = self.cfg.aggregate
        aggregate = (mode == "always" or (mode == "auto" and idx.size > self.cfg.aggregate_above)) and (
            b.after is None
        )
        nic = self.net.subnet.ep_bw_gbps
        if aggregate:
            self._start_classes(bi, b, idx, nic)
            return
        src, dst = b.src[idx], b.dst[idx]
        _r, indptr, links, weight = self._full_routes(src, dst, b.sport[idx], False)
        off, length = self.pool.put_routes(indptr, links, weight)
        timed = ~np.isfinite(b.size_bytes[idx])
        self.pool.add(
            mult=np.ones(idx.size),
            remaining=b.size_bytes[idx],
            cap=b.rate_cap_gbps[idx],
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
        )
        self.stats["members"] += idx.size
        self.started_members += idx.size
        self.dirty = True

    def _start_classes(self, bi: int, b: FlowBatch, idx: I64, nic: F64) -> None:
        """Aggregate members into (route, size, cap) classes; routes are built for one member per class."""
        net = self.net
        self.bundle_src[b.src[idx]] = True
        self.bundle_dst[b.dst[idx]] = True
        leaf = net.leaf_of
        n_sw = net.subnet.n_switches
        up = np.bincount(leaf, weights=nic * self.bundle_src, minlength=n_sw)
        down = np.bincount(leaf, weights=nic * self.bundle_dst, minlength=n_sw)
        self.cap[self.base_up : self.base_up + n_sw] = up
        self.cap[self.base_down : self.base_down + n_sw] = down
        by_pair = self.cfg.ideal or self.policy.per_packet  # spray-like routes depend on the leaf pair only
        keys: list[I64] = []
        for lo in range(0, idx.size, 1 << 20):
            chunk = idx[lo : lo + (1 << 20)]
            src, dst = b.src[chunk], b.dst[chunk]
            if by_pair:
                ok = self.routing.reachable(src, dst)
                key = leaf[src].astype(np.int64) * n_sw + leaf[dst]
            else:
                r = self._routes(src, dst, b.sport[chunk])
                ok, key = r.ok, r.key
            keys.append(np.where(ok & (key >= 0), key, -2 - chunk))  # unroutable or too long: on its own
        # class = (route key, size, cap): factorise each column, then one 1-D unique of the combined code
        cap_all = np.minimum(b.rate_cap_gbps[idx], np.minimum(nic[b.src[idx]], nic[b.dst[idx]]))
        code = np.zeros(idx.size, dtype=np.int64)
        for column in (np.concatenate(keys), b.size_bytes[idx], cap_all):
            values, inverse_col = np.unique(column, return_inverse=True)
            code = code * values.size + inverse_col.ravel()
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        mult = np.bincount(inverse.ravel(), minlength=first.size).astype(np.float64)
        cap_of_class = cap_all[first]
        rep = idx[first]
        src, dst = b.src[rep], b.dst[rep]
        _, indptr, links, weight = self._full_routes(src, dst, b.sport[rep], True)
        off, length = self.pool.put_routes(indptr, links, weight)
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
            for st, positions in state.ready():
                ranks = state.spec.ranks
                src, dst = ranks[st.src[positions]], ranks[st.dst[positions]]
                sport = positions.astype(np.int32) & 0x3FFF
                _r, indptr, links, weight = self._full_routes(src, dst, sport, False)
                off, length = self.pool.put_routes(indptr, links, weight)
                m = positions.size
                self.pool.add(
                    mult=np.ones(m),
                    remaining=st.size[positions],
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

    def _solve(self) -> None:
        p = self.pool
        live = p.len > 0
        idx = np.flatnonzero(live)
        indptr = np.zeros(idx.size + 1, np.int64)
        np.cumsum(p.len[idx], out=indptr[1:])
        sel = ranges(p.off[idx], p.len[idx])
        alloc = max_min(self.cap, indptr, p.store_links[sel], p.store_weight[sel], p.mult[idx], p.cap[idx])
        p.rate[:] = 0.0
        p.rate[idx] = alloc.rate
        self.load = alloc.load
        self.stats["solves"] += 1
        self.stats["rounds"] += alloc.rounds
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
        bins = self.heat.shape[0]
        while t1 > bins * self.bin_s:
            self.heat[: bins // 2] = self.heat[0::2] + self.heat[1::2]
            self.heat[bins // 2 :] = 0.0
            self.bin_s *= 2
        first, last = int(t0 / self.bin_s), min(bins - 1, int(t1 / self.bin_s))
        for b in range(first, last + 1):
            overlap = min(t1, (b + 1) * self.bin_s) - max(t0, b * self.bin_s)
            if overlap > 0:
                self.heat[b] += per_s * overlap

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

    def _finish(self, done: np.ndarray, ended: np.ndarray) -> None:
        p = self.pool
        now = self.now
        fin = np.flatnonzero(done)
        timed = np.flatnonzero(ended)
        if fin.size:
            self.done_fct.append(now - p.start[fin])
            self.done_mult.append(p.mult[fin])
            self.done_size.append(p.size[fin])
        if timed.size:
            self.timed.append((p.sent[timed], now - p.start[timed], p.mult[timed]))
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
            for s in np.unique(p.step[sel]):
                state.completed(int(s), p.pos[sel[p.step[sel] == s]], now)
            state.advance(now)
            if state.finished:
                self.groups[len(self.batches) + ci].end_s = state.finished_at
        keep = np.ones(p.n, bool)
        keep[gone] = False
        p.keep(keep)
        self.dirty = True

    # --- faults, adaptive re-placement, lockstep skipping ------------------------------------------------

    def _fault(self, action: str, target: str) -> None:
        if action.startswith("link"):
            node, _, port = target.rpartition(":")
            link = fabric_link_index(self.net.fabric, node, int(port))
            (self.down_links.add if action == "link_down" else self.down_links.discard)(link)
        else:
            (self.down_switches.add if action == "switch_down" else self.down_switches.discard)(target)
        self.routing = self._routing()
        self.allowed = self.routing.tables.alt.copy()
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
                _, indptr, links, weight = self._full_routes(p.src[rows], p.dst[rows], p.sport[rows], agg)
                p.off[rows], p.len[rows] = self.pool.put_routes(indptr, links, weight)
        self.dirty = True

    def _adaptive_tick(self) -> None:
        interval = self.cfg.params.interval_ms / 1000.0
        util = np.zeros(self.cap.size)
        real = self.cap > 0
        util[real] = (self.link_bytes[real] - self.tick_bytes[real]) / (
            self.cap[real] * BYTES_PER_GBIT * interval
        )
        self.tick_bytes = self.link_bytes.copy()
        if not self.pool.n:
            return
        params = self.cfg.params
        allowed = next_allowed(self.routing, self.allowed, util, params.threshold, params.hysteresis)
        changed = int(np.unpackbits(allowed ^ self.allowed).sum())
        if changed:
            self.allowed = allowed
            self.stats["moves"] += changed
            self._reroute_all()

    def _external_horizon(self) -> float:
        times = [math.inf]
        if self.arrivals:
            times.append(self.arrivals[0][0])
        if self.faults:
            times.append(self.faults[0][0])
        times.append(self.next_tick)
        times += [c.spec.start_s for c in self.colls if c.started_at is None and not c.finished]
        return min(times)

    def _maybe_skip(self) -> None:
        p = self.pool
        for ci, state in enumerate(self.colls):
            for st in list(state.window.values()):
                if st.all_started_at != self.now:
                    continue
                mine = (p.owner == -1 - ci) & (p.step == st.index)
                if not mine.all():
                    state.last_mark = None
                    continue
                mark = state.last_mark
                quiet = (
                    mark is not None
                    and mark.started == self.started_members - st.src.size
                    and mark.disturbances == self.disturbances
                )
                if quiet and lockstep_candidate(state, st):
                    assert mark is not None and state.last_done is not None
                    period = self.now - mark.at
                    k = equivalent_run(state, st.index) - 1
                    horizon = self._external_horizon()
                    if math.isfinite(horizon) and period > 0:
                        k = min(k, int((horizon - self.now) / period) - 1)
                    if k >= 1 and period > 0:
                        self._skip(state, st, k, period, mark)
                state.last_mark = SyncMark(
                    st.index, self.now, self.link_bytes.copy(), self.started_members, self.disturbances
                )

    def _skip(self, state: CollectiveState, st: object, k: int, period: float, mark: SyncMark) -> None:
        """Advance a collective in lockstep by k whole steps, each a repeat of the last finished one."""
        from flowsim.steps import StepState  # noqa: PLC0415

        assert isinstance(st, StepState) and state.last_done is not None
        prev = state.last_done
        m = prev.src.size
        self.done_fct.append(prev.fct.copy())
        self.done_size.append(prev.size.copy())
        self.done_mult.append(np.full(m, float(k)))
        delta = self.link_bytes - mark.link_bytes
        span = k * period
        self.link_bytes += k * delta
        self._bin(self.now, self.now + span, delta[self.fabric_ids] / period)
        self.now += span
        self.pool.start += span
        st.fct += span
        st.all_started_at = st.first_start = self.now
        del state.window[st.index]
        st.index += k
        state.window[st.index] = st
        self.pool.step += k
        state.done += k
        state.next_step += k
        state.skipped_steps += k
        self.stats["skipped_steps"] += k
        self.done_members += float(k * m)
        self.started_members += float(k * m)

    def _result(self) -> SimResult:
        def cat(parts: list[F64]) -> F64:
            return np.concatenate(parts) if parts else np.zeros(0)

        timed = self.timed
        return SimResult(
            policy=self.policy.name,
            end_s=self.now,
            groups=self.groups,
            fct_s=cat(self.done_fct),
            size_bytes=cat(self.done_size),
            mult=cat(self.done_mult),
            timed_bytes=cat([t[0] for t in timed]),
            timed_s=cat([t[1] for t in timed]),
            timed_mult=cat([t[2] for t in timed]),
            fabric_links=self.fabric_ids,
            link_bytes=self.link_bytes[self.fabric_ids],
            heat=self.heat,
            bin_s=self.bin_s,
            stats=self.stats,
            unfinished=int(self.pool.mult.sum()) + sum(len(a[3]) for a in self.arrivals),
        )


__all__ = ["BATCH_TOL", "BYTES_PER_GBIT", "Progress", "SimConfig", "SimResult", "Simulator"]
