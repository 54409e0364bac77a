"""How an emulated incast is scored (`emulation.rocerun.incast_figures`), on made-up agent records: the
link's goodput while the incast oversubscribes it comes from the receiver's arrival bins inside that
window only; the span's goodput also carries the tail where too few senders are left to fill the link."""

from __future__ import annotations

from typing import Any

import pytest

from emulation.rocerun import ARRIVAL_BIN_S, RoceRun, incast_figures
from labspec.workplan import Job
from traffic.wire import roce_frame_bytes

FRAME = roce_frame_bytes(1024)
LINK_PPS = 200
LINK_BPS = LINK_PPS * FRAME * 8


def job(rate_pps: float | None = 100) -> Job:
    return Job(index=0, kind="roce-incast", label="incast", schedule="posted", rate_pps=rate_pps, mtu=1024)


def run(senders: int, sender_bps: float | None = None) -> RoceRun:
    nics: dict[str, float | None] = {f"h{i}": sender_bps for i in range(1, senders + 1)}
    return RoceRun(jobs=[], messages=[], pkeys={}, nic_bps={**nics, "h9": LINK_BPS})


def records(last_sent_s: list[float], packets: int) -> list[dict[str, Any]]:
    return [
        {"src": f"h{i}", "dst": "h9", "sent": packets, "received": packets, "first_sent_s": 0.0,
         "last_sent_s": last, "done_s": last + 0.01}
        for i, last in enumerate(last_sent_s, 1)
    ]  # fmt: skip


def bins(pps_until: list[tuple[float, int]]) -> dict[int, int]:
    """Arrival bins: `pps` packets per second until each time, one after the other."""
    out, at = {}, 0
    for until_s, pps in pps_until:
        while at < round(until_s / ARRIVAL_BIN_S):
            out[at] = round(pps * ARRIVAL_BIN_S)
            at += 1
    return out


def test_goodput_is_judged_while_the_senders_oversubscribe_the_link() -> None:
    """4 senders at 100 pkt/s into a 200 pkt/s link: oversubscribed until the second leaves (12 s); the
    link ran full until then and half full in the tail."""
    mine = records([10.0, 12.0, 14.0, 16.0], packets=1000)
    figures = incast_figures(run(4), job(), mine, bins([(12.0, 200), (16.0, 100)]))
    assert figures["oversubscribed_s"] == [0.0, 12.0]
    assert figures["bottleneck_goodput"] == pytest.approx(1.0)
    assert figures["span_goodput"] == pytest.approx(4000 / (16.01 * LINK_PPS), abs=1e-4)
    assert figures["loss_pct"] == 0.0


def test_idle_bins_inside_the_window_lower_the_goodput() -> None:
    """A link idle for 3 s of the 12 the incast oversubscribed it: 75 % busy — a controller that
    over-throttles cannot hide in the tail."""
    mine = records([10.0, 12.0, 14.0, 16.0], packets=1000)
    arrivals = bins([(6.0, 200), (9.0, 0), (12.0, 200), (16.0, 100)])
    assert incast_figures(run(4), job(), mine, arrivals)["bottleneck_goodput"] == pytest.approx(0.75)


def test_a_slow_nic_caps_what_a_sender_offers() -> None:
    """Unpaced senders offer their NIC's rate: 3 NICs at 80 pkt/s oversubscribe the link until one
    leaves (160 <= 200)."""
    mine = records([5.0, 8.0, 9.0], packets=500)
    figures = incast_figures(run(3, sender_bps=80 * FRAME * 8), job(rate_pps=None), mine, bins([(9.0, 200)]))
    assert figures["oversubscribed_s"] == [0.0, 5.0]


def test_an_incast_that_never_oversubscribes_has_no_bottleneck_figure() -> None:
    mine = records([10.0, 10.0], packets=1000)
    figures = incast_figures(run(2), job(), mine, bins([(10.0, 200)]))
    assert figures["oversubscribed_s"] is None and figures["bottleneck_goodput"] is None
    assert figures["span_goodput"] is not None


def test_a_window_shorter_than_a_second_is_not_judged() -> None:
    mine = records([0.5, 12.0, 12.0, 12.0], packets=100)
    arrivals = bins([(12.0, 200)])
    figures = incast_figures(run(4), job(rate_pps=60), mine, arrivals)
    assert figures["oversubscribed_s"] == [0.0, 0.5]
    assert figures["bottleneck_goodput"] is None
