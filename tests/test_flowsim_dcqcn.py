"""The simulator's DCQCN (`flowsim.dcqcn`): the incast the issue names, with and without the controller,
against the same rate machine the emulator's senders run (`traffic.dcqcn`)."""

from __future__ import annotations

import numpy as np
import pytest

from flowsim.dcqcn import FluidDcqcn, FluidLinks, jain
from traffic.dcqcn import Dcqcn, DcqcnParams

P = DcqcnParams(line_rate_bps=100e9)
SENDERS = 8
END_S = 0.05


def incast(cc: bool, seed: int = 1) -> tuple[FluidDcqcn, dict[str, float]]:
    """8 senders (each its own 100G NIC link) into one 100G link at 2x its rate in all, 1 MB of buffer."""
    cap = np.full(SENDERS + 1, 100e9)
    indptr = np.arange(0, 2 * SENDERS + 1, 2, dtype=np.int64)
    links = np.array([x for i in range(SENDERS) for x in (i, SENDERS)], dtype=np.int64)
    net = FluidLinks(cap, indptr, links, np.full(SENDERS + 1, 1e6))
    sim = FluidDcqcn(net, P, np.zeros(SENDERS), np.full(SENDERS, np.inf),
                     demand_bps=np.full(SENDERS, 2 * 100e9 / SENDERS), cc=cc, seed=seed)  # fmt: skip
    r = sim.run(END_S)
    sent = r.delivered_bytes + r.dropped_bytes
    half = len(r.t_s) // 2
    return sim, {
        "loss": float(r.dropped_bytes.sum() / sent.sum()),
        "goodput": float(r.delivered_bytes.sum() * 8 / END_S / 100e9),
        "jain": jain(r.delivered_bytes),
        "queue_late_max": float(r.queue_bytes[half:, SENDERS].max()),
        "cnps": float(r.cnps.sum()),
        "marked": float(r.marked_packets.sum() / r.sent_packets.sum()),
    }


def test_without_congestion_control_the_incast_loses_half_at_the_bottleneck() -> None:
    _, f = incast(cc=False)
    assert f["loss"] >= 0.40
    assert f["cnps"] == 0


def test_dcqcn_makes_the_incast_lossless_fair_and_keeps_the_queue_bounded() -> None:
    _, f = incast(cc=True)
    assert f["loss"] < 0.01
    assert f["goodput"] >= 0.90
    assert f["jain"] >= 0.9
    assert f["queue_late_max"] < P.kmax_bytes  # settled: the queue lives on the marking ramp
    assert f["cnps"] > 0 and 0 < f["marked"] < 0.5


def test_same_seed_same_run_and_the_seed_matters() -> None:
    a, b, c = incast(True, seed=3)[1], incast(True, seed=3)[1], incast(True, seed=4)[1]
    assert a == b
    assert a != c


def test_an_uncongested_flow_runs_at_line_rate_as_the_rate_machine_does() -> None:
    net = FluidLinks(np.array([100e9]), np.array([0, 1]), np.array([0]), np.array([np.inf]))
    r = FluidDcqcn(net, P, np.zeros(1), np.array([1e6])).run(0.001)
    rp = Dcqcn(P, now=0.0)
    assert r.cnps[0] == 0 and rp.rate_bps == P.line_rate_bps
    assert r.finish_s[0] == pytest.approx(1e6 * 8 / P.line_rate_bps, rel=0.2)  # within a step of 14 µs


def test_a_cut_in_the_fluid_model_is_the_rate_machines_cut() -> None:
    """Both instruments' senders apply the same algorithm: one forced CNP, then recovery without marks."""
    net = FluidLinks(np.array([1e15]), np.array([0, 1]), np.array([0]), np.array([np.inf]))
    sim = FluidDcqcn(net, P, np.zeros(1), np.array([np.inf]), dt_s=1e-6)
    sim.pending_cnp[0] = True
    r = sim.run(300e-6, sample_every=1)
    rp = Dcqcn(P, now=0.0)
    rp.on_cnp(now=0.0)
    for i, t in enumerate(r.t_s):
        rp.advance(now=t)
        assert r.rate_bps[i, 0] == pytest.approx(rp.rate_bps, rel=1e-9), t


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="indptr"):
        FluidLinks(np.array([1.0]), np.array([0, 0]), np.array([], dtype=np.int64), np.array([1.0]))
    with pytest.raises(ValueError, match="links"):
        FluidLinks(np.array([1.0]), np.array([0, 1]), np.array([3]), np.array([1.0]))
    net = FluidLinks(np.array([1.0]), np.array([0, 1]), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match="one value per flow"):
        FluidDcqcn(net, P, np.zeros(2), np.zeros(2))
