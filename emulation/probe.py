"""Sequence-numbered UDP probe flows, run inside emulated hosts (`python -m emulation.probe ...`).

    probe send DST_IP PORT RATE_PPS DURATION_S [SIZE_BYTES] [--sport N | --spray OFFSET] [--dscp N]
               [--wait-go]
    probe recv PORT DURATION_S [BUCKET_S] [--wait-end]        # prints the receiver's record (JSON)

`--wait-go` (sender) and `--wait-end` (receiver) take their times from the run: the sender prints `ready`
once its socket is open and waits for a line on stdin with the wall-clock time (seconds since the epoch)
to start sending at; the receiver, once `ready`, stops at the time a line on stdin gives (DURATION_S is
then only a cap).  Without them a flow starts when its process does and a receiver stops DURATION_S after
its own start — and on a loaded 2-core machine sixteen Python processes take seconds to start one after
another: `emulate calibrate` read the senders that started last as loss (4.8 s of skew at 1,000 pkt/s per
host; a k=4 "capacity" of 9.4 pkt/s per host).  `release` writes those lines.

`--sport N` sends from a fixed source port (a flow's entropy, chosen by the run so that hash placement is
the same every time); `--spray OFFSET` gives every packet another source port (`traffic.entropy`), as a
RoCE NIC spraying over multipath does.  Both write the UDP header themselves on a raw IP socket (the kernel
adds the IP header; checksum 0, which IPv4 allows), so any port is possible without a socket per port.
`--dscp N` marks every packet's traffic class (IP TOS = N << 2): QoS classifies by it (`emulation.qosqueues`).
The receiver counts packets that arrive behind a later one (`out_of_order`) and how far behind the
furthest was (`reorder_max`): spraying reorders, and RoCE pays for it.  A late packet is not a lost one:
the gaps it seemed to open are closed again when it arrives (`net_gaps`) — a path that changes under a
flow (a restore, an adaptive move) reorders the packets in flight, and counting them as lost made a
lossless make-before-break look lossy.

The receiver is the truth about loss: OVS's userspace datapath can drop without counting it in port
statistics.  It reports arrivals per time bucket (throughput over time) and every gap in the sequence with
the wall-clock times around it (loss windows, to line up with faults).  An arrival's time is the kernel's
(`SO_TIMESTAMPNS`: when the packet reached the host's socket), not when the receiver got round to reading
it: on a loaded machine a descheduled receiver reads a backlog at once, which put a bottleneck's 150
pkt/s down as 174 and added the receiver's own wait to every one-way delay.  The sender sleeps until the next
packet is due (at least ~0.5 ms) and sends what is due: exact rate on average, a few packets per burst, and
no core burnt busy-waiting (on a 2-core machine busy-waiting senders starve ovs-vswitchd's forwarding
thread and cause the loss they are meant to measure).

Both ends move many datagrams per system call (`emulation.mmsg`) and the receiver reads what arrived every
millisecond instead of waking for each packet; the flow logic is `emulation.flows`, shared with the fleet
(`emulation.fleet`) that sends and receives every flow of a calibration step or a scenario run from two
processes.  This command remains for a single flow by hand and for the benchmarks' own probes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from emulation import flows, mmsg

#: How long after the last probe is ready a run starts its clock (`release`): time to write every line.
START_MARGIN_S = 0.25

_HEADER = flows.HEADER  # sequence number, send time
RECV_BATCH = flows.RECV_BATCH


def send(
    dst: str,
    port: int,
    rate_pps: float,
    duration_s: float,
    size: int = 64,
    sport: int | None = None,
    spray: int | None = None,
    dscp: int = 0,
    go: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """`go`: called once the socket is open, returns the wall-clock time to start at (`--wait-go`).
    `size` is the UDP payload.  With `sport` or `spray` (an offset into the spray sequence) the UDP header
    is ours: a fixed source port, or another one for every packet."""
    sock = flows.sender_socket(dst, port, sport is not None or spray is not None, dscp)
    sender = flows.FlowSender(sock, dst, port, rate_pps, size, sport, spray, dscp=dscp)
    flows.run_senders([sender], duration_s, go() if go is not None else None)
    return sender.result()


def receive(
    port: int,
    duration_s: float,
    bucket_s: float = 0.1,
    ready: Any = None,
    end_at: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """`end_at` (`--wait-end`): blocks until the run says when to stop (a wall-clock time); it is called on
    a thread of its own while packets are received, and `duration_s` caps the wait."""
    sock, stamped = flows.receiver_socket(port)
    if ready is not None:
        ready()
    deadline = [time.monotonic() + duration_s]
    if end_at is not None:
        cap = deadline[0]

        def told() -> None:
            with contextlib.suppress(ValueError, OSError):
                at = end_at()
                deadline[0] = min(cap, time.monotonic() + (at - time.time()))

        threading.Thread(target=told, name="end-at", daemon=True).start()
    batch = mmsg.Batch(sock, flows.RECV_BATCH, flows.RECV_SLOT_BYTES, control=stamped)
    record = flows.FlowRecord(bucket_s)
    while time.monotonic() < deadline[0]:
        if record.read(batch) == 0:  # drained: sleep a tick rather than wake for every packet
            time.sleep(flows.POLL_S)
    return record.result()


def _told_time(announce: str | None) -> Callable[[], float]:
    """Print `announce` (if any), then read a wall-clock time from stdin (ValueError if there is none)."""

    def read() -> float:
        if announce is not None:
            print(announce, flush=True)
        line = sys.stdin.readline()
        try:
            return float(line)
        except ValueError:
            got = repr(line)[:40]
            raise ProbeUsage(f"expected a wall-clock time (epoch seconds) on stdin, got {got}") from None

    return read


class ProbeUsage(ValueError):
    """Bad arguments or input: said on stderr with exit status 2, not as a traceback."""


def release(procs: Iterable[subprocess.Popen[str]], at: float) -> None:
    """Tell probes started with `--wait-go` when to start, or with `--wait-end` when to stop."""
    for proc in procs:
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):  # a probe that died reports its own error
                proc.stdin.write(f"{at!r}\n")
                proc.stdin.flush()


def main(argv: list[str]) -> int:
    if argv[0] == "send":
        sport = spray = None
        dscp = 0
        if "--dscp" in argv:
            dscp = int(argv.pop(argv.index("--dscp") + 1))
            argv.remove("--dscp")
        if "--sport" in argv:
            sport = int(argv.pop(argv.index("--sport") + 1))
            argv.remove("--sport")
        if "--spray" in argv:
            spray = int(argv.pop(argv.index("--spray") + 1))
            argv.remove("--spray")
        go = None
        if "--wait-go" in argv:
            argv.remove("--wait-go")
            go = _told_time("ready")
        size = int(argv[5]) if len(argv) > 5 else 64
        result = send(argv[1], int(argv[2]), float(argv[3]), float(argv[4]), size, sport, spray, dscp, go)
        print(json.dumps(result), flush=True)
    elif argv[0] == "recv":
        end_at = None
        if "--wait-end" in argv:
            argv.remove("--wait-end")
            end_at = _told_time(None)
        bucket = float(argv[3]) if len(argv) > 3 else 0.1
        result = receive(
            int(argv[1]), float(argv[2]), bucket, ready=lambda: print("ready", flush=True), end_at=end_at
        )
        print(json.dumps(result), flush=True)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


def run(argv: list[str]) -> int:
    """`main`, with bad arguments or input reported in one line (exit 2) instead of a traceback."""
    try:
        return main(argv)
    except (ProbeUsage, IndexError) as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a number that does not parse
        print(f"probe: bad argument: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
