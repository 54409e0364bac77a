"""Probe flows start and stop when the run says, not when their processes happen to start.

On loopback, real processes and sockets: a sender started with `--wait-go` sends nothing before the time
it is given, and a receiver started with `--wait-end` keeps receiving until the time it is given — even when
the receiver was started long before the flow — a receiver timed from its own start is what made
`emulate calibrate` read late-starting senders as loss.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from emulation.probe import release

PROBE = [sys.executable, "-m", "emulation.probe"]
PIPES = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", f"probe said {line!r}: {proc.stderr.read() if proc.stderr else ''}"


def test_a_flow_starts_at_the_time_given_and_the_receiver_waits_for_it() -> None:
    port, rate_pps, duration_s = 47311, 200, 0.5
    # 30 s is only the receiver's cap: it stops at the end time the run gives it
    receiver = subprocess.Popen([*PROBE, "recv", str(port), "30", "0.1", "--wait-end"], **PIPES)  # type: ignore[call-overload]
    sender = subprocess.Popen(  # type: ignore[call-overload]
        [*PROBE, "send", "127.0.0.1", str(port), str(rate_pps), str(duration_s), "64", "--wait-go"], **PIPES
    )
    try:
        _ready(receiver)
        _ready(sender)
        start_at = time.time() + 0.8
        end_at = start_at + duration_s + 0.5
        release([receiver], end_at)
        release([sender], start_at)
        sent = json.loads(sender.communicate(timeout=30)[0])
        got = json.loads(receiver.communicate(timeout=30)[0])
        stopped = time.time()
    finally:
        for proc in (sender, receiver):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert abs(sent["start"] - start_at) < 0.05, "the sender did not wait for its start time"
    assert got["first"] >= start_at - 0.01, "a packet arrived before the start time"
    assert sent["sent"] == rate_pps * duration_s
    assert got["received"] == sent["sent"], f"lost {sent['sent'] - got['received']} on loopback"
    assert end_at - 0.05 <= stopped < end_at + 2.0, "the receiver did not stop at the end time it was given"


def test_without_an_end_time_the_receiver_stops_at_its_own_duration() -> None:
    """The cap still holds: a run that never says when to stop does not leave receivers behind."""
    receiver = subprocess.Popen([*PROBE, "recv", "47312", "0.5", "0.1", "--wait-end"], **PIPES)  # type: ignore[call-overload]
    try:
        _ready(receiver)
        started = time.monotonic()
        out = receiver.communicate(timeout=30)[0]  # closes stdin without a time
        assert time.monotonic() - started < 5
        assert json.loads(out)["received"] == 0
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def test_a_probe_told_no_time_or_given_bad_arguments_says_so_in_one_line() -> None:
    told_nothing = subprocess.run(
        [*PROBE, "send", "127.0.0.1", "47312", "100", "0.1", "64", "--wait-go"],
        check=False, input="", capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert told_nothing.returncode == 2 and "Traceback" not in told_nothing.stderr
    assert "wall-clock time" in told_nothing.stderr and told_nothing.stdout.strip() == "ready"
    bad_rate = subprocess.run([*PROBE, "send", "127.0.0.1", "47312", "fast", "0.1"], check=False,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    assert bad_rate.returncode == 2 and "Traceback" not in bad_rate.stderr and "fast" in bad_rate.stderr
    missing = subprocess.run([*PROBE, "send", "127.0.0.1"], check=False, capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
