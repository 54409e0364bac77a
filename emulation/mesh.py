"""All-pairs reachability in one process: raw Ethernet frames between every pair of emulated hosts.

Pinging all pairs costs N² processes and N² ARP entries — and the kernel's neighbour table holds 1,024
learned entries for all namespaces together, so a k=8 fat-tree (16,256 pairs) cannot be checked that way.
Our fabric forwards on the destination MAC (the DLID), so a frame addressed to a host's MAC exercises
exactly the controller's tables without ARP.  This module opens one AF_PACKET socket inside every host's
network namespace (setns on this thread, then back), sends a frame from every host to every other, and
reads them all with select; pairs that did not arrive are sent again (a userspace datapath under a burst
can drop), up to `rounds` times.  Frames carry a random run id, so stray traffic never counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import secrets
import selectors
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from traffic.fastpath import receive_buffer

ETH_TYPE_PROBE = 0x88B5  # IEEE "local experimental"
CLONE_NEWNET = 0x40000000
_MAGIC = b"FLMESH"
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Endpoint:
    name: str
    netns: str  # path of the namespace: /proc/<pid>/ns/net or /run/netns/<name>
    interface: str
    mac: int


def enter_netns(path: str) -> None:
    """This thread into the network namespace at `path` (a socket made here stays in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def visiting_namespaces() -> Iterator[None]:
    """Inside, `enter_netns` hops between namespaces (sockets made in one stay in it); on leaving, this
    thread is back in the namespace it started in, whatever happened."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        yield
    finally:
        if _libc.setns(home, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the original namespace failed")
        os.close(home)


def open_sockets(endpoints: Sequence[Endpoint]) -> list[socket.socket]:
    """One raw socket per endpoint, bound to its interface inside its namespace."""
    sockets: list[socket.socket] = []
    try:
        with visiting_namespaces():
            for ep in endpoints:
                enter_netns(ep.netns)
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_TYPE_PROBE))
                sock.bind((ep.interface, ETH_TYPE_PROBE))
                sock.setblocking(False)
                receive_buffer(sock, 4 << 20)
                sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


_PAIR = struct.Struct("!II")


def probe_frame(dst_mac: int, src_mac: int, run_id: bytes, s: int, d: int) -> bytes:
    """The minimum Ethernet frame a check sends from host index `s` to host index `d`."""
    header = struct.pack("!H", ETH_TYPE_PROBE) + _MAGIC + run_id
    body = dst_mac.to_bytes(6, "big") + src_mac.to_bytes(6, "big") + header + _PAIR.pack(s, d)
    return body + bytes(60 - len(body))


def probe_pair(data: bytes, run_id: bytes) -> tuple[int, int] | None:
    """(s, d) of a check's frame of this run, else None (stray traffic never counts)."""
    if len(data) >= 32 and data[14:20] == _MAGIC and data[20:24] == run_id:
        pair: tuple[int, int] = _PAIR.unpack_from(data, 24)
        return pair
    return None


def arrivals(selector: selectors.BaseSelector, timeout_s: float, run_id: bytes) -> Iterator[tuple[int, int]]:
    """(s, d) of every frame of this run waiting on `selector`'s sockets (each registered with its host's
    index as data) that reached the host it was sent to, waiting up to `timeout_s` for the first."""
    for key, _ in selector.select(timeout_s):
        sock, receiver = key.fileobj, key.data
        assert isinstance(sock, socket.socket)
        while True:
            try:
                data = sock.recv(128)
            except BlockingIOError:
                break
            pair = probe_pair(data, run_id)
            if pair is not None and pair[1] == receiver:
                yield pair


def first_round(n: int, burst: int) -> Iterator[tuple[int, int]]:
    """Every ordered pair of `n` hosts once, as (src, dst): shifts `k0 .. k0+burst-1` from each host in
    turn (a host's frames of one burst back to back), for k0 = 1, 1+burst, ..."""
    return (
        (s, (s + k) % n) for k0 in range(1, n, burst) for s in range(n) for k in range(k0, min(k0 + burst, n))
    )


def check_all_pairs(
    endpoints: Sequence[Endpoint],
    rounds: int = 4,
    wait_s: float = 1.0,
    pace_every: int = 256,
    window: int = 8192,
    budget_s: float | None = None,
    burst: int = 32,
) -> dict[tuple[str, str], bool]:
    """Which (src, dst) pairs delivered a frame addressed to dst's MAC.

    Missing pairs are sent again for `rounds` rounds, and after that for as long as a round still brings
    some in (within `budget_s`), each round waiting longer: an overloaded emulator delays frames by seconds
    and drops some, but a pair it keeps delivering nothing for is a broken path, not a busy machine.
    `budget_s` defaults to 30 s plus 1 s per 20,000 pairs (a k=16 fat-tree has 1,047,552).

    Frames go out in rounds of shifts (every host to the host `k` places on, for k = 1, 2, ...), so every
    socket and every link carries a little of each burst, and sockets are watched with epoll (select
    cannot watch descriptors above 1,023, and 1,024 hosts have more).  The first round takes `burst`
    shifts at a time, each host sending its `burst` frames back to back: ovs-vswitchd (userspace datapath)
    polls every port of its bridges each time it wakes and reads up to 32 frames per port and wake, so
    frames that arrive one port at a time cost it a full poll each.  At k=16 on 8 shards, bursts of 16
    took the check from 110 s to 74 s and ovs-vswitchd's CPU from 144 to 87 s (2026-12-04)."""
    if burst < 1:
        raise ValueError(f"burst {burst}: must be at least 1")
    run_id = secrets.token_bytes(4)
    sockets = open_sockets(endpoints)
    n = len(endpoints)
    if budget_s is None:
        budget_s = 30.0 + n * (n - 1) / 20000
    missing = {(s, d) for s in range(n) for d in range(n) if s != d}
    macs = [ep.mac for ep in endpoints]
    started = time.monotonic()
    selector = selectors.DefaultSelector()

    def drain(timeout_s: float) -> None:
        missing.difference_update(arrivals(selector, timeout_s, run_id))

    try:
        for i, sock in enumerate(sockets):
            selector.register(sock, selectors.EVENT_READ, i)
        progress = len(missing)
        for round_no in itertools.count():
            if not missing or time.monotonic() - started > budget_s or (round_no >= rounds and not progress):
                break
            before = len(missing)
            # Self-clocked: at most `window` frames in flight (sent, not yet seen arriving), so a slow
            # datapath is not flooded into dropping most of a round.
            if round_no == 0:  # every pair: shifts k0..k0+burst-1 from each host in turn
                order: Iterable[tuple[int, int]] = first_round(n, burst)
            else:
                order = sorted(missing, key=lambda p: ((p[1] - p[0]) % n, p[0]))
            for sent, (s, d) in enumerate(order, 1):
                frame = probe_frame(macs[d], macs[s], run_id, s, d)
                try:
                    sockets[s].send(frame)
                except BlockingIOError:
                    time.sleep(0.001)
                if sent % pace_every == 0:
                    drain(0)
                    stalled = time.monotonic() + wait_s
                    while sent - (before - len(missing)) > window and time.monotonic() < stalled:
                        drain(0.005)
            deadline = time.monotonic() + wait_s * min(2**round_no, 4)
            while missing and time.monotonic() < deadline:
                drain(max(0.0, deadline - time.monotonic()))
            progress = before - len(missing)
    finally:
        selector.close()
        for sock in sockets:
            sock.close()
    names = [ep.name for ep in endpoints]
    return {(names[s], names[d]): (s, d) not in missing for s in range(n) for d in range(n) if s != d}


__all__ = [
    "ETH_TYPE_PROBE",
    "Endpoint",
    "check_all_pairs",
    "first_round",
    "open_sockets",
    "probe_frame",
    "probe_pair",
]
