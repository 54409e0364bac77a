"""The DCQCN paper's fluid model (`flowsim.fluidmodel`): the prediction the instruments are judged against,
so it is checked on its own — fair share at the fixed point, the link kept full on a bounded queue, α's
decay without marks, the same answer in timer periods at any scale, and the judging helpers on made-up
series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowsim.fluidmodel import (
    _terms,
    convergence_figures,
    predicted_convergence_s,
    settled_after,
    settled_s,
    smoothed_gap,
    solve,
)
from traffic.dcqcn import DcqcnParams

TEN_G = DcqcnParams(line_rate_bps=10e9, kmax_bytes=32768).scaled(14e6 / 10e9)  # converge-k4.yaml's


def test_two_flows_end_at_fair_share_with_the_link_full_on_a_bounded_queue() -> None:
    p = TEN_G
    t = p.increase_period_s
    trace = solve(p, p.line_rate_bps, [0.0, 182 * t], 182 * t + 2000 * t)
    late = trace.t_s > 182 * t + 1500 * t
    a, b = trace.rate_bps[late, 0].mean(), trace.rate_bps[late, 1].mean()
    assert a == pytest.approx(b, rel=0.02)
    assert a + b == pytest.approx(p.line_rate_bps, rel=0.03)
    q = trace.queue_bytes[late]
    assert p.kmin_bytes < q.min() and q.max() < p.kmax_bytes  # marked, never past the ramp
    alpha = trace.alpha[late]
    assert alpha[:, 0] == pytest.approx(alpha[:, 1], rel=0.05)


def test_a_flow_alone_at_the_links_rate_is_never_marked_and_its_alpha_decays_by_g_per_period() -> None:
    p = TEN_G
    periods = 256
    trace = solve(p, p.line_rate_bps, [0.0], periods * p.alpha_period_s)
    assert trace.queue_bytes.max() == 0
    assert trace.rate_bps[-1, 0] == pytest.approx(p.line_rate_bps)
    # dα/dt = -g α / τ': α(t) = exp(-g t / τ'), within the Euler steps' error of (1 - g)^periods
    assert trace.alpha[-1, 0] == pytest.approx(math.exp(-p.g * periods), rel=0.01)
    assert trace.alpha[-1, 0] == pytest.approx((1 - p.g) ** periods, rel=0.01)


def test_a_flow_into_a_link_of_half_its_rate_comes_down_to_it() -> None:
    p = TEN_G
    trace = solve(p, p.line_rate_bps / 2, [0.0], 600 * p.increase_period_s)
    late = trace.t_s > 400 * p.increase_period_s
    assert trace.rate_bps[late, 0].mean() == pytest.approx(p.line_rate_bps / 2, rel=0.03)
    assert trace.queue_bytes[late].max() < p.kmax_bytes


def test_the_prediction_is_the_same_in_timer_periods_at_any_scale() -> None:
    base = DcqcnParams(line_rate_bps=10e9, kmax_bytes=32768)
    periods = []
    for scale in (1.0, 14e6 / 10e9):
        p = base.scaled(scale)
        took = predicted_convergence_s(p, p.line_rate_bps, 182 * p.increase_period_s, horizon_periods=1500)
        assert took is not None
        periods.append(took / p.increase_period_s)
    assert periods[0] == pytest.approx(periods[1], rel=1e-6)
    assert 300 < periods[0] < 700  # the two flows' alphas must meet: hundreds of periods, not a few


def test_the_later_flow_starting_with_a_higher_alpha_is_cut_harder_then_catches_up() -> None:
    p = TEN_G
    t = p.increase_period_s
    trace = solve(p, p.line_rate_bps, [0.0, 182 * t], 182 * t + 800 * t)
    after = trace.t_s > 182 * t + 50 * t
    gap = trace.rate_bps[after, 0] - trace.rate_bps[after, 1]
    assert (gap > 0).all()  # the first flow stays ahead (its α is lower) ...
    assert gap[-1] < 0.25 * gap[0]  # ... by less and less


def test_the_terms_are_continuous_at_no_marking() -> None:
    r = np.array([800.0, 1600.0])
    at_zero = _terms(0.0, r, 0.07, 9691.0, 5, 0.039)
    near = _terms(1e-12, r, 0.07, 9691.0, 5, 0.039)
    for x, y in zip(at_zero, near, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-9)
    a, b, c, d, e = _terms(1.0, r, 0.07, 9691.0, 5, 0.039)
    assert (a == 1).all() and not (b.any() or c.any() or d.any() or e.any())


def test_smoothed_gap_averages_the_runs_before_comparing() -> None:
    # two runs whose gaps cancel: one has a ahead, the other b; the mean of the runs is equal rates
    a = np.array([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]])
    b = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    assert smoothed_gap(a, b, 1) == pytest.approx([0.0, 0.0, 0.0])
    assert smoothed_gap(a[0], b[0], 2) == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError):
        smoothed_gap(a, b, 0)


def test_settled_means_for_good_not_first_touch() -> None:
    t = np.arange(6.0)
    assert settled_after(t, np.array([0.5, 0.05, 0.5, 0.05, 0.05, 0.05])) == 3.0
    assert settled_after(t, np.array([0.5, 0.05, 0.05, 0.05, 0.05, 0.5])) is None
    assert settled_after(t, np.zeros(6)) == 0.0
    assert settled_s(t, np.array([1.0, 1, 1, 1, 1, 1]), np.array([0.5, 0.5, 0.95, 1, 1, 1]), 1.0) == 1.0
    figures = convergence_figures(t, np.ones((2, 6)), np.full((2, 6), 0.5), 2)
    assert figures["settled_s"] is None and figures["gaps"] == [0.5, 0.5, 0.5]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        solve(TEN_G, 0.0, [0.0], 1.0)
    with pytest.raises(ValueError):
        solve(TEN_G, 1e6, [], 1.0)
