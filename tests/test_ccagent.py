"""The RoCE agent's DCQCN (`traffic.ccagent`), driven by a fake clock: QPs are spaced at their own rates,
a CNP cuts only the QP it names, CE-marked packets are answered at most once per interval per QP, and the
job's paced rate is a QP's highest."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from tests.emulation_support import require_emulation
from traffic.ccagent import CNP_DSCP, MAX_SAMPLES, CcAgent
from traffic.dcqcn import DcqcnParams
from traffic.fastpath import icrc_ok
from traffic.roce import Endpoints, cnp

FRAME = 1082
LINE_BPS = 3.5e6
P = DcqcnParams(line_rate_bps=25e9).scaled(LINE_BPS / 25e9)


def send_for(agent: CcAgent, qp: int, until_s: float, now: float = 0.0) -> tuple[int, float]:
    """Send on `qp` whenever the agent lets it until `until_s`; (packets, time)."""
    sent = 0
    while now < until_s:
        now = max(now, agent.next_send_s(qp))
        if now >= until_s:
            break
        agent.on_sent(qp, FRAME, now)
        sent += 1
    return sent, now


def test_a_qp_starts_at_line_rate_and_is_spaced_at_it() -> None:
    agent = CcAgent(P, {}, 0.0)
    sent, _ = send_for(agent, 7, 2.0)
    assert sent == pytest.approx(2.0 * LINE_BPS / 8 / FRAME, rel=0.02)


def test_the_jobs_paced_rate_is_the_highest() -> None:
    agent = CcAgent(P, {7: 100 * 8 * FRAME}, 0.0)
    sent, _ = send_for(agent, 7, 2.0)
    assert sent == pytest.approx(200, abs=2)


def test_a_cnp_cuts_the_named_qp_only() -> None:
    agent = CcAgent(P, {}, 0.0)
    agent.on_sent(1, FRAME, 0.0)
    agent.on_sent(2, FRAME, 0.0)
    agent.on_cnp(1, 0.01)
    assert agent.rps[1].rate_bps == pytest.approx(LINE_BPS / 2)  # alpha starts at 1: cut by half
    assert agent.rps[2].rate_bps == pytest.approx(LINE_BPS)
    before = agent.next_send_s(1)
    agent.on_sent(1, FRAME, before)
    assert agent.next_send_s(1) - before == pytest.approx(8 * FRAME / (LINE_BPS / 2))
    agent.on_cnp(99, 0.02)  # a QP this host never sent on
    report = agent.report(0.02)
    assert (report["cnps_received"], report["cnps_unknown_qp"], report["rate_cuts"]) == (2, 1, 1)
    assert report["qps"]["1"]["rates"][-1][1] == pytest.approx(LINE_BPS / 2)


def test_the_rate_recovers_without_cnps() -> None:
    agent = CcAgent(P, {}, 0.0)
    agent.on_sent(1, FRAME, 0.0)
    agent.on_cnp(1, 0.0)
    cut = agent.rps[1].rate_bps
    send_for(agent, 1, 6 * P.increase_period_s)
    assert cut < agent.rps[1].rate_bps <= LINE_BPS
    rates = [r for _, r in agent.report(6 * P.increase_period_s)["qps"]["1"]["rates"]]
    assert rates[0] == pytest.approx(LINE_BPS) and min(rates) == cut
    assert rates[1:] == sorted(rates[1:])  # cut, then only increases


def test_marked_packets_get_at_most_one_cnp_per_interval_per_qp() -> None:
    agent = CcAgent(P, {}, 0.0)
    step = P.cnp_interval_s / 10
    answered = [agent.on_data(5, True, k * step) for k in range(25)]
    assert answered.count(True) == 3 and answered[0] and answered[10] and answered[20]
    assert agent.on_data(6, True, 0.0)  # another QP has its own interval
    assert not agent.on_data(6, False, P.cnp_interval_s * 5)  # unmarked: never answered
    report = agent.report(1.0)
    assert (report["cnps_sent"], report["ce_received"], report["data_received"]) == (4, 26, 27)


def test_rate_samples_are_bounded() -> None:
    agent = CcAgent(P, {}, 0.0)
    agent.on_sent(1, FRAME, 0.0)
    for k in range(MAX_SAMPLES * 2):
        agent.on_cnp(1, k * 1e-3)
        agent.rps[1].rate_bps = LINE_BPS  # force a change every time
        agent.on_sent(1, FRAME, k * 1e-3 + 5e-4)
    assert len(agent.samples[1]) == MAX_SAMPLES


def test_the_agents_cnp_is_a_rocev2_bth_0x81_tshark_decodes(tmp_path: Path) -> None:
    """The CNP a receiver sends (`traffic.roce.cnp` with the agent's DSCP): tshark, an independent dissector,
    reads a RoCEv2 BTH with opcode 0x81 (129), the sender's QP, the P_Key and BECN, not ECN-capable, in
    CNP_DSCP.  (Wireshark 4.0's opcode table names 0x80 "CNP"; the RoCEv2 annex and NVIDIA NICs use 0x81.)"""
    if shutil.which("tshark") is None:
        require_emulation("tshark not installed (Debian: tshark; .ci/run installs it)")
    ep = Endpoints("02:00:00:00:00:10", "02:00:00:00:00:01", "10.0.0.16", "10.0.0.1", dqpn=0x123,
                   pkey=0xFFFF, dscp=CNP_DSCP, ecn=0)  # fmt: skip
    frame = bytes(cnp(ep))
    assert (frame[42], frame[47:50], frame[46] & 0x40, frame[15]) == (
        0x81,
        b"\x00\x01\x23",
        0x40,
        CNP_DSCP << 2,
    )
    assert icrc_ok(frame)
    pcap = tmp_path / "cnp.pcap"
    wrpcap(str(pcap), [Ether(frame)])
    fields = ["infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.p_key", "ip.dsfield.dscp",
              "ip.dsfield.ecn", "udp.dstport"]  # fmt: skip
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", *(a for f in fields for a in ("-e", f))],
                         capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert out == ["129", "0x000123", "65535", str(CNP_DSCP), "0", "4791"]
