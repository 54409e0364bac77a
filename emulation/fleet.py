"""Every probe flow of a calibration step or a scenario run from two processes, not two per flow
(`python -m emulation.fleet`).

Why: a step of the k=16 fat-tree has 1,024 flows.  As a sender and a receiver process per flow that is
2,048 Python processes to start per step (~0.3 CPU-seconds each, five minutes of both cores before a
packet moves) and ~30 MB each; and on k=4 the 32 processes woke 32 times as often as one loop.  A socket
keeps the network namespace it was made in, so one process enters each host's namespace in turn, makes
that host's socket there and comes back; then it forks: the child runs every sender (`flows.run_senders`),
the parent every receiver (epoll over the sockets, each drained a batch at a time into its
`flows.FlowRecord`).  Each flow's packets, schedule and accounting are those of `emulation.probe`.

A scenario run sends its UDP flows the same way: each flow may carry its own rate, size, entropy (`sport`
or `spray`), `dscp` and window (`start_s`, `duration_s` after the start); the spec's values are the
defaults.  Sixteen sender processes of a k=4 scenario fell ~90 ms behind their schedules at 420 pkt/s
each on this 2-core machine, where one fleet keeps up.

Protocol (stdin/stdout, one JSON or number per line):
  -> {"flows": [{"src_netns": PATH, "dst_netns": PATH, "dst": IP, "port": N, [rate_pps, size, sport,
      spray, dscp, start_s, duration_s, neighbour (MAC), src_intf]}, ...], "rate_pps": R, "seconds": S,
      "size": BYTES, "bucket_s": B, "grace_s": G}
  A side whose namespace is null (or absent) is not opened here: across machines each machine's fleet
  holds the sides of its own hosts, and reports None for the others.  `neighbour`: a fixed neighbour
  entry for `dst` in the source (`pin_neighbour`).
  <- ready                       (every socket open)
  -> START                       (wall-clock time to start sending at)
  <- {"senders": [...], "receivers": [...]}   (probe's records, in the order of the flows)
Receivers stop at START + S + G.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from emulation import flows, mmsg
from emulation.mesh import Endpoint, enter_netns, visiting_namespaces
from emulation.priority import prioritise_pid


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def open_sockets(
    spec: dict[str, Any],
) -> tuple[list[socket.socket | None], list[flows.FlowSender | None]]:
    """Each flow's receiving socket in its destination's namespace and sending one in its source's; None
    for a side whose namespace the flow does not give (that host is on another machine)."""
    receivers: list[socket.socket | None] = []
    senders: list[flows.FlowSender | None] = []
    with visiting_namespaces():
        for flow in spec["flows"]:
            port = int(flow["port"])
            sport, spray = _optional_int(flow.get("sport")), _optional_int(flow.get("spray"))
            dscp = int(flow.get("dscp") or 0)
            duration = flow.get("duration_s")
            receivers.append(None)
            if flow.get("dst_netns"):
                enter_netns(flow["dst_netns"])
                receivers[-1] = flows.receiver_socket(port)[0]
            if not flow.get("src_netns"):
                senders.append(None)
                continue
            enter_netns(flow["src_netns"])
            if flow.get("neighbour"):
                pin_neighbour(flow["dst"], flow["neighbour"], flow["src_intf"])
            out = flows.sender_socket(flow["dst"], port, sport is not None or spray is not None, dscp)
            sender = flows.FlowSender(
                out, flow["dst"], port, float(flow.get("rate_pps", spec.get("rate_pps", 0))),
                int(flow.get("size", spec.get("size", 64))), sport, spray, float(flow.get("start_s", 0.0)),
                None if duration is None else float(duration), dscp,
            )  # fmt: skip
            senders.append(sender)
    return receivers, senders


def place_sides(flows: list[dict[str, Any]], endpoints: Iterable[Endpoint]) -> list[dict[str, Any]]:
    """`flows` (each naming `src_host` and `dst_host`) with the sides held by `endpoints` filled in:
    `src_netns` and `src_intf` where the source is among them, `dst_netns` where the destination is, None
    for a side elsewhere (another machine's fleet holds it)."""
    ends = {ep.name: ep for ep in endpoints}
    placed = []
    for flow in flows:
        src, dst = ends.get(flow["src_host"]), ends.get(flow["dst_host"])
        placed.append({**flow, "src_netns": src.netns if src else None,
                       "src_intf": src.interface if src else None,
                       "dst_netns": dst.netns if dst else None})  # fmt: skip
    return placed


def pin_neighbour(ip: str, mac: str, intf: str) -> None:
    """A permanent neighbour entry `ip` -> `mac` on `intf` in this thread's namespace (the child `ip`
    inherits it): for a flow its partitions deny, whose destination no ARP answer will name."""
    done = subprocess.run(["ip", "neigh", "replace", ip, "lladdr", mac, "dev", intf, "nud", "permanent"],
                          capture_output=True, text=True, check=False, timeout=10)  # fmt: skip
    if done.returncode != 0:
        raise OSError(f"neighbour {ip} -> {mac} on {intf}: {done.stderr.strip()}")


def receive_all(socks: list[socket.socket], bucket_s: float, end_wall: float) -> list[dict[str, Any]]:
    """Drain every socket as packets arrive until `end_wall` (wall clock): each one's record."""
    records = [flows.FlowRecord(bucket_s) for _ in socks]
    if not socks:  # every destination on another machine: only the senders run here
        time.sleep(max(0.0, end_wall - time.time()))
        return []
    index = {sock.fileno(): i for i, sock in enumerate(socks)}
    batch = mmsg.Batch(socks[0], flows.RECV_BATCH, flows.RECV_SLOT_BYTES, control=True)
    poller = select.epoll()
    with poller:
        for fd in index:
            poller.register(fd, select.EPOLLIN)
        while time.time() < end_wall:
            ready = poller.poll(0)
            if not ready:
                time.sleep(flows.POLL_S)  # a tick, not a wake-up per packet: the kernel stamps each arrival
                continue
            for fd, _ in ready:
                while records[index[fd]].read(batch, fd) == batch.slots:  # a full batch: more may wait
                    pass
    return [r.result() for r in records]


def run(spec: dict[str, Any], start_at: float, receivers: list[socket.socket | None],
        senders: list[flows.FlowSender | None]) -> dict[str, Any]:  # fmt: skip
    """Senders in a child process, receivers here; both records, in the order of the flows (None for a
    side that is not here)."""
    got = _run(spec, start_at, [r for r in receivers if r is not None], [s for s in senders if s is not None])
    return {side: _spread(records, ours)
            for side, records, ours in (("senders", got["senders"], senders),
                                        ("receivers", got["receivers"], receivers))}  # fmt: skip


def _spread(records: list[Any], slots: list[Any]) -> list[Any]:
    """`records` (one per slot that is not None, in order) placed at their slots; None elsewhere."""
    it = iter(records)
    return [None if slot is None else next(it) for slot in slots]


def _run(spec: dict[str, Any], start_at: float, receivers: list[socket.socket],
         senders: list[flows.FlowSender]) -> dict[str, Any]:  # fmt: skip
    seconds = float(spec["seconds"])
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the senders
        code = 1
        try:
            os.close(rfd)
            flows.run_senders(senders, seconds, start_at)
            data = json.dumps([s.result() for s in senders]).encode()
            with os.fdopen(wfd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    try:
        got = receive_all(receivers, float(spec.get("bucket_s", 0.1)),
                          start_at + seconds + float(spec.get("grace_s", 1.0)))  # fmt: skip
        with os.fdopen(rfd, "rb") as pipe:
            sent = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not sent:
        raise RuntimeError(f"the sending process failed (exit status {os.waitstatus_to_exitcode(status)})")
    return {"senders": json.loads(sent), "receivers": got}


def launch(spec: dict[str, Any]) -> subprocess.Popen[str]:
    """A fleet process for `spec`, returned once every socket is open (RuntimeError with its words if
    not; the process is gone then).  It runs in a session of its own at the emulator's priority, as the
    per-flow probes did (`emulation.priority`): one stalled sender process delays every flow at once, and
    at a scenario's rates a 20 ms stall is a backlog that fills a modelled buffer.  If this process dies
    the fleet reads EOF instead of its start time and exits."""
    proc = subprocess.Popen([sys.executable, "-m", "emulation.fleet"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    prioritise_pid(proc.pid)  # its session leads itself: the session's weight too
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(
                f"the probe fleet did not start: {proc.communicate(timeout=30)[1].strip()[-300:]}"
            )
    except BaseException:
        stop(proc)
        raise
    return proc


def go(proc: subprocess.Popen[str], start_at: float) -> None:
    """Tell a launched fleet the wall-clock time to start sending at."""
    assert proc.stdin is not None
    proc.stdin.write(f"{start_at!r}\n")
    proc.stdin.flush()


def collect(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The records of a fleet told to `go`: {"senders": [...], "receivers": [...]} in the order of the
    flows (RuntimeError with its words if it failed)."""
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the probe fleet failed: {err.strip()[-300:]}")
    result: dict[str, Any] = json.loads(out)
    return result


def stop(proc: subprocess.Popen[str]) -> None:
    """A fleet still running (a run that ended early) is killed and reaped."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)


class LocalFleet:
    """A launched fleet on this machine, told to `go` and `collect`ed as a run across machines does its
    machines' fleets (`emulation.cluster.ClusterFleet`)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def go(self, start_at: float) -> None:
        go(self.proc, start_at)

    def collect(self, timeout_s: float) -> dict[str, Any]:
        return collect(self.proc, timeout_s)


@contextlib.contextmanager
def local(spec: dict[str, Any]) -> Iterator[LocalFleet | None]:
    """`running`, as a `LocalFleet`."""
    with running(spec) as proc:
        yield LocalFleet(proc) if proc is not None else None


@contextlib.contextmanager
def running(spec: dict[str, Any]) -> Iterator[subprocess.Popen[str] | None]:
    """A launched fleet for `spec` (None if it has no flows), stopped on the way out whatever happened."""
    proc = launch(spec) if spec.get("flows") else None
    try:
        yield proc
    finally:
        if proc is not None:
            stop(proc)


def main() -> int:
    try:
        spec = json.loads(sys.stdin.readline())
        if not spec.get("flows"):
            raise ValueError("no flows")
        receivers, senders = open_sockets(spec)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        print(f"fleet: bad specification or sockets: {exc}", file=sys.stderr)
        return 2
    print("ready", flush=True)
    line = sys.stdin.readline()
    try:
        start_at = float(line)
    except ValueError:
        print(f"fleet: expected a start time (epoch seconds) on stdin, got {line[:40]!r}", file=sys.stderr)
        return 2
    result = run(spec, start_at, receivers, senders)
    print(json.dumps(result), flush=True)
    for sock in receivers:
        if sock is not None:
            sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
