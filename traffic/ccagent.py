"""DCQCN inside a host's RoCE agent: the reaction point of every QP it sends on and the notification point
of every QP it receives on (`traffic.rankagent` calls these; the machines themselves are `traffic.dcqcn`).

Why a separate object: the agent's send loop stays what it was (round robin over a job's messages, the job
pacer, the NIC's rate); congestion control adds one question per packet — may this QP send now? — and two
events: a CE-marked data packet arrived (answer with a CNP, at most one per QP per interval) and a CNP
arrived (cut that QP's rate).  Each QP is spaced at its DCQCN rate, as a NIC's rate limiter spaces it; its
highest rate is the NIC's, or the job's `rate_pps` where one is given (NVIDIA: `rpg_max_rate`).

Rates are sampled at every change (bounded), so reports can show cuts and recovery over time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from traffic.dcqcn import CnpPacer, Dcqcn, DcqcnParams

#: Rate samples kept per QP (each cut and each increase is one); later changes only update the last.
MAX_SAMPLES = 2048
#: A QP that fell behind its spacing may catch up this much (timer jitter must not lower its rate).
SLACK_S = 0.002
#: DSCP of CNPs (NVIDIA's default `cnp_dscp`): they go in a class of their own, ahead of data.
CNP_DSCP = 48


class CcAgent:
    """Per host: DCQCN RPs of the QPs it sends on, and the CNP pacer of the QPs it receives on."""

    def __init__(self, params: DcqcnParams, max_bps: dict[int, float], start_s: float) -> None:
        self.params = params
        self.max_bps = max_bps
        self.start_s = start_s
        self.rps: dict[int, Dcqcn] = {}
        self.due: dict[int, float] = {}
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self.np = CnpPacer(params.cnp_interval_s)
        self.cnps_sent = 0
        self.cnps_received = 0
        self.cnps_unknown_qp = 0
        self.ce_received = 0
        self.data_received = 0

    def _rp(self, qp: int, now: float) -> Dcqcn:
        rp = self.rps.get(qp)
        if rp is None:
            top = min(self.params.line_rate_bps, self.max_bps.get(qp, self.params.line_rate_bps))
            p = replace(self.params, line_rate_bps=top, min_rate_bps=min(self.params.min_rate_bps, top))
            rp = self.rps[qp] = Dcqcn(p, now)
            self.samples[qp] = [(now - self.start_s, rp.rate_bps)]
        return rp

    def _sample(self, qp: int, rp: Dcqcn, now: float) -> None:
        samples = self.samples[qp]
        if samples[-1][1] == rp.rate_bps:
            return
        point = (now - self.start_s, rp.rate_bps)
        if len(samples) < MAX_SAMPLES:
            samples.append(point)
        else:
            samples[-1] = point

    def next_send_s(self, qp: int) -> float:
        """When `qp` may send its next packet (0.0: now)."""
        return self.due.get(qp, 0.0)

    def on_sent(self, qp: int, frame_bytes: int, now: float) -> None:
        rp = self._rp(qp, now)
        rp.on_sent(frame_bytes, now)
        self._sample(qp, rp, now)
        self.due[qp] = max(self.due.get(qp, 0.0), now - SLACK_S) + 8.0 * frame_bytes / rp.rate_bps

    def on_cnp(self, qp: int, now: float) -> None:
        self.cnps_received += 1
        rp = self.rps.get(qp)
        if rp is None:  # a CNP for a QP this host never sent on: counted, ignored
            self.cnps_unknown_qp += 1
            return
        rp.on_cnp(now)
        self._sample(qp, rp, now)

    def on_data(self, qp: int, ce: bool, now: float) -> bool:
        """A data packet of `qp` arrived; True: answer it with a CNP now."""
        self.data_received += 1
        if not ce:
            return False
        self.ce_received += 1
        if not self.np.on_marked(qp, now):
            return False
        self.cnps_sent += 1
        return True

    def report(self, now: float) -> dict[str, Any]:
        for qp, rp in self.rps.items():
            rp.advance(now)
            self._sample(qp, rp, now)
        qps = {
            str(qp): {
                "max_rate_bps": rp.p.line_rate_bps,
                "final_rate_bps": rp.rate_bps,
                "cuts": rp.cuts,
                "alpha": round(rp.alpha, 6),
                "rates": [[round(t, 6), r] for t, r in self.samples[qp]],
            }
            for qp, rp in sorted(self.rps.items())
        }
        return {
            "cnps_sent": self.cnps_sent,
            "cnps_received": self.cnps_received,
            "cnps_unknown_qp": self.cnps_unknown_qp,
            "ce_received": self.ce_received,
            "data_received": self.data_received,
            "rate_cuts": sum(rp.cuts for rp in self.rps.values()),
            "qps": qps,
        }


def params_from_plan(plan: dict[str, Any]) -> DcqcnParams:
    """The DCQCN parameters an agent's plan carries (`emulation.rocerun` writes them field by field)."""
    return DcqcnParams(**plan)


__all__ = ["CNP_DSCP", "CcAgent", "params_from_plan"]
