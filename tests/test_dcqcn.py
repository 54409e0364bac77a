"""DCQCN's three machines (`traffic.dcqcn`) driven by a fake clock: the RP's cut and its three recovery
phases as the paper defines them, α's decay, the byte counter, the NP's CNP pacing, the CP's marking
profile, and scaling that keeps the dynamics' shape."""

from __future__ import annotations

import math

import pytest

from traffic.dcqcn import CnpPacer, Dcqcn, DcqcnParams, mark_probability

P = DcqcnParams(line_rate_bps=100e9)


def test_a_cnp_at_full_alpha_halves_the_rate_and_remembers_it_as_the_target() -> None:
    rp = Dcqcn(P, now=0.0)
    rp.on_cnp(now=1e-6)
    assert rp.rate_bps == pytest.approx(50e9)
    assert rp.target_bps == pytest.approx(100e9)
    assert rp.alpha == pytest.approx(1.0)  # (1 - g)·1 + g
    assert (rp.cnps, rp.cuts) == (1, 1)


def test_alpha_decays_by_1_minus_g_per_period_without_cnps_so_later_cuts_are_gentler() -> None:
    rp = Dcqcn(P, now=0.0)
    rp.on_cnp(now=0.0)
    periods = 100
    rp.advance(now=periods * P.alpha_period_s + 1e-9)
    assert rp.alpha == pytest.approx((1 - P.g) ** periods)
    before = rp.rate_bps
    rp.on_cnp(now=periods * P.alpha_period_s + 2e-9)
    assert rp.rate_bps == pytest.approx(before * (1 - (1 - P.g) ** periods / 2))


def test_fast_recovery_halves_the_gap_to_the_target_per_timer_event_then_additive_then_hyper() -> None:
    rp = Dcqcn(P, now=0.0)
    rp.on_cnp(now=0.0)
    rp.on_cnp(now=0.0)  # target 50G, rate 25G: the additive step is not capped by the line rate
    cut, target = rp.rate_bps, rp.target_bps
    assert (cut, target) == pytest.approx((25e9, 50e9))
    rp.advance(now=(P.fast_recovery_steps - 1) * P.increase_period_s + 1e-12)
    assert rp.phase() == "fast" and rp.target_bps == target
    assert rp.rate_bps == pytest.approx(target - (target - cut) / 2 ** (P.fast_recovery_steps - 1))
    # the F-th event is additive (max(T, BC) = F): the target grows by R_AI, the rate halfway to it
    before = rp.rate_bps
    rp.advance(now=P.fast_recovery_steps * P.increase_period_s + 1e-12)
    assert rp.phase() == "additive"
    assert rp.target_bps == pytest.approx(target + P.ai_rate_bps)
    assert rp.rate_bps == pytest.approx((before + target + P.ai_rate_bps) / 2)


def test_hyper_increase_needs_both_the_timer_and_the_byte_counter_past_f() -> None:
    p = DcqcnParams(line_rate_bps=100e9, byte_counter_bytes=1000)
    rp = Dcqcn(p, now=0.0)
    for _ in range(3):  # α stays high: three cuts take the rate far below the line rate
        rp.on_cnp(now=0.0)
    t = 0.0
    for _ in range(p.fast_recovery_steps + 2):  # timer events alone: additive at most
        t += p.increase_period_s
        rp.advance(now=t)
    assert rp.phase() == "additive"  # the timer alone (T = F + 2, BC = 0): never hyper
    rp.on_sent(1000 * (p.fast_recovery_steps + 2), now=t)
    assert rp.phase() == "hyper"
    target_before = rp.target_bps
    rp.on_sent(1000, now=t)  # one more byte-counter event: i = min(T, BC) - F = 2 → +2·R_HAI (capped)
    assert rp.target_bps == pytest.approx(min(p.line_rate_bps, target_before + 2 * p.hai_rate_bps))


def test_the_rate_stays_between_the_minimum_and_the_line_rate() -> None:
    rp = Dcqcn(P, now=0.0)
    for i in range(200):
        rp.on_cnp(now=i * 1e-7)
    assert rp.rate_bps == pytest.approx(P.min_rate_bps)
    rp.advance(now=10.0)  # a long quiet time: every increase is capped
    assert rp.rate_bps == pytest.approx(P.line_rate_bps)
    assert rp.target_bps <= P.line_rate_bps


def test_timers_fire_in_time_order_whatever_the_call_pattern() -> None:
    """One advance over many periods equals many small ones: no event lost or reordered."""
    a, b = Dcqcn(P, now=0.0), Dcqcn(P, now=0.0)
    a.on_cnp(now=0.0)
    b.on_cnp(now=0.0)
    a.advance(now=1e-3)
    for i in range(1, 1001):
        b.advance(now=i * 1e-6)
    assert (a.rate_bps, a.target_bps, a.alpha, a.timer_events) == pytest.approx(
        (b.rate_bps, b.target_bps, b.alpha, b.timer_events)
    )


def test_the_np_sends_at_most_one_cnp_per_interval_per_qp() -> None:
    np_ = CnpPacer(interval_s=50e-6)
    assert np_.on_marked(7, now=0.0)
    assert not np_.on_marked(7, now=49e-6)
    assert np_.on_marked(8, now=49e-6)  # another QP: its own interval
    assert np_.on_marked(7, now=50e-6)


def test_the_cp_marks_with_the_red_like_profile() -> None:
    assert mark_probability(0, P) == 0.0
    assert mark_probability(P.kmin_bytes, P) == 0.0
    mid = (P.kmin_bytes + P.kmax_bytes) / 2
    assert mark_probability(mid, P) == pytest.approx(P.pmax / 2)
    assert mark_probability(P.kmax_bytes, P) == pytest.approx(P.pmax)
    assert mark_probability(P.kmax_bytes + 1, P) == 1.0


@pytest.mark.parametrize("scale", [1 / 2000, 1e-5, 0.5])
def test_scaling_keeps_the_dynamics_shape(scale: float) -> None:
    """The same CNP and traffic pattern at scaled times gives the same rates as fractions of the line."""
    full, slow = P, P.scaled(scale)
    a, b = Dcqcn(full, now=0.0), Dcqcn(slow, now=0.0)
    t = 0.0
    for step in range(400):
        t += 7e-6
        if step % 37 == 0:
            a.on_cnp(now=t)
            b.on_cnp(now=t / scale)
        a.on_sent(4096, now=t)
        b.on_sent(4096, now=t / scale)  # bytes are not scaled: the byte counter fires alike
        assert b.rate_bps / slow.line_rate_bps == pytest.approx(a.rate_bps / full.line_rate_bps, rel=1e-9)
        assert b.alpha == pytest.approx(a.alpha, rel=1e-9)
    assert (a.cuts, a.increases) == (b.cuts, b.increases) and a.increases > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("g", 0.0), ("line_rate_bps", -1.0), ("pmax", 2.0), ("kmax_bytes", 10), ("hai_rate_bps", 1.0),
     ("increase_period_s", math.nan), ("min_rate_bps", 1e15)],
)  # fmt: skip
def test_parameters_out_of_range_are_refused_with_the_field_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        DcqcnParams(**{"line_rate_bps": 100e9, field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scale"):
        P.scaled(0.0)
