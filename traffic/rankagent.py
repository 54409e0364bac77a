"""One RoCEv2 agent per emulated host: it sends the host's RDMA WRITE messages and receives its peers',
as a rank of a collective or a replayer of posted messages (`python -m traffic.rankagent PLAN.json`).

The plan (written by `emulation.rocerun` from `labspec.workplan`) lists the host's messages to send and
to receive.  A message may go once it is posted (`post_s` after the common start), the message before it
on its QP has gone (a QP delivers in order) and — for a job run in `steps` — once this rank has finished
the step before (sent all its messages of that step and received all it expects), as NCCL's ranks do.
Messages that may go are interleaved round robin, one packet at a time, at the job's paced rate (or the
NIC's line rate), never faster than the NIC.

With `cc` in the plan (a scenario's `cc: dcqcn`) every QP runs DCQCN (`traffic.ccagent`): it is spaced at
its own rate, CE-marked packets it receives are answered with CNPs and CNPs cut the rate of the QP they
name.  Senders never retransmit: a packet the fabric drops is lost, not resent.  So a
receive counts as finished when every packet came, or when its QP went quiet for `stall_s` after some of
it (or a later message) arrived — the rest was lost — and a whole step's receives are given up when
nothing came for `5 x stall_s` after this rank had sent its part: a collective under loss slows down by
those waits instead of hanging.  The report (JSON on stdout) has per message when it was sent and when and
how completely it arrived, per job the packets delivered per 0.1 s, per QP the receiver's PSN accounting,
and the socket's own drops.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import json
import random
import select
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from scapy.contrib.roce import BTH

from traffic.ccagent import CNP_DSCP, CcAgent, params_from_plan
from traffic.entropy import spray_sport
from traffic.fastpath import FrameTemplate, Receiver, raw_socket, socket_drops
from traffic.roce import DEFAULT_PKEY, Endpoints, cnp, frame, op

#: Offsets in a RoCEv2 frame (Ethernet, IPv4 without options, UDP, BTH).
TOS_AT, BTH_AT = 15, 42
CNP_OPCODE = 0x81

#: A pacer may catch up this much after a late wake-up (so timer jitter does not lower the rate).
SLACK_S = 0.002


@dataclass
class Send:
    id: int
    job: int
    step: int
    qp: int
    packets: int
    psn: int
    post_s: float
    template: FrameTemplate
    spray: int | None
    sent: int = 0
    first: float | None = None
    last: float | None = None

    @property
    def done(self) -> bool:
        return self.sent >= self.packets


@dataclass
class Recv:
    id: int
    job: int
    step: int
    qp: int
    psn: int
    packets: int
    received: int = 0
    done_at: float | None = None
    last_at: float | None = None
    finished: bool = False
    complete: bool = False
    #: When a packet at or beyond the message's last PSN arrived (what is still missing was lost, or is
    #: a sprayed packet a little behind).
    tail_at: float | None = None


@dataclass
class Pacer:
    interval_s: float
    due: float = 0.0
    active: collections.deque[Send] = field(default_factory=collections.deque)


class Agent:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.start_at = float(plan["start_at"]) if plan.get("start_at") is not None else 0.0
        self.deadline = self.start_at + float(plan["deadline_s"])
        self.stall_s = float(plan.get("stall_s", 0.3))
        nic_bps = plan.get("nic_bps")
        self.nic_bps = float(nic_bps) if nic_bps else None
        self.nic_due = 0.0
        self.rng = random.Random(f"{plan['src_mac']}:{plan.get('seed', 0)}")
        self.sock = raw_socket(plan["iface"])
        self.sock.setblocking(False)
        self.receiver = Receiver(self.sock, check_icrc=bool(plan.get("check_icrc", True)))
        jobs = plan["jobs"]
        self.pacers: dict[int, Pacer] = {}
        self.stepped: dict[int, list[int]] = {}
        for key, job in jobs.items():
            rate = job.get("rate_pps")
            frame_bits = 8.0 * float(job["frame_bytes"])
            if not rate and self.nic_bps:
                rate = self.nic_bps / frame_bits
            self.pacers[int(key)] = Pacer(1.0 / float(rate) if rate else 0.0)
            if job.get("steps"):
                self.stepped[int(key)] = sorted({int(s) for s in job.get("rank_steps", [])})
        self.step_index = dict.fromkeys(self.stepped, 0)
        self.step_sent_at: dict[int, float | None] = dict.fromkeys(self.stepped, None)
        self.steps_done: dict[int, list[float]] = {j: [] for j in self.stepped}
        templates: dict[tuple[int, int], FrameTemplate] = {}
        self.sends: list[Send] = []
        self.queues: dict[int, collections.deque[Send]] = {}
        for s in plan["sends"]:
            key = (int(s["qp"]), int(s["mtu"]))
            if key not in templates:
                ep = Endpoints(plan["src_mac"], s["dst_mac"], plan["src_ip"], s["dst_ip"], dqpn=int(s["qp"]),
                               sport=int(s["sport"] or 0xC000), pkey=int(s.get("pkey", DEFAULT_PKEY)),
                               dscp=int(s.get("dscp", 26)))  # fmt: skip
                bth = BTH(opcode=op("RC", "RDMA_WRITE_MIDDLE"), pkey=ep.pkey, dqpn=ep.dqpn, psn=0)
                templates[key] = FrameTemplate.from_packet(frame(ep, bth, payload=bytes(int(s["mtu"]))))
            send = Send(int(s["id"]), int(s["job"]), int(s["step"]), int(s["qp"]), int(s["packets"]),
                        int(s["psn"]), float(s["post_s"]), templates[key],
                        None if s["sport"] else int(s.get("spray_offset", 0)))  # fmt: skip
            self.sends.append(send)
            self.queues.setdefault(send.qp, collections.deque()).append(send)
        self.recvs = [Recv(int(r["id"]), int(r["job"]), int(r["step"]), int(r["qp"]), int(r["psn"]),
                           int(r["packets"])) for r in plan["recvs"]]  # fmt: skip
        self.by_qp: dict[int, list[Recv]] = {}
        for r in sorted(self.recvs, key=lambda r: (r.qp, r.psn)):
            self.by_qp.setdefault(r.qp, []).append(r)
        self.starts = {qp: [r.psn for r in rs] for qp, rs in self.by_qp.items()}
        self.qp_last: dict[int, float] = {}
        self.qp_top: dict[int, int] = {}
        self.first_sent: float | None = None
        self.sent_packets = 0
        #: job -> bin (`arrival_bin_s` wide, from start_at) -> data packets delivered to that job's receives:
        #: what this host's link carried over time.
        self.arrival_bin_s = float(plan.get("arrival_bin_s", 0.1))
        self.arrivals: dict[int, dict[int, int]] = {}
        #: QPs with a message at their pacer: the next message of the QP waits until that one has gone.
        self.busy: set[int] = set()
        self.cc: CcAgent | None = None
        self.cnp_frames: dict[tuple[bytes, bytes, int], bytes] = {}
        if plan.get("cc"):
            self.cc = CcAgent(params_from_plan(plan["cc"]), self._qp_max_bps(jobs), self.start_at)

    def _qp_max_bps(self, jobs: dict[str, Any]) -> dict[int, float]:
        """Each sending QP's highest DCQCN rate: its job's paced rate where one is given."""
        out: dict[int, float] = {}
        for s in self.sends:
            job = jobs[str(s.job)]
            if job.get("rate_pps"):
                out[s.qp] = float(job["rate_pps"]) * 8.0 * float(job["frame_bytes"])
        return out

    # --- what may go --------------------------------------------------------------------------------

    def _current_step(self, job: int) -> int | None:
        steps = self.stepped.get(job)
        if steps is None:
            return None
        k = self.step_index[job]
        return steps[k] if k < len(steps) else 1 << 30

    def _release(self, now: float) -> float:
        """Move messages that may go now to their job's pacer; the next time one will be posted."""
        upcoming = float("inf")
        for qp, queue in self.queues.items():
            if not queue or qp in self.busy:
                continue
            head = queue[0]
            step = self._current_step(head.job)
            if step is not None and head.step > step:
                continue
            at = self.start_at + head.post_s
            if at > now:
                upcoming = min(upcoming, at)
                continue
            queue.popleft()
            self.busy.add(qp)
            self.pacers[head.job].active.append(head)
        return upcoming

    def _send_due(self, now: float) -> float:
        """Send every packet due now; the time the next one is due."""
        nxt = float("inf")
        for pacer in self.pacers.values():
            while pacer.active:
                if self.nic_bps and self.nic_due > now:
                    nxt = min(nxt, self.nic_due)
                    break
                if pacer.due > now:
                    nxt = min(nxt, pacer.due)
                    break
                send = pacer.active[0]
                if self.cc is not None and self.cc.next_send_s(send.qp) > now:
                    ready = self._cc_ready(pacer, now)
                    if ready is None:
                        nxt = min(nxt, *(self.cc.next_send_s(s.qp) for s in pacer.active))
                        break
                    send = ready
                psn = send.psn + send.sent
                sport = spray_sport(psn, send.spray) if send.spray is not None else None
                try:
                    self.sock.send(send.template.render(psn, sport))
                except (BlockingIOError, OSError):
                    pacer.due = now + max(pacer.interval_s, 0.0005)  # the host's queue is full: back off
                    nxt = min(nxt, pacer.due)
                    break
                send.sent += 1
                self.sent_packets += 1
                send.first = now if send.first is None else send.first
                send.last = now
                self.first_sent = now if self.first_sent is None else self.first_sent
                # a random gap around the interval (mean exact): senders of one rate never move in lockstep,
                # which would make every drop-tail queue drop the same flows' packets (phase effects)
                pacer.due = max(pacer.due, now - SLACK_S) + pacer.interval_s * (
                    0.75 + 0.5 * self.rng.random()
                )
                if self.cc is not None:
                    self.cc.on_sent(send.qp, len(send.template.frame), now)
                if self.nic_bps:
                    bits = 8.0 * len(send.template.frame)
                    self.nic_due = max(self.nic_due, now - SLACK_S) + bits / self.nic_bps
                pacer.active.popleft()
                if not send.done:
                    pacer.active.append(send)  # round robin over the job's messages
                else:
                    self.busy.discard(send.qp)  # the next message of this QP may go
        return nxt

    def _cc_ready(self, pacer: Pacer, now: float) -> Send | None:
        """The first message of the pacer whose QP's DCQCN rate lets it send now, rotated to the front."""
        assert self.cc is not None
        for k, send in enumerate(pacer.active):
            if self.cc.next_send_s(send.qp) <= now:
                pacer.active.rotate(-k)
                return send
        return None

    # --- receiving ----------------------------------------------------------------------------------

    def _congestion(self, data: bytes, now: float) -> bool:
        """DCQCN's frames: True for a CNP (handled here, not data); a CE-marked data packet is answered."""
        assert self.cc is not None
        qp = int.from_bytes(data[47:50], "big")
        if data[BTH_AT] == CNP_OPCODE:
            self.cc.on_cnp(qp, now)
            return True
        if self.cc.on_data(qp, data[TOS_AT] & 3 == 3, now):
            with contextlib.suppress(BlockingIOError, OSError):  # a CNP lost here is one a switch could drop
                self.sock.send(self._cnp_frame(data, qp))
        return False

    def _cnp_frame(self, data: bytes, qp: int) -> bytes:
        """The CNP back to the sender of `data`'s QP (built once per sender and QP)."""
        key = (data[6:12], data[26:30], qp)
        cached = self.cnp_frames.get(key)
        if cached is None:
            peer_ip = ".".join(str(b) for b in data[26:30])
            pkey = int.from_bytes(data[44:46], "big")
            ep = Endpoints(self.plan["src_mac"], data[6:12].hex(":"), self.plan["src_ip"], peer_ip, dqpn=qp,
                           pkey=pkey, dscp=CNP_DSCP, ecn=0)  # fmt: skip
            cached = self.cnp_frames[key] = bytes(cnp(ep))
        return cached

    def _receive(self, now: float) -> None:
        while True:
            try:
                data = self.sock.recv(65535)
            except (BlockingIOError, InterruptedError):
                return
            if (
                self.cc is not None
                and len(data) > BTH_AT + 12
                and data[36:38] == b"\x12\xb7"
                and self._congestion(data, now)
            ):
                continue
            if not self.receiver.handle(data, now):
                continue
            qp = int.from_bytes(data[47:50], "big")
            psn = int.from_bytes(data[51:54], "big")
            self.qp_last[qp] = now
            self.qp_top[qp] = max(self.qp_top.get(qp, -1), psn)
            starts = self.starts.get(qp)
            if starts is None:
                continue
            i = bisect.bisect_right(starts, psn) - 1
            if i < 0:
                continue
            r = self.by_qp[qp][i]
            if psn >= r.psn + r.packets:
                continue
            r.received += 1
            r.last_at = now
            if r.finished and not r.complete:
                r.done_at = now  # given up while its QP was quiet, yet more came: its last delivery
            bins = self.arrivals.setdefault(r.job, {})
            at = int((now - self.start_at) / self.arrival_bin_s)
            bins[at] = bins.get(at, 0) + 1
            if r.received >= r.packets and not r.finished:
                r.finished = r.complete = True
                r.done_at = now

    def _stalls(self, now: float) -> None:
        """Receives that will get no more: their last PSN (or a later one) arrived a reorder window ago, or
        their QP went quiet for `stall_s` after some of them arrived (the tail itself was lost)."""
        reorder_s = self.stall_s / 4
        for qp, rs in self.by_qp.items():
            last = self.qp_last.get(qp)
            if last is None:
                continue
            top = self.qp_top.get(qp, -1)
            quiet = now - last >= self.stall_s
            for r in rs:
                if r.finished:
                    continue
                if top >= r.psn + r.packets - 1 and r.tail_at is None:
                    r.tail_at = now
                if (r.tail_at is not None and now - r.tail_at >= reorder_s) or (quiet and r.received > 0):
                    r.finished = True
                    r.done_at = r.last_at

    def _advance_steps(self, now: float) -> None:
        for job, steps in self.stepped.items():
            while self.step_index[job] < len(steps):
                step = steps[self.step_index[job]]
                sends = [s for s in self.sends if s.job == job and s.step == step]
                if not all(s.done for s in sends):
                    break
                if self.step_sent_at[job] is None:
                    self.step_sent_at[job] = now
                pending = [r for r in self.recvs if r.job == job and r.step == step and not r.finished]
                sent_at = self.step_sent_at[job]
                assert sent_at is not None
                quiet = max([sent_at, *(self.qp_last.get(r.qp, 0.0) for r in pending)])
                if pending and now - quiet >= 5 * self.stall_s:
                    for r in pending:  # nothing more came: given up
                        r.finished = True
                        r.done_at = r.last_at
                    pending = []
                if pending:
                    break
                self.steps_done[job].append(now)
                self.step_index[job] += 1
                self.step_sent_at[job] = None

    # --- the loop -----------------------------------------------------------------------------------

    def begin_at(self, start_at: float) -> None:
        """The common start (wall clock) every host's agent was given."""
        self.start_at = start_at
        if self.cc is not None:
            self.cc.start_s = start_at
        self.deadline = start_at + float(self.plan["deadline_s"])

    def finished(self) -> bool:
        return all(s.done for s in self.sends) and all(r.finished for r in self.recvs)

    def run(self) -> dict[str, Any]:
        while time.time() < self.start_at:
            self._receive(time.time())
            time.sleep(min(0.01, max(0.0, self.start_at - time.time())))
        while True:
            now = time.time()
            self._receive(now)
            self._stalls(now)
            self._advance_steps(now)
            if self.finished() or now >= self.deadline:
                break
            upcoming = self._release(now)
            due = self._send_due(now)
            wake = min(upcoming, due, now + self.stall_s / 4, self.deadline)
            timeout = max(0.0, wake - time.time())
            if timeout > 0:
                select.select([self.sock], [], [], min(timeout, 0.05))
        return self.report()

    def report(self) -> dict[str, Any]:
        return {
            "start": self.first_sent,
            "sent_packets": self.sent_packets,
            "sends": {str(s.id): [s.first, s.last, s.sent] for s in self.sends},
            "recvs": {str(r.id): [r.received, r.done_at, r.complete] for r in self.recvs},
            "arrivals": {
                str(j): {str(b): n for b, n in sorted(bins.items())} for j, bins in self.arrivals.items()
            },
            "qps": {str(k): v.as_dict() for k, v in sorted(self.receiver.qps.items())},
            "steps_done": {str(j): t for j, t in self.steps_done.items()},
            "other_frames": self.receiver.other,
            "socket_drops": socket_drops(self.sock),
            "cc": self.cc.report(time.time()) if self.cc is not None else None,
        }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m traffic.rankagent PLAN.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as handle:
        plan = json.load(handle)
    agent = Agent(plan)
    print("ready", flush=True)
    if plan.get("start_at") is None:  # the runner tells every agent the same instant once all are ready
        line = sys.stdin.readline()
        if not line.strip():
            return 1
        agent.begin_at(float(line))
    print(json.dumps(agent.run()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
