"""The phantom-queue ECN marker (emulation.ecnmark) on real veths, namespaces, HTB and UDP traffic.

Each test builds its own link: a veth whose root end (`em<pid><n>a`, shaped by HTB to 2 Mbit/s) carries the
marker, and whose other end lives in a namespace of its own, where an AF_PACKET socket captures what arrives.
UDP senders in this namespace set ECT(0) (TOS 0x02) or Not-ECT (TOS 0) per socket; a burst far above the
link rate congests it, paced sending below the rate does not.  What was captured is checked against the
marker's counters, and checksums with scapy's own dissector.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from emulation.ecnmark import PIN_ROOT, EcnMarker, EcnMarkError, ecn_marking_available, pinned_stats
from tests.emulation_support import require_emulation

RATE_BPS = 2_000_000
NOT_ECT, ECT0, CE = 0, 2, 3
PORT_ECT, PORT_PLAIN = 40001, 40002
PAYLOAD = 1000
FRAME = PAYLOAD + 8 + 20 + 14
KMIN, KMAX, PMAX = 8_000, 40_000, 0.5
ETH_P_ALL, PACKET_OUTGOING, SO_RCVBUFFORCE, SO_TIMESTAMPNS = 0x0003, 4, 33, 35
_serial = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def _require() -> None:
    if os.geteuid() != 0:
        require_emulation("the ECN marker needs root (bpf(2), tc, namespaces)")
    require_emulation(ecn_marking_available())


def _sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr.strip()}"
    return proc.stdout


def _in_netns(ns: str, fn: Callable[[], T]) -> T:
    """fn() run on a thread inside namespace `ns` (sockets it creates stay there); this thread never moves."""
    out: list[T] = []
    err: list[BaseException] = []

    def body() -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if _libc.setns(target, 0x40000000) != 0:
                raise OSError(ctypes.get_errno(), f"setns {ns}")
            try:
                out.append(fn())
            finally:
                if _libc.setns(home, 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), "setns back")
        except BaseException as exc:
            err.append(exc)
        finally:
            os.close(home)
            os.close(target)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if err:
        raise err[0]
    return out[0]


@dataclass
class Link:
    ns: str
    root: str
    peer: str
    root_ip: str
    peer_ip: str
    root_mac: str = ""
    extra: list[str] = field(default_factory=list)  # more devices of ours, deleted at the end


def _mac(dev: str, ns: str | None = None) -> str:
    args = ["ip", *(["-n", ns] if ns else []), "-j", "link", "show", dev]
    return str(json.loads(_sh(*args))[0]["address"])


@contextmanager
def veth_link(shape: bool = True) -> Iterator[Link]:
    """A veth from this namespace into a new one, addressed /30, static neighbours, root end TX checksum
    offload off (real UDP checksums to verify) and, if `shape`, HTB at RATE_BPS on the root end."""
    n = next(_serial)
    base = f"em{os.getpid()}{n}"
    net, host = f"198.18.{os.getpid() % 250}.", 4 * (n % 60)
    link = Link(base, f"{base}a", f"{base}b", f"{net}{host + 1}", f"{net}{host + 2}")
    try:
        _sh("ip", "netns", "add", link.ns)
        _sh("ip", "link", "add", link.root, "type", "veth", "peer", "name", link.peer, "netns", link.ns)
        for ns_args, dev, ip in (([], link.root, link.root_ip), (["-n", link.ns], link.peer, link.peer_ip)):
            _sh("ip", *ns_args, "link", "set", dev, "addrgenmode", "none")
            _sh("ip", *ns_args, "addr", "add", f"{ip}/30", "dev", dev)
            _sh("ip", *ns_args, "link", "set", dev, "up")
        _sh("ethtool", "-K", link.root, "tx", "off")
        link.root_mac = _mac(link.root)
        peer_mac = _mac(link.peer, link.ns)
        _sh("ip", "neigh", "replace", link.peer_ip, "lladdr", peer_mac, "dev", link.root, "nud", "permanent")
        _sh("ip", "-n", link.ns, "neigh", "replace", link.root_ip, "lladdr", link.root_mac, "dev", link.peer,
            "nud", "permanent")  # fmt: skip
        if shape:
            _htb(link.root)
        yield link
    finally:
        for dev in [*link.extra, link.root]:
            subprocess.run(["ip", "link", "del", dev], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", link.ns], capture_output=True, check=False)


def _htb(dev: str) -> None:
    _sh("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    _sh("tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", f"{RATE_BPS}bit",
        "ceil", f"{RATE_BPS}bit", "burst", "2k")  # fmt: skip


class Capture:
    """An AF_PACKET socket on the namespace end (plus UDP sockets there, so no ICMP answers come back)."""

    def __init__(self, link: Link) -> None:
        def make() -> tuple[socket.socket, list[socket.socket]]:
            raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            raw.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
            raw.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            raw.bind((link.peer, 0))
            sinks = []
            for port in (PORT_ECT, PORT_PLAIN):
                sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sink.bind((link.peer_ip, port))
                sinks.append(sink)
            return raw, sinks

        self.raw, self.sinks = _in_netns(link.ns, make)

    def frames(self, quiet: float = 0.4, limit: float = 8.0) -> list[tuple[float, bytes]]:
        """(receive time, frame) of every incoming frame until none arrived for `quiet` seconds."""
        out: list[tuple[float, bytes]] = []
        deadline = time.monotonic() + limit
        self.raw.settimeout(quiet)
        while time.monotonic() < deadline:
            try:
                data, anc, _flags, addr = self.raw.recvmsg(65536, socket.CMSG_SPACE(16))
            except TimeoutError:
                break
            if addr[2] == PACKET_OUTGOING:
                continue
            stamp = time.monotonic()
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", value[:16])
                    stamp = sec + nsec / 1e9
            out.append((stamp, data))
        return out

    def close(self) -> None:
        for s in (self.raw, *self.sinks):
            s.close()


def _sender(link: Link, tos: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    s.bind((link.root_ip, 0))
    s.setblocking(False)
    return s


def blast(
    link: Link, seconds: float, tos_list: tuple[int, ...] = (ECT0, NOT_ECT), count: int | None = None
) -> dict[int, int]:
    """Send as fast as the sockets accept (far above the link rate) for `seconds` (or `count` packets per
    socket), alternating one socket per TOS (ECT to PORT_ECT, others to PORT_PLAIN); a sequence number in each
    payload.  Returns how many were sent per TOS."""
    socks = {tos: _sender(link, tos) for tos in tos_list}
    sent = dict.fromkeys(tos_list, 0)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and (count is None or min(sent.values()) < count):
            progress = False
            for tos, s in socks.items():
                payload = struct.pack("!I", sent[tos]).ljust(PAYLOAD, b"x")
                try:
                    s.sendto(payload, (link.peer_ip, PORT_ECT if tos else PORT_PLAIN))
                except (BlockingIOError, OSError):
                    continue
                sent[tos] += 1
                progress = True
            if not progress:
                time.sleep(0.0005)
    finally:
        for s in socks.values():
            s.close()
    return sent


def _ip_frames(frames: list[tuple[float, bytes]], port: int) -> list[tuple[float, Any]]:
    from scapy.layers.inet import UDP
    from scapy.layers.l2 import Ether

    out = []
    for stamp, data in frames:
        pkt = Ether(data)
        if UDP in pkt and pkt[UDP].dport == port:
            out.append((stamp, pkt))
    return out


def _checksums_valid(pkt: Any) -> bool:
    """Recompute the IPv4 and UDP checksums with scapy and compare them with the ones on the wire."""
    from scapy.layers.inet import IP, UDP

    wire = IP(bytes(pkt[IP]))
    fresh = wire.copy()
    del fresh.chksum
    del fresh[UDP].chksum
    fresh = IP(bytes(fresh))
    return bool(fresh.chksum == wire.chksum and fresh[UDP].chksum == wire[UDP].chksum)


def _tos(pkt: Any) -> int:
    from scapy.layers.inet import IP

    return int(pkt[IP].tos)


@dataclass
class Burst:
    sent: dict[int, int]
    stats: dict[str, int]
    ect: list[tuple[float, Any]]
    plain: list[tuple[float, Any]]


@pytest.fixture(scope="module", name="burst")
def burst_fixture() -> Iterator[Burst]:
    """One congested run, shared by the tests that look at its different aspects."""
    _require()
    with veth_link() as link:
        cap = Capture(link)
        try:
            with EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-t") as marker:
                sent = blast(link, 0.3)
                frames = cap.frames()
                stats = marker.stats()
                assert pinned_stats(marker.tag) | {"queue_bytes": 0} == stats | {"queue_bytes": 0}
        finally:
            cap.close()
        yield Burst(sent, stats, _ip_frames(frames, PORT_ECT), _ip_frames(frames, PORT_PLAIN))


def test_congestion_marks_ce_and_counters_agree(burst: Burst) -> None:
    sent_ect, sent_plain = burst.sent[ECT0], burst.sent[NOT_ECT]
    assert len(burst.ect) == sent_ect and len(burst.plain) == sent_plain, "the link dropped packets"
    marked = [pkt for _, pkt in burst.ect if _tos(pkt) == CE]
    assert {_tos(pkt) for _, pkt in burst.ect} <= {ECT0, CE}
    assert burst.stats["packets"] == sent_ect + sent_plain
    assert burst.stats["ect_packets"] == sent_ect
    assert burst.stats["marked"] == len(marked)
    assert burst.stats["bytes"] == FRAME * (sent_ect + sent_plain)
    assert burst.stats["peak_queue_bytes"] > KMAX
    assert len(marked) >= sent_ect // 2, f"only {len(marked)} of {sent_ect} marked"
    # The first ECT packets found the queue below Kmin (each pair adds 2 frames): never marked.
    seqs = [struct.unpack("!I", bytes(pkt["Raw"].load)[:4])[0] for _, pkt in burst.ect]
    assert seqs == sorted(seqs)
    assert all(_tos(pkt) == ECT0 for _, pkt in burst.ect[: KMIN // (2 * FRAME)])


def test_marked_packets_have_valid_checksums(burst: Burst) -> None:
    marked = [pkt for _, pkt in burst.ect if _tos(pkt) == CE]
    assert marked
    assert all(_checksums_valid(pkt) for pkt in marked)
    assert all(_checksums_valid(pkt) for _, pkt in burst.plain[:20])


def test_not_ect_is_never_marked(burst: Burst) -> None:
    assert burst.plain
    assert {_tos(pkt) for _, pkt in burst.plain} == {NOT_ECT}


def test_htb_still_shapes_the_link(burst: Burst) -> None:
    frames = sorted(burst.ect + burst.plain, key=lambda f: f[0])
    seconds = frames[-1][0] - frames[0][0]
    rate = 8 * FRAME * (len(frames) - 1) / seconds
    assert 0.8 * RATE_BPS < rate < 1.2 * RATE_BPS, f"{rate / 1e6:.2f} Mbit/s through a 2 Mbit/s link"


@pytest.fixture(name="link")
def link_fixture() -> Iterator[Link]:
    _require()
    with veth_link() as link:
        yield link


def test_paced_below_the_rate_is_never_marked(link: Link) -> None:
    """About 80 % of the link for 0.3 s: 60 frames, far more than Kmin in total, but the queue drains."""
    cap = Capture(link)
    sock = _sender(link, ECT0)
    sock.setblocking(True)
    try:
        with EcnMarker(link.root, RATE_BPS, 20_000, 60_000, 1.0) as marker:
            for i in range(60):
                sock.sendto(struct.pack("!I", i).ljust(PAYLOAD, b"x"), (link.peer_ip, PORT_ECT))
                time.sleep(0.005)
            frames = _ip_frames(cap.frames(), PORT_ECT)
            stats = marker.stats()
    finally:
        sock.close()
        cap.close()
    assert len(frames) == 60
    assert {_tos(pkt) for _, pkt in frames} == {ECT0}
    assert (stats["packets"], stats["ect_packets"], stats["marked"]) == (60, 60, 0)
    assert FRAME <= stats["peak_queue_bytes"] < 20_000


def test_non_ip_frames_pass_untouched(link: Link) -> None:
    from scapy.layers.l2 import ARP, Ether

    peer_mac = _mac(link.peer, link.ns)
    arp = bytes(Ether(src=link.root_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=link.root_ip, pdst=link.peer_ip))
    lldp = bytes.fromhex(peer_mac.replace(":", "") + link.root_mac.replace(":", "")) + b"\x88\xcc" + bytes(50)
    cap = Capture(link)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind((link.root, 0))
    try:
        with EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX) as marker:
            for frame in (arp, lldp):
                tx.send(frame)
            got = [data for _, data in cap.frames()]
            stats = marker.stats()
    finally:
        tx.close()
        cap.close()
    assert arp.ljust(60, b"\0") in got or arp in got
    assert lldp in got
    assert stats["packets"] == 0


def _redirect(dev: str, pref: int, ifb: str) -> None:
    """The QoS layout (`emulation.qosqueues`): clsact on dev, every IP packet redirected to ifb at pref."""
    _sh("tc", "qdisc", "add", "dev", dev, "clsact")
    _sh("tc", "filter", "add", "dev", dev, "egress", "pref", str(pref), "protocol", "ip", "u32", "match",
        "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb)  # fmt: skip


def _egress(dev: str) -> list[dict[str, Any]]:
    return list(json.loads(_sh("tc", "-j", "filter", "show", "dev", dev, "egress") or "[]"))


def test_detach_removes_its_filter_pins_and_clsact(link: Link) -> None:
    marker = EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-d")
    with marker:
        assert marker.prog_pin.exists() and marker.map_pin.exists()
        ids = [f["options"]["prog"]["id"] for f in _egress(link.root) if "options" in f]
        assert ids == [marker.prog_id]
        assert "clsact" in _sh("tc", "qdisc", "show", "dev", link.root)
    assert _egress(link.root) == []
    assert "clsact" not in _sh("tc", "qdisc", "show", "dev", link.root)
    assert not marker.pin_dir.exists()
    with pytest.raises(EcnMarkError, match="not attached"):
        marker.stats()
    marker.detach()  # idempotent


def test_runs_before_a_later_ifb_redirect_and_leaves_it(link: Link) -> None:
    """The QoS layout: clsact on the veth redirects to an IFB whose HTB shapes the link.  The marker goes in
    front (TC_ACT_UNSPEC lets the redirect run), and detaching leaves the redirect and clsact alone."""
    ifb = f"{link.root[:-1]}i"
    link.extra.append(ifb)
    _sh("tc", "qdisc", "del", "dev", link.root, "root")
    _sh("ip", "link", "add", ifb, "txqueuelen", "1000", "type", "ifb")
    _sh("ip", "link", "set", ifb, "up")
    _htb(ifb)
    _redirect(link.root, 10, ifb)
    cap = Capture(link)
    try:
        with EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-q", ifb=ifb) as marker:
            assert marker._attached_pref == 9
            sent = blast(link, 1.0, (ECT0,), count=120)[ECT0]
            frames = _ip_frames(cap.frames(), PORT_ECT)
            stats = marker.stats()
    finally:
        cap.close()
    ifb_sent = json.loads(_sh("tc", "-s", "-j", "qdisc", "show", "dev", ifb))[0]["packets"]
    assert len(frames) == sent == stats["ect_packets"] and ifb_sent >= sent
    assert stats["marked"] == sum(_tos(pkt) == CE for _, pkt in frames) > 0
    assert [f["kind"] for f in _egress(link.root)] == ["u32"] * len(_egress(link.root))
    assert "clsact" in _sh("tc", "qdisc", "show", "dev", link.root)


def test_on_the_ifb_itself(link: Link) -> None:
    """On a QoS port the IFB's HTB is the queue: a marker on the IFB's egress sees the redirected packets."""
    ifb = f"{link.root[:-1]}i"
    link.extra.append(ifb)
    _sh("tc", "qdisc", "del", "dev", link.root, "root")
    _sh("ip", "link", "add", ifb, "txqueuelen", "1000", "type", "ifb")
    _sh("ip", "link", "set", ifb, "up")
    _htb(ifb)
    _redirect(link.root, 1, ifb)
    with pytest.raises(EcnMarkError, match="pref 1"):
        EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-x").attach()
    assert not (PIN_ROOT / f"{link.root}-x").exists()
    cap = Capture(link)
    try:
        with EcnMarker(ifb, RATE_BPS, KMIN, KMAX, PMAX) as marker:
            sent = blast(link, 1.0, (ECT0,), count=120)[ECT0]
            frames = _ip_frames(cap.frames(), PORT_ECT)
            stats = marker.stats()
    finally:
        cap.close()
    assert len(frames) == sent == stats["ect_packets"]
    assert stats["marked"] == sum(_tos(pkt) == CE for _, pkt in frames) > 0
    assert "clsact" not in _sh("tc", "qdisc", "show", "dev", ifb)


def test_attach_errors_name_the_device(link: Link) -> None:
    with pytest.raises(EcnMarkError, match="emnosuchdev"):
        EcnMarker("emnosuchdev", RATE_BPS, KMIN, KMAX, PMAX).attach()
    with EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-e"):
        with pytest.raises(EcnMarkError, match=f"{link.root}.*exists"):
            EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-e").attach()
        with pytest.raises(EcnMarkError, match="pref 1 is already taken"):
            EcnMarker(link.root, RATE_BPS, KMIN, KMAX, PMAX, tag=f"{link.root}-f", pref=1).attach()
        assert not (PIN_ROOT / f"{link.root}-f").exists()


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"rate_bps": 0}, "rate_bps"),
        ({"rate_bps": float("nan")}, "rate_bps"),
        ({"kmin_bytes": -1}, "kmin_bytes"),
        ({"kmax_bytes": KMIN}, "kmax_bytes"),
        ({"pmax": 0}, "pmax"),
        ({"pmax": 1.5}, "pmax"),
        ({"drain_fraction": 0}, "drain_fraction"),
        ({"drain_fraction": 1.2}, "drain_fraction"),
        ({"limit_bytes": KMAX - 1}, "limit_bytes"),
        ({"pref": 0}, "pref"),
        ({"dev": "a-very-long-interface-name"}, "dev"),
        ({"tag": "../x"}, "tag"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, Any], field_name: str) -> None:
    args: dict[str, Any] = {"dev": "eth0", "rate_bps": RATE_BPS, "kmin_bytes": KMIN, "kmax_bytes": KMAX,
                            "pmax": PMAX} | kwargs  # fmt: skip
    with pytest.raises(ValueError, match=f"^{field_name}:"):
        EcnMarker(**args)


def _test_run(prog_fd: int, frame: bytes, repeat: int = 1) -> tuple[int, bytes, int]:
    """BPF_PROG_TEST_RUN: (return value, the frame as the program left it, mean ns per run)."""
    from emulation.ecnmark import _SYSCALL_BPF

    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(len(frame) + 256)
    attr = ctypes.create_string_buffer(struct.pack("<IIIIQQII", prog_fd, 0, len(frame), len(data_out),
                                                   ctypes.addressof(data_in), ctypes.addressof(data_out),
                                                   repeat, 0).ljust(128, b"\0"))  # fmt: skip
    nr = _SYSCALL_BPF[os.uname().machine]
    if _libc.syscall(ctypes.c_long(nr), ctypes.c_int(10), attr, ctypes.c_uint(128)) != 0:
        raise OSError(ctypes.get_errno(), "bpf(PROG_TEST_RUN)")
    retval, _size_in, size_out = struct.unpack_from("<iII", attr.raw, 4)
    return retval, data_out.raw[:size_out], struct.unpack_from("<I", attr.raw, 36)[0]


@contextmanager
def loaded(marker: EcnMarker) -> Iterator[int]:
    """The marker's program and map loaded (not attached anywhere): yields the program's fd."""
    from emulation import ecnmark

    map_fd = ecnmark._create_map()
    value = ctypes.create_string_buffer(
        ecnmark._VALUE.pack(*(marker._config.get(k, 0) for k in ecnmark.FIELDS))
    )
    ecnmark._map_io(ecnmark.BPF_MAP_UPDATE_ELEM, map_fd, value, "update")
    prog_fd = ecnmark._load_program(map_fd)
    marker._map_fd = map_fd
    try:
        yield prog_fd
    finally:
        marker._map_fd = None
        os.close(prog_fd)
        os.close(map_fd)


def _frame(tos: int, size: int = 100) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    ip = IP(src="198.18.0.1", dst="198.18.0.2", tos=tos)
    pkt = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip / UDP(sport=1, dport=2)
    return bytes(pkt / (b"x" * (size - len(pkt))))


def test_red_profile_in_the_kernel() -> None:
    """The program run on synthetic frames (BPF_PROG_TEST_RUN) with a drain of 1 byte/s, so the queue after
    frame i is 100 * i bytes: never marked up to Kmin, always beyond Kmax, in between with probability
    pmax * (q - kmin) / (kmax - kmin) (expected 150.25 of the 600 frames in the ramp, sd ~10); Not-ECT
    frames and ARP untouched; checksums of marked frames valid; TC_ACT_UNSPEC always."""
    from scapy.layers.inet import IP

    _require()
    marker = EcnMarker("eth0", 8, 20_000, 80_000, 0.5, limit_bytes=200_000)
    ect, plain = _frame(ECT0), _frame(NOT_ECT)
    arp = bytes.fromhex("ffffffffffff0200000000010806") + bytes(46)
    with loaded(marker) as prog:
        marks = []
        for i in range(1, 1001):
            retval, out, _ = _test_run(prog, ect)
            assert retval == -1 and len(out) == len(ect)
            marks.append(out[15] & 3 == CE)
            if marks[-1]:
                assert _checksums_valid(IP(out[14:]))
                assert (out[:15], out[16:24], out[26:]) == (ect[:15], ect[16:24], ect[26:])
            else:
                assert out == ect, f"frame {i}"
        assert _test_run(prog, plain)[:2] == (-1, plain)
        assert _test_run(prog, arp)[:2] == (-1, arp)
        stats = marker.stats()
    ramp = marks[200:800]
    assert not any(marks[:200]) and all(marks[801:])
    assert 100 < sum(ramp) < 200 and sum(ramp[:300]) < sum(ramp[300:])
    assert stats["marked"] == sum(marks) and stats["ect_packets"] == 1000 and stats["packets"] == 1001
