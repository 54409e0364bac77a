"""`cc:`, `dcqcn:` and the `roce-incast` kind in scenario files: what loads, what is refused (file, line and
field named), and what both instruments are given (the incast's messages, the scaled DCQCN parameters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from labspec import workplan
from labspec.ccspec import DcqcnError, DcqcnSpec, dcqcn_params
from labspec.scenario import ScenarioError, load_scenario
from tests.conftest import ROOT
from topologies.errors import InputError
from traffic.dcqcn import DcqcnParams

TOPO = (ROOT / "topologies" / "fat-tree-k4.yaml").as_posix()
INCAST_FILE = str(ROOT / "scenarios" / "incast-k4.yaml")
INCAST = "{kind: roce-incast, senders: h1..h8, receiver: h16, size: 64KiB, rate_pps: 100}"


def scenario_text(extra: str = "", item: str = INCAST) -> str:
    return (f"fabriclab: 1\nname: t\ntopology: {TOPO}\nscale: 400G=200M\nduration_s: 5\n{extra}"
            f"traffic:\n  - {item}\n")  # fmt: skip


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario(path)


def test_default_is_no_congestion_control(tmp_path: Path) -> None:
    scenario = load(tmp_path, scenario_text())
    assert scenario.spec.cc == "none"
    assert scenario.dcqcn(400) is None


def test_dcqcn_defaults_are_the_published_ones_scaled(tmp_path: Path) -> None:
    scenario = load(tmp_path, scenario_text("cc: dcqcn\n"))
    p = scenario.dcqcn(400)
    assert p == DcqcnParams(line_rate_bps=400e9).scaled(200e6 / 400e9)
    assert p is not None and p.line_rate_bps == pytest.approx(200e6)
    assert p.increase_period_s == pytest.approx(55e-6 * 2000)  # 1/2000 of the speed: 2000x the time
    assert (p.kmin_bytes, p.kmax_bytes, p.byte_counter_bytes) == (5 * 1024, 200 * 1024, 10 << 20)


def test_overrides_are_in_the_units_their_names_say(tmp_path: Path) -> None:
    text = scenario_text("cc: dcqcn\ndcqcn: {kmin_bytes: 10000, ai_rate_mbps: 80, cnp_interval_us: 4}\n")
    p = load(tmp_path, text).dcqcn(400)
    assert p is not None
    assert p.kmin_bytes == 10000
    assert p.ai_rate_bps == pytest.approx(80e6 / 2000)
    assert p.cnp_interval_s == pytest.approx(4e-6 * 2000)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("cc: dctcp\n", "s.yaml:6: cc:"),
        ("dcqcn: {pmax: 2}\n", "dcqcn.pmax:"),  # checked under cc: none too (--cc dcqcn would use it)
        ("cc: dcqcn\ndcqcn: {kmin_bytes: 300000}\n", "dcqcn.kmax_bytes: kmax_bytes must be above kmin_bytes"),
        ("cc: dcqcn\ndcqcn: {pmax: 2}\n", "dcqcn.pmax:"),
        ("cc: dcqcn\ndcqcn: {kmin: 3}\n", "dcqcn.kmin: unknown key 'kmin'"),
        ("cc: dcqcn\ndcqcn: {min_rate_mbps: 900000}\n", "dcqcn.min_rate_mbps: min_rate_mbps must be above 0"),
        ("cc: dcqcn\ndcqcn: {hai_rate_mbps: 1, ai_rate_mbps: 5}\n", "dcqcn.hai_rate_mbps:"),
    ],
)
def test_bad_congestion_control_names_the_field(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        load(tmp_path, scenario_text(extra))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("{kind: roce-incast, senders: h1..h8, receiver: h99, size: 1KiB}", "receiver: unknown host"),
        ("{kind: roce-incast, senders: h1..h8, receiver: h8, size: 1KiB}", "receiver: 'h8' is also"),
        ("{kind: roce-incast, senders: h1..h99, receiver: h16, size: 1KiB}", "traffic[0].senders:"),
        ("{kind: roce-incast, senders: 'h1,h1', receiver: h16, size: 1KiB}", "senders: 'h1' is listed"),
        ("{kind: roce-incast, senders: h1..h2, receiver: h16, size: 0}", "traffic[0].size:"),
        ("{kind: roce-incast, senders: h1..h2, receiver: h16, size: 1KiB, mtu: 9000}", "traffic[0].mtu:"),
        ("{kind: roce-incast, senders: h1..h2, receiver: h16, size: 1KiB, ranks: 3}", "unknown key 'ranks'"),
    ],
)
def test_bad_incasts_name_the_field(tmp_path: Path, item: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        load(tmp_path, scenario_text(item=item))
    assert message in str(info.value)


def test_an_incast_is_one_message_per_sender_on_its_own_qp(tmp_path: Path) -> None:
    scenario = load(tmp_path, scenario_text(item=INCAST.replace("}", ", start_s: 0.5}")))
    (job,) = workplan.jobs(scenario)
    assert (job.kind, job.schedule, job.rate_pps, job.mtu) == ("roce-incast", "posted", 100.0, 1024)
    messages = workplan.messages(scenario)
    assert [m.src for m in messages] == [f"h{i}" for i in range(1, 9)]
    assert {m.dst for m in messages} == {"h16"}
    assert len({m.qp for m in messages}) == 8
    assert all((m.post_s, m.payload_bytes, m.packets, m.psn) == (0.5, 65536, 64, 0) for m in messages)


def test_with_cc_switches_and_overrides_apply_whenever_it_is_dcqcn(tmp_path: Path) -> None:
    scenario = load(tmp_path, scenario_text("cc: dcqcn\ndcqcn: {pmax: 0.2}\n"))
    assert scenario.with_cc("none").dcqcn(400) is None
    unused = load(tmp_path, scenario_text("dcqcn: {pmax: 0.3}\n"))  # cc: none: kept for --cc dcqcn
    assert unused.dcqcn(400) is None
    turned_on = unused.with_cc("dcqcn").dcqcn(400)
    assert turned_on is not None and turned_on.pmax == 0.3
    back = scenario.with_cc("dcqcn").dcqcn(400)
    assert back is not None and back.pmax == 0.2
    with pytest.raises(ScenarioError, match="unknown congestion control 'reno'"):
        scenario.with_cc("reno")


def test_dcqcn_errors_name_the_spec_field() -> None:
    with pytest.raises(DcqcnError) as info:
        dcqcn_params(DcqcnSpec(g=1.0, alpha_period_us=0.0001, kmin_bytes=9, kmax_bytes=9), 100, 1.0)
    assert info.value.field == "kmax_bytes"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["emulate", "up", TOPO, "--no-cli", "--cc", "dcqcn"], "--cc dcqcn: needs --scale"),
        (["emulate", "up", TOPO, "--no-cli", "--cc", "reno"], "argument --cc: invalid choice: 'reno'"),
        (["compare", INCAST_FILE, "--cc", "dctcp"], "--cc: invalid choice"),
        (
            ["scenario", "run", INCAST_FILE, "--cc", "x"],
            "--cc: invalid choice",
        ),
    ],
)
def test_bad_cc_options_exit_2_naming_the_option(argv: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fabriclab", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
