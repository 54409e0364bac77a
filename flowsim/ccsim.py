"""A workload's RoCE flows under DCQCN on the simulator's fabric: `cc: dcqcn` of scenario files.

Max-min (`flowsim.engine`) hands every flow its fair share at once: an ideal congestion control no NIC
has.  Here each RoCE flow runs DCQCN's reaction point (`flowsim.dcqcn.ReactionPoints`, the algorithm of
`traffic.dcqcn` the emulator's senders run), on the same network, routes, link speeds and switch buffers
the max-min run uses — the engine itself places the flows (`Simulator.start_all`: the policy's routes over
the controller's tables and slot tables, one-phase batches aggregated into classes, pacers) — and on
fluid queues at every switch egress, time-stepped:

* **Senders.**  A host's NIC (and a job's pacer) serves its QPs round robin: each QP gets the smaller of
  its DCQCN rate and the NIC's water level (`flowsim.ccmodel.water_levels`), time-weighted within a step
  so that a message ending or starting mid-step leaves the rest of the step to the others.  A NIC's own
  link never queues.
* **Switch egresses** hold fluid queues that fill at what arrives beyond capacity, drop past the buffer
  (`buffer_packets`, from each flow in proportion to what it brought), and mark with DCQCN's RED-like
  profile; a flow's receiver answers a marked packet with a CNP at most once per `cnp_interval_s`, and
  the CNP cuts the sender's rate at the next step (a fabric's round trip is microseconds).  A link passes
  on at most its capacity: what an earlier hop queued or dropped (its last step's share) does not load
  the hops after it, so a downstream queue sees the upstream link's departures.
* **Spraying** (`spray`, `entropy: spray`): a QP stays one rate controller while its packets spread over
  the paths, so a sprayed flow is one fluid flow putting the policy's fraction of its rate on each link;
  a packet's chance of a mark (or a drop) is 1 - exp(sum of fraction x log(1 - p)) over its links — exact
  on a single path, and the expected per-packet probability to first order when spread.
* **Classes.**  A class of `mult` identical flows (large one-phase batches) is one controller: each
  member sees the class's marks, as in the paper's fluid model of N synchronised flows; a leaf's bundle
  of host links is a queue of `ports` ports, marking and dropping on the queue per port.
* **UDP** (timed) flows stay open-loop at their rate: they neither mark-react nor slow down, as non-RoCE
  traffic in a real fabric.
* **Messages of one QP** (traces, KV transfers) are sent in order; the next starts when the previous is
  sent, within the same step, and inherits its QP's rate state.  A flow is done when its last byte is
  delivered: sent, plus the queues on its path.  Bytes dropped at a buffer are not resent; figures count
  them as the emulator does (`traffic.figures`: an effective FCT of FCT x offered / delivered).

Time step (`CcSetup.step_s`): a quarter of the shortest DCQCN timer, and short enough that a queue filling
at a NIC's line rate takes `RAMP_STEPS` steps across the marking ramp (Kmin..Kmax) — both scale with
`scale` the same way, so a scaled run takes as many steps as a full-speed one — and following short
messages down to a floor.  Stretches in which every queue is empty and every controller is at line rate are
jumped over exactly.  Marks are drawn from a generator seeded by the run's seed.  What the run needs, what
it refuses and what it reports are in `flowsim.ccmodel`; its results are assembled by `flowsim.ccresult`.
Pure numpy, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flowsim.ccmodel import (
    BITS,
    DEFAULT_FRAME_BYTES,
    MAX_STEPS,
    RAMP_STEPS,
    CcSetup,
    CcStats,
    check_supported,
    water_levels,
    waterfill,
)
from flowsim.dcqcn import ReactionPoints, mark_probability
from flowsim.engine import Simulator, add_to_bins
from flowsim.maxmin import ranges
from flowsim.network import F64, I64, Network, SimInputError
from flowsim.pool import BYTES_PER_GBIT, SimConfig
from flowsim.workload import Workload

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Incidence:
    """Rows' queue links, entry by entry in hop order: link, fraction of the row's rate, row (local), and
    the first entry of the entry's (row, hop) segment and of its row."""

    link: I64
    w: F64
    row: I64
    seg: I64
    first: I64


class CcSimulator:
    """One policy's run of a workload under DCQCN (or, `enabled=False`, with open-loop RoCE senders)."""

    def __init__(
        self,
        network: Network,
        workload: Workload,
        config: SimConfig,
        setup: CcSetup,
        progress: Progress | None = None,
        sample_every_s: float | None = None,
    ) -> None:
        check_supported(workload, [config.policy], config.params)
        self.net, self.work, self.cfg, self.setup = network, workload, config, setup
        self.progress = progress
        self.sample_every_s = sample_every_s
        sim = Simulator(network, workload, config)
        sim.start_all()
        self.sim = sim
        pool = sim.pool
        n = pool.n
        self.n = n
        self.mult = pool.mult.copy()
        self.size = pool.size.copy()
        self.timed = ~np.isfinite(self.size)
        self.roce = ~self.timed
        self.posted = pool.posted.copy()
        self.end_s = np.where(self.timed, self.posted + pool.end, np.inf)  # pool.end: duration (placed at 0)
        self.job, self.src, self.owner, self.pos = pool.job, pool.src, pool.owner, pool.pos
        self.payload, self.alone = pool.payload, pool.alone
        # links: sender side (host uplinks, leaf up-bundles, pacers) or a switch egress queue
        self.cap_bytes = sim.cap * BYTES_PER_GBIT
        self.cap_bps = sim.cap * 1e9
        n_ids = sim.cap.size
        first_host_up = int(network.host_up.min()) if network.host_up.size else network.n_links
        ids = np.arange(n_ids)
        pacer_link = ids >= sim.place.base_pacer
        sender = ((ids >= first_host_up) & (ids < network.n_links)) | (
            (ids >= sim.base_up) & (ids < sim.base_down)
        ) | pacer_link  # fmt: skip
        self.n_ids = n_ids
        n_sw = network.subnet.n_switches
        self.ports = np.ones(n_ids)
        down = np.bincount(network.leaf_of, weights=sim.bundle_dst.astype(float), minlength=n_sw)
        self.ports[sim.base_down : sim.base_down + n_sw] = np.maximum(down, 1.0)
        buffer = workload.buffer_bytes
        self.buffer = self.ports * buffer if buffer else np.full(n_ids, np.inf)
        # every row's route: its pacer, its uplink, and its queue links (CSR, in hop order)
        at = ranges(pool.off, pool.len)
        ent_row = np.repeat(np.arange(n), pool.len)
        ent_link = pool.store_links[at].astype(np.int64)
        ent_w = pool.store_weight[at]
        self.row_pacer = np.full(n, -1, dtype=np.int64)
        self.row_up = np.full(n, -1, dtype=np.int64)
        is_pacer = pacer_link[ent_link]
        self.row_pacer[ent_row[is_pacer]] = ent_link[is_pacer]
        is_up = sender[ent_link] & ~is_pacer
        self.row_up[ent_row[is_up]] = ent_link[is_up]
        queued = ~sender[ent_link]
        self.q_link, self.q_w = ent_link[queued], ent_w[queued]
        self.q_hop = pool.store_hop[at][queued].astype(np.int64)
        self.q_len = np.bincount(ent_row[queued], minlength=n).astype(np.int64)
        self.q_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.q_len, out=self.q_ptr[1:])
        self.routed = pool.len > 0
        # what each row may send at: its NIC's line rate, its pacer's; UDP its own rate
        nic = setup.line_bps[self.src]
        pacer_bps = np.where(self.row_pacer >= 0, sim.cap[np.maximum(self.row_pacer, 0)] * 1e9, np.inf)
        self.line = np.where(self.roce, np.minimum(nic, pacer_bps), pool.cap * 1e9)
        jobs, of_job = np.unique(self.job, return_inverse=True)
        frames = [setup.frame_bytes.get(int(j), DEFAULT_FRAME_BYTES) for j in jobs]
        self.frame = np.array(frames, dtype=np.float64)[of_job.ravel()]
        self.dt = setup.step_s(np.where(self.roce, self.size * BITS / self.line, np.inf))
        if not (self.dt > 0 and math.isfinite(self.dt)):
            raise SimInputError(f"dcqcn: time step must be positive, not {self.dt!r}", "cc")
        # start times; a message waiting for another of its QP starts when that one is sent
        self.start = self.posted.copy()
        self.succ = np.full(n, -1, dtype=np.int64)
        for bi, b in enumerate(workload.batches):
            if b.after is None:
                continue
            rows = np.flatnonzero((self.owner == bi) & (self.pos >= 0))
            row_of = np.full(b.n, -1, dtype=np.int64)
            row_of[self.pos[rows]] = rows
            before = b.after[self.pos[rows]]
            waits = before >= 0
            self.succ[row_of[before[waits]]] = rows[waits]
            self.start[rows[waits]] = np.inf
        self.rp = ReactionPoints(setup.params, np.where(self.roce, self.line, np.inf), self.start)
        self.rng = np.random.default_rng(config.seed)
        # state
        self.remaining = self.size.copy()
        self.sent = np.zeros(n)
        self.delivered = np.zeros(n)
        self.dropped = np.zeros(n)
        self.cnps = np.zeros(n)
        self.cuts = np.zeros(n)
        self.marked = np.zeros(n)
        self.packets = np.zeros(n)
        self.began = np.full(n, np.nan)
        self.fresh = np.zeros(n, dtype=bool)
        self.sent_at = np.full(n, np.nan)
        self.done_at = np.full(n, np.nan)
        self.queue = np.zeros(n_ids)
        self.queue_before = self.queue
        self.pass_log = np.zeros(n_ids)  # per link: log of the share of its arrivals it passed on last step
        self.peak = np.zeros(n_ids)
        self.departed = np.zeros(n_ids)
        self.now = 0.0
        order = np.flatnonzero(np.isfinite(self.start) & self.routed)
        self.waiting = order[np.argsort(self.start[order], kind="stable")]
        self.next_wait = 0
        self.later: list[tuple[float, int]] = []  # successors: (start, row)
        self.active = np.zeros(0, dtype=np.int64)
        self.fabric_ids = sim.fabric_ids
        self.heat = np.zeros((config.heat_bins, self.fabric_ids.size))
        self.bin_s = 1e-6
        self.finished: list[I64] = []
        self.samples: list[tuple[float, F64]] = []
        self.next_sample = 0.0
        self.steps = 0
        self.jumped = 0
        self.changed = False

    # --- the active set -----------------------------------------------------------------------------

    def _next_start(self) -> float:
        nxt = math.inf
        if self.next_wait < self.waiting.size:
            nxt = float(self.start[self.waiting[self.next_wait]])
        if self.later:
            nxt = min(nxt, self.later[0][0])
        return nxt

    def _activate(self) -> bool:
        """Rows starting before the end of the next step join the active set; True if any did.  A row
        sends from its own start in its first step (`fresh`): a message starting mid-step, or one that
        became ready during the last step (its QP's previous message was sent), loses no time to the
        step's boundaries."""
        limit = self.now + self.dt * (1 - 1e-9)
        new: list[int] = []
        while self.next_wait < self.waiting.size and self.start[self.waiting[self.next_wait]] < limit:
            new.append(int(self.waiting[self.next_wait]))
            self.next_wait += 1
        while self.later and self.later[0][0] < limit:
            new.append(heapq.heappop(self.later)[1])
        if not new:
            return False
        rows = np.array(new, dtype=np.int64)
        self.began[rows] = self.start[rows]
        self.fresh[rows] = True
        self.rp.restart_timers(rows, self.start[rows])
        self.active = np.sort(np.concatenate([self.active, rows]))
        self._index()
        self.changed = True
        return True

    def _index(self) -> None:
        """The active rows' queue links (rebuilt only when the active set changes)."""
        a = self.active
        self.inc = self._incidence(a)
        self.a_roce = np.flatnonzero(self.roce[a])
        self.a_timed = np.flatnonzero(self.timed[a])

    def _incidence(self, rows: I64) -> Incidence:
        lens = self.q_len[rows]
        sel = ranges(self.q_ptr[rows], lens)
        row = np.repeat(np.arange(rows.size), lens)
        # where each entry's (row, hop) segment and row begin: what was lost at earlier hops thins it
        hop = self.q_hop[sel]
        first = np.ones(sel.size, dtype=bool)
        first[1:] = row[1:] != row[:-1]
        seg = first.copy()
        seg[1:] |= hop[1:] != hop[:-1]
        at = np.arange(sel.size)
        return Incidence(
            self.q_link[sel],
            self.q_w[sel],
            row,
            np.maximum.accumulate(np.where(seg, at, 0)) if sel.size else at,
            np.maximum.accumulate(np.where(first, at, 0)) if sel.size else at,
        )

    # --- the loop -----------------------------------------------------------------------------------

    def advance(self, until_s: float = math.inf) -> None:
        """To the last delivery (or `until_s`: what is unfinished then stays unfinished); the figures are
        `flowsim.ccresult.run_cc`'s (which calls this)."""
        total = float(self.mult[self.routed].sum())
        while self.now < until_s:
            self._activate()
            if self.active.size == 0:
                nxt = self._next_start()
                if not math.isfinite(nxt):
                    break
                self.now = min(nxt, until_s)
                continue
            self.changed = False
            rates = self._step()
            if not self.changed and self._quiet(rates):
                self._jump(rates, until_s)
            if self.steps + self.jumped > self.setup.max_steps:
                raise SimInputError(
                    f"dcqcn: more than {self.setup.max_steps:,} steps of {self.dt:.3g} s (at "
                    f"t={self.now:.4g} s simulated): too long a run for the fluid model", "cc")  # fmt: skip
            if self.progress is not None and self.steps % 2000 == 0:
                done = sum(float(self.mult[f].sum()) for f in self.finished)
                self.progress(min(1.0, done / max(total, 1.0)), f"t={self.now:.6g} s")

    def _rates(self, span: F64) -> F64:
        """Every active row's sending rate in this step (bits/s per member, while it sends: `span` seconds
        of the step): DCQCN's (or open-loop) demand, at most what finishes its message, then what its pacer
        and NIC serve round robin, time-weighted, so a message ending or starting mid-step leaves the rest
        of the step to the others.  A message whose QP has the next one ready is not capped: the QP is
        busy the whole step."""
        a = self.active
        demand = self.line[a].copy()
        if self.setup.enabled and self.a_roce.size:
            r = a[self.a_roce]
            demand[self.a_roce] = np.minimum(self.rp.rc[r], self.line[r])
        # the levels count what each row can use of the step: no more than finishes its message
        left = self.remaining[a]
        nxt = self.succ[a]
        busy = (nxt >= 0) & (self.posted[np.maximum(nxt, 0)] < self.now + self.dt)
        capped = np.isfinite(left) & ~busy & (span > 0)
        usable = demand.copy()
        usable[capped] = np.minimum(demand[capped], left[capped] * BITS / span[capped])
        weight = self.mult[a] * span / self.dt
        rate = demand
        for group in (self.row_pacer[a], self.row_up[a]):
            level = water_levels(usable, weight, group, self.cap_bps, self.n_ids)
            at = np.where(group >= 0, level[np.maximum(group, 0)], np.inf)
            usable = np.minimum(usable, at)
            rate = np.minimum(rate, at)
        return rate

    def _step(self) -> F64:
        a, dt, now, rp = self.active, self.dt, self.now, self.rp
        self.steps += 1
        if self.setup.enabled and self.a_roce.size:
            r = a[self.a_roce]
            cut = r[rp.pending[r]]
            if cut.size:
                rp.cut(cut, now)
                self.cuts[cut] += 1
                rp.pending[cut] = False
            rp.timers(r, now)
        # each row sends from its start (a fresh row) to the step's end (or its own)
        begin = np.where(self.fresh[a], self.start[a], now)
        self.fresh[a] = False
        rate = self._rates(np.maximum(np.minimum(now + dt, self.end_s[a]) - begin, 0.0))
        if self.sample_every_s is not None and now >= self.next_sample:
            full = np.zeros(self.n)
            full[a] = rate
            self.samples.append((now, full))
            self.next_sample = now + self.sample_every_s
        rows, out, send_end, done = self._send(a, rate, begin)
        chained = rows.size > a.size
        inc = self._incidence(rows) if chained else self.inc
        roce = np.flatnonzero(self.roce[rows]) if chained else self.a_roce
        if self.setup.enabled and roce.size:
            rp.count_bytes(rows[roce], out[roce])
        lost = self._queues(inc, rows, out)
        self.dropped[rows] += out * lost
        self.delivered[rows] += out * (1 - lost)
        pk = out / self.frame[rows]
        self.packets[rows] += pk
        if self.setup.enabled and roce.size and self.queue.max() > self.setup.params.kmin_bytes:
            self._mark(inc, rows, roce, pk, done)
        self.now = now + dt
        if done.any() or chained:
            self._finish(rows, inc, done, send_end)
        return rate

    def _send(self, a: I64, rate: F64, begin: F64) -> tuple[I64, F64, F64, np.ndarray]:
        """Bytes each row sends from `begin` to the step's end (or its own end, or its last byte).  A
        message sent before the step ends hands its QP to the QP's next message at once, which goes on at
        the same rate in the same step.  Returns every row that sent (the active ones first), its bytes,
        when it stopped sending and whether it is done."""
        end_step = self.now + self.dt
        parts: list[tuple[I64, F64, F64, np.ndarray]] = []
        rows, r, b = a, rate, begin
        while True:
            left = self.remaining[rows]
            finite = np.isfinite(left)
            want = r * np.maximum(np.minimum(end_step, self.end_s[rows]) - b, 0.0) / BITS
            out = np.minimum(want, left)
            sized = np.where(finite, left, 0.0)
            finishing = finite & (want >= sized * (1 - 1e-9))
            stop = np.where(
                finishing, b + sized * BITS / np.maximum(r, 1e-300), np.minimum(self.end_s[rows], end_step)
            )
            done = finishing | (~finite & (self.end_s[rows] <= end_step))
            self.remaining[rows] -= out
            self.sent[rows] += out
            parts.append((rows, out, stop, done))
            pred = rows[finishing]
            nxt = self.succ[pred]
            has = nxt >= 0
            if not has.any():
                break
            pred, nxt, when, r_pred = pred[has], nxt[has], stop[finishing][has], r[finishing][has]
            routed = self.routed[nxt]  # a message with no route never starts (it stays unfinished)
            pred, nxt, when, r_pred = pred[routed], nxt[routed], when[routed], r_pred[routed]
            self._inherit(pred, nxt)
            self.start[nxt] = np.maximum(self.posted[nxt], when)
            ready = self.start[nxt] < end_step * (1 - 1e-12)
            for row in nxt[~ready].tolist():
                heapq.heappush(self.later, (float(self.start[row]), row))
            if not ready.any():
                break
            rows, r, b = nxt[ready], np.minimum(r_pred[ready], self.line[nxt[ready]]), self.start[nxt[ready]]
            self.began[rows] = b
        if len(parts) == 1:
            return parts[0]
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
            np.concatenate([p[3] for p in parts]),
        )

    def _queues(self, inc: Incidence, rows: I64, out: F64) -> F64:
        """Switch egresses: what arrives is served at capacity, the rest queues, past the buffer it is
        dropped (from each flow in proportion to what it brought); returns the share each row lost.

        A link passes on at most its capacity: what an earlier hop of a flow queued or dropped (that hop's
        share of its arrivals it did not serve, last step's) does not reach the hops after it, which see
        the upstream link's departures, not the senders' rates."""
        dt = self.dt
        self.queue_before = self.queue
        offered = (out * self.mult[rows])[inc.row] * inc.w
        if self.pass_log.any():
            before = np.concatenate([[0.0], np.cumsum(inc.w * self.pass_log[inc.link])])
            offered *= np.exp(before[inc.seg] - before[inc.first])
        arrived = np.bincount(inc.link, weights=offered, minlength=self.n_ids)
        total = self.queue + arrived
        served = np.minimum(total, self.cap_bytes * dt)
        left = total - served
        excess = np.maximum(left - self.buffer, 0.0)
        self.queue = left - excess
        self.departed += served
        np.maximum(self.peak, self.queue / self.ports, out=self.peak)
        self._bin(self.now, self.now + dt, served[self.fabric_ids] / dt)
        short = served < arrived * (1 - 1e-12)
        if short.any() or self.pass_log.any():
            passed = np.divide(served, arrived, out=np.ones(self.n_ids), where=short)
            self.pass_log = np.log(np.maximum(passed, 1e-300))
        if not excess.any():
            return np.zeros(rows.size)
        share = np.divide(excess, arrived, out=np.zeros(self.n_ids), where=arrived > 0)
        keep = np.log1p(-np.minimum(share, 1.0 - 1e-15))
        kept = np.bincount(inc.row, weights=keep[inc.link] * inc.w, minlength=rows.size)
        lost: F64 = 1 - np.exp(kept)
        return lost

    def _mark(self, inc: Incidence, rows: I64, roce: I64, pk: F64, done: np.ndarray) -> None:
        """Marks at the egresses (per port of a bundle), a CNP per marked flow at most once per interval;
        a CNP for a message just sent goes to its QP's next message."""
        p, rp = self.setup.params, self.rp
        pm = mark_probability(self.queue / self.ports, p)
        with np.errstate(divide="ignore"):  # log1p(-1) = -inf: a certain mark, exp(-inf) = 0
            logs = np.log1p(-pm)
        path = 1 - np.exp(np.bincount(inc.row, weights=logs[inc.link] * inc.w, minlength=rows.size))
        r = rows[roce]
        self.marked[r] += pk[roce] * path[roce]
        hit = self.rng.random(roce.size) < 1 - np.power(1 - path[roce], pk[roce])
        answer = r[hit & (self.now - rp.last_cnp[r] >= p.cnp_interval_s)]
        moved = done[roce][hit & (self.now - rp.last_cnp[r] >= p.cnp_interval_s)] & (self.succ[answer] >= 0)
        answer = np.where(moved, self.succ[answer], answer)
        rp.last_cnp[answer] = self.now
        rp.pending[answer] = True
        self.cnps[answer] += 1

    def _finish(self, rows: I64, inc: Incidence, done: np.ndarray, send_end: F64) -> None:
        """After a step: rows done sending at `send_end` are delivered once the queues on their paths, as
        they were when the last byte arrived (interpolated over the step), have drained; messages that
        started in the step stay active."""
        local = np.flatnonzero(done)
        gone = rows[local]
        wait = []
        for queue in (self.queue_before, self.queue):
            delay = np.divide(queue, self.cap_bytes, out=np.zeros(self.n_ids), where=self.cap_bytes > 0)
            wait.append(np.bincount(inc.row, weights=inc.w * delay[inc.link], minlength=rows.size)[local])
        frac = np.clip((send_end[local] - (self.now - self.dt)) / self.dt, 0.0, 1.0)
        self.sent_at[gone] = send_end[local]
        self.done_at[gone] = send_end[local] + wait[0] + frac * (wait[1] - wait[0])
        self.finished.append(gone)
        self.active = np.sort(rows[~done])
        self._index()
        self.changed = True

    def _inherit(self, rows: I64, nxt: I64) -> None:
        """A QP's next message goes on with its rate controller's state (and timers)."""
        rp = self.rp
        for state in (rp.rc, rp.rt, rp.alpha, rp.t_ev, rp.b_ev, rp.since, rp.last_cnp, rp.pending,
                      rp.next_alpha, rp.next_inc):  # fmt: skip
            state[nxt] = state[rows]
        rp.rc[nxt] = np.minimum(rp.rc[nxt], rp.line[nxt])
        rp.rt[nxt] = np.minimum(rp.rt[nxt], rp.line[nxt])

    def _quiet(self, rate: F64) -> bool:
        """Nothing will change until the next start or completion: no queue, no CNP on its way, every
        controller at line rate (or off)."""
        if self.queue.max() > 0:
            return False
        if self.setup.enabled and self.a_roce.size:
            r = self.active[self.a_roce]
            if self.rp.pending[r].any() or not self.rp.at_line(r):
                return False
        return bool((rate > 0).all())

    def _jump(self, rate: F64, until_s: float) -> None:
        """Advance whole steps at constant rates up to (not past) the next event."""
        a, dt = self.active, self.dt
        horizon = min(self._next_start(), until_s) - self.now
        left = self.remaining[a]
        finite = np.isfinite(left)
        if finite.any():
            horizon = min(horizon, float((left[finite] * BITS / rate[finite]).min()))
        if self.a_timed.size:
            horizon = min(horizon, float(self.end_s[a[self.a_timed]].min()) - self.now)
        k = int(horizon / dt) - 1
        if k < 2:
            return
        span = k * dt
        out = rate * span / BITS
        self.remaining[a] -= out
        self.sent[a] += out
        self.delivered[a] += out
        self.packets[a] += out / self.frame[a]
        if self.setup.enabled and self.a_roce.size:
            r = a[self.a_roce]
            self.rp.count_bytes(r, out[self.a_roce])
            self.rp.skip(r, self.now + span)
        served = np.bincount(self.inc.link, weights=(out * self.mult[a])[self.inc.row] * self.inc.w,
                             minlength=self.n_ids)  # fmt: skip
        self.departed += served
        self._bin(self.now, self.now + span, served[self.fabric_ids] / span)
        self.now += span
        self.jumped += k

    def _bin(self, t0: float, t1: float, per_s: F64) -> None:
        """Bytes per fabric link into the utilisation-over-time bins (as `Simulator._bin`)."""
        self.bin_s = add_to_bins(self.heat, self.bin_s, t0, t1, per_s)


__all__ = ["MAX_STEPS", "RAMP_STEPS", "CcSetup", "CcSimulator", "CcStats", "check_supported", "waterfill"]
