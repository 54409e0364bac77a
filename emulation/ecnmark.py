"""ECN CE marking at an emulated link's egress by a phantom queue in an eBPF classifier (for DCQCN).

Why a phantom queue in eBPF: DCQCN needs the congested egress to mark ECN CE so the receiver answers with
CNPs, but this kernel has no RED, CoDel, fq_codel, PIE or netem, and HTB (which shapes the emulated link)
never marks.  So a `cls_bpf` program on the interface's `clsact` egress hook keeps a *virtual* queue that
models the link's queue from the packets it sees: each IPv4 packet adds its length, and the queue drains at
the link's modelled rate.  The real HTB still shapes the link (the classifier only rewrites the TOS byte
and returns TC_ACT_UNSPEC, so later filters on the chain, such as a QoS `mirred` redirect to an IFB, still
run).  There is no clang in the image, so the program is a few dozen raw eBPF instructions assembled here,
loaded with `bpf(2)` through ctypes, pinned to bpffs and attached by `tc ... bpf object-pinned`.

Semantics, per packet at egress (one array map per interface, one entry, see `FIELDS`):

* Non-IPv4 frames (ARP, LLDP, IPv6) pass untouched and are not counted: the emulator's traffic is IPv4 and
  the rest is negligible.
* Drain: `queue -= elapsed_ns * rate / 1e9` (not below 0), then `queue += skb->len` (Ethernet header
  included, as HTB counts it).  The queue is kept in nano-bytes (bytes * 1e9) so the drain is exact integer
  math with no per-packet rounding (at 100 kpps a rounded byte per packet would be 100 kB/s of lost drain);
  a gap longer than `empty_ns` (the time to drain a full queue, precomputed) simply empties it, which also
  keeps `elapsed * rate` far from 64-bit overflow.  A packet that would take the queue above `limit_bytes`
  is not added (a real buffer would drop it; counted in `overflow`): without a limit the phantom queue,
  which sees offered load before the real queue drops any, would keep marking long after an overload.
* Mark (ECN-capable packets only, IP TOS low bits != 0; a packet already CE is left alone): DCQCN's
  RED-like profile on the queue in bytes `q` after this packet: never at `q <= kmin`, always at `q > kmax`,
  else with probability `pmax * (q - kmin) / (kmax - kmin)` (pmax scaled to 2^32 against
  `bpf_get_prandom_u32`).  Marking sets both ECN bits, fixes the IPv4 header checksum with
  `bpf_l3_csum_replace` and writes the byte with `bpf_skb_store_bytes`.
* Counters: packets, bytes, ECT packets, marked, overflow, peak queue bytes (atomic adds for the counters;
  the queue update itself is not atomic across CPUs, a rare lost update being harmless for a model).

Drain rate = the link's scaled rate * `drain_fraction`.  With 1.0 the phantom queue tracks what the real
queue would hold; slightly less (e.g. 0.95) makes it build up before the real queue does, so senders are
slowed before the link's buffer fills and latency stays low (the "phantom queue" of HULL).  The emulator
shapes to exactly the scaled rate, so 1.0 is the default: marks then mean the real queue is that deep.

Placement: the marker must see the packets before anything steals them, so its filter gets a lower `pref`
than the filters already on the hook (the default picks one).  A packet redirected to an IFB comes back
through this device's egress hook after the IFB's queue: the kernel then skips tc *actions* but still runs
direct-action classifiers, so pass `ifb=` to ignore packets re-injected by it (else each counts twice).
On a QoS port (`emulation.qosqueues`) the redirect is already at pref 1 and the IFB's HTB is the queue: attach
the marker to the IFB itself (`qos.ifb_name(intf)`), whose egress hook sees each packet once.  Devices must
be in this process's network namespace (`tc -n` remounts /sys, hiding the pins); pins live under
/sys/fs/bpf/fabriclab/<tag>/ (bpffs is mounted there if it is not yet).
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "fabriclab"
_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_PROG_LOAD = 0, 1, 2, 5
BPF_OBJ_PIN, BPF_OBJ_GET, BPF_OBJ_GET_INFO_BY_FD = 6, 7, 15
BPF_MAP_TYPE_ARRAY, BPF_PROG_TYPE_SCHED_CLS, BPF_PSEUDO_MAP_FD = 2, 3, 1
TC_ACT_UNSPEC = -1
ETH_P_IP = 0x0800
TOS_OFF, IP_CSUM_OFF = 14 + 1, 14 + 10
NS_PER_S = 1_000_000_000
PMAX_ONE = 1 << 32
MAX_KMAX, MAX_LIMIT, MAX_RATE_BYTES = 1 << 31, 1 << 32, 1 << 34
# helper ids (include/uapi/linux/bpf.h)
MAP_LOOKUP_ELEM, KTIME_GET_NS, GET_PRANDOM_U32, SKB_STORE_BYTES, L3_CSUM_REPLACE, SKB_LOAD_BYTES = (
    1, 5, 7, 9, 10, 26)  # fmt: skip

#: The map value: u64 fields in this order.  queue is in nano-bytes, rate in bytes/s, pmax in 2^-32 units.
FIELDS = ("queue", "last_ns", "rate", "empty_ns", "limit", "kmin", "kmax", "pmax",
          "packets", "bytes", "ect_packets", "marked", "overflow", "peak_queue_bytes")  # fmt: skip
_OFF = {name: 8 * i for i, name in enumerate(FIELDS)}
_VALUE = struct.Struct(f"<{len(FIELDS)}Q")
_libc = ctypes.CDLL(None, use_errno=True)


class EcnMarkError(RuntimeError):
    """The marker could not be loaded, attached or read: which device or pin, which step, and why."""


# --- a tiny eBPF assembler -------------------------------------------------------------------------------
# Registers: r0 return, r1-r5 arguments (clobbered by calls), r6-r9 callee-saved, r10 frame pointer.
ALU64, JMP, LDX, STX, ST = 0x07, 0x05, 0x01, 0x03, 0x02
SIZE = {1: 0x10, 2: 0x08, 4: 0x00, 8: 0x18}
MEM, ATOMIC, SRC_X = 0x60, 0xC0, 0x08
ALU_OP = {"add": 0, "sub": 0x10, "mul": 0x20, "div": 0x30, "or": 0x40, "and": 0x50, "lsh": 0x60, "mov": 0xB0}
JMP_OP = {"ja": 0x00, "jeq": 0x10, "jgt": 0x20, "jge": 0x30, "jne": 0x50}

Insn = tuple[int, int, int, int, int] | str  # (opcode, dst, src, off, imm), or a label
Jump = tuple[str, int, int | None, int, str]  # (op, dst, src register or None, imm, label)


def _insn(opcode: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", opcode, dst | src << 4, off, imm)


class _Asm:
    """Collects instructions and resolves jump labels (offsets count instructions after the jump)."""

    def __init__(self) -> None:
        self.items: list[bytes | Jump | str] = []

    def alu(self, op: str, dst: int, imm: int | None = None, src: int | None = None) -> None:
        if src is not None:
            self.items.append(_insn(ALU64 | ALU_OP[op] | SRC_X, dst, src))
        else:
            self.items.append(_insn(ALU64 | ALU_OP[op], dst, imm=imm or 0))

    def ldx(self, size: int, dst: int, src: int, off: int) -> None:
        self.items.append(_insn(LDX | MEM | SIZE[size], dst, src, off))

    def stx(self, size: int, dst: int, off: int, src: int) -> None:
        self.items.append(_insn(STX | MEM | SIZE[size], dst, src, off))

    def st(self, size: int, dst: int, off: int, imm: int) -> None:
        self.items.append(_insn(ST | MEM | SIZE[size], dst, 0, off, imm))

    def xadd(self, dst: int, off: int, src: int) -> None:
        """Atomic 64-bit `*(dst + off) += src` (BPF_ATOMIC, BPF_ADD)."""
        self.items.append(_insn(STX | ATOMIC | SIZE[8], dst, src, off, 0))

    def ld_map_fd(self, dst: int, fd: int) -> None:
        self.items.append(_insn(0x18, dst, BPF_PSEUDO_MAP_FD, 0, fd) + _insn(0))

    def call(self, helper: int) -> None:
        self.items.append(_insn(JMP | 0x80, imm=helper))

    def exit(self) -> None:
        self.items.append(_insn(JMP | 0x90))

    def jmp(self, op: str, label: str, dst: int = 0, imm: int = 0, src: int | None = None) -> None:
        self.items.append((op, dst, src, imm, label))

    def label(self, name: str) -> None:
        self.items.append(name)

    def assemble(self) -> bytes:
        pc, where = 0, {}
        for item in self.items:
            if isinstance(item, str):
                where[item] = pc
            else:
                pc += len(item) // 8 if isinstance(item, bytes) else 1
        out, pc = [], 0
        for item in self.items:
            if isinstance(item, str):
                continue
            if isinstance(item, bytes):
                out.append(item)
                pc += len(item) // 8
                continue
            op, dst, src, imm, label = item
            off = where[label] - (pc + 1)
            code = JMP | JMP_OP[op] | (SRC_X if src is not None else 0)
            out.append(_insn(code, dst, src or 0, off, imm))
            pc += 1
        return b"".join(out)


def program(map_fd: int, skip_ifindex: int = 0) -> bytes:
    """The classifier (see the module docstring); `map_fd` is the state map's fd, embedded by ld_imm64.
    Packets re-injected by the IFB of index `skip_ifindex` (their skb->ingress_ifindex) are not seen again."""
    a, f = _Asm(), _OFF
    a.alu("mov", 6, src=1)  # r6 = skb
    a.ldx(4, 2, 6, 16)  # skb->protocol, network byte order
    a.jmp("jne", "pass", 2, socket.htons(ETH_P_IP))
    if skip_ifindex:
        a.ldx(4, 2, 6, 36)  # skb->ingress_ifindex (skb_iif)
        a.jmp("jeq", "pass", 2, skip_ifindex)
    a.alu("mov", 1, src=6)
    a.alu("mov", 2, TOS_OFF)
    a.alu("mov", 3, src=10)
    a.alu("add", 3, -8)
    a.alu("mov", 4, 1)
    a.call(SKB_LOAD_BYTES)  # tos -> fp-8
    a.jmp("jne", "pass", 0, 0)
    a.ldx(1, 9, 10, -8)  # r9 = tos
    a.st(4, 10, -4, 0)  # key 0
    a.alu("mov", 2, src=10)
    a.alu("add", 2, -4)
    a.ld_map_fd(1, map_fd)
    a.call(MAP_LOOKUP_ELEM)
    a.jmp("jeq", "pass", 0, 0)
    a.alu("mov", 7, src=0)  # r7 = state
    a.call(KTIME_GET_NS)
    a.alu("mov", 8, src=0)  # r8 = now
    a.alu("mov", 1, 1)
    a.xadd(7, f["packets"], 1)
    a.ldx(4, 1, 6, 0)  # skb->len
    a.xadd(7, f["bytes"], 1)
    a.ldx(8, 1, 7, f["last_ns"])
    a.stx(8, 7, f["last_ns"], 8)
    a.ldx(8, 3, 7, f["queue"])  # r3 = queue (nano-bytes)
    a.jmp("jge", "drained", 1, src=8)  # no time elapsed (or another CPU is ahead)
    a.alu("mov", 2, src=8)
    a.alu("sub", 2, src=1)  # elapsed ns
    a.ldx(8, 4, 7, f["empty_ns"])
    a.jmp("jge", "empty", 2, src=4)
    a.ldx(8, 4, 7, f["rate"])
    a.alu("mul", 2, src=4)  # drained nano-bytes (< limit * 1e9 + rate: no overflow)
    a.jmp("jge", "empty", 2, src=3)
    a.alu("sub", 3, src=2)
    a.jmp("ja", "drained")
    a.label("empty")
    a.alu("mov", 3, 0)
    a.label("drained")
    a.ldx(4, 1, 6, 0)
    a.alu("mul", 1, NS_PER_S)
    a.alu("add", 1, src=3)
    a.ldx(8, 4, 7, f["limit"])
    a.jmp("jgt", "overflow", 1, src=4)
    a.alu("mov", 3, src=1)
    a.jmp("ja", "queued")
    a.label("overflow")
    a.alu("mov", 1, 1)
    a.xadd(7, f["overflow"], 1)
    a.label("queued")
    a.stx(8, 7, f["queue"], 3)
    a.alu("div", 3, NS_PER_S)  # r3 = queue bytes
    a.ldx(8, 1, 7, f["peak_queue_bytes"])
    a.jmp("jge", "ecn", 1, src=3)
    a.stx(8, 7, f["peak_queue_bytes"], 3)
    a.label("ecn")
    a.alu("mov", 1, src=9)
    a.alu("and", 1, 3)
    a.jmp("jeq", "pass", 1, 0)  # Not-ECT
    a.alu("mov", 2, 1)
    a.xadd(7, f["ect_packets"], 2)
    a.jmp("jeq", "pass", 1, 3)  # already CE
    a.ldx(8, 1, 7, f["kmin"])
    a.jmp("jge", "pass", 1, src=3)  # q <= kmin
    a.ldx(8, 2, 7, f["kmax"])
    a.jmp("jgt", "mark", 3, src=2)  # q > kmax
    a.alu("sub", 3, src=1)
    a.alu("sub", 2, src=1)
    a.ldx(8, 4, 7, f["pmax"])
    a.alu("mul", 3, src=4)  # < 2^31 * 2^32
    a.alu("div", 3, src=2)  # threshold, 2^-32 units
    a.alu("mov", 8, src=3)
    a.call(GET_PRANDOM_U32)
    a.jmp("jge", "pass", 0, src=8)
    a.label("mark")
    a.alu("mov", 1, src=9)
    a.alu("or", 1, 3)
    a.stx(1, 10, -8, 1)  # new tos -> fp-8
    a.alu("mov", 1, src=6)
    a.alu("mov", 2, IP_CSUM_OFF)
    a.alu("mov", 3, src=9)
    a.alu("lsh", 3, 8)  # htons(old tos): TOS is the second byte of its 16-bit word (little-endian host)
    a.alu("mov", 4, src=9)
    a.alu("or", 4, 3)
    a.alu("lsh", 4, 8)
    a.alu("mov", 5, 2)
    a.call(L3_CSUM_REPLACE)
    a.jmp("jne", "pass", 0, 0)
    a.alu("mov", 1, src=6)
    a.alu("mov", 2, TOS_OFF)
    a.alu("mov", 3, src=10)
    a.alu("add", 3, -8)
    a.alu("mov", 4, 1)
    a.alu("mov", 5, 0)
    a.call(SKB_STORE_BYTES)
    a.jmp("jne", "pass", 0, 0)
    a.alu("mov", 1, 1)
    a.xadd(7, f["marked"], 1)
    a.label("pass")
    a.alu("mov", 0, TC_ACT_UNSPEC)
    a.exit()
    return a.assemble()


# --- bpf(2) ------------------------------------------------------------------------------------------------
def _bpf(cmd: int, attr: bytes, what: str) -> int:
    nr = _SYSCALL_BPF.get(platform.machine())
    if nr is None:
        raise EcnMarkError(f"{what}: no bpf(2) syscall number known for {platform.machine()}")
    buf = ctypes.create_string_buffer(attr, len(attr))
    ret = int(_libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(len(attr))))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _attr(fmt: str, *values: object) -> bytes:
    return struct.pack(fmt, *values).ljust(128, b"\0")


def _create_map() -> int:
    attr = _attr("<IIIIIII16s", BPF_MAP_TYPE_ARRAY, 4, _VALUE.size, 1, 0, 0, 0, b"fl_ecn_state")
    return _bpf(BPF_MAP_CREATE, attr, "bpf(MAP_CREATE)")


def _map_io(cmd: int, fd: int, value: ctypes.Array[ctypes.c_char], what: str) -> None:
    key = ctypes.c_uint32(0)
    attr = _attr("<IIQQQ", fd, 0, ctypes.addressof(key), ctypes.addressof(value), 0)
    _bpf(cmd, attr, what)


def _load_program(map_fd: int, skip_ifindex: int = 0) -> int:
    """BPF_PROG_LOAD; on failure, load again with the verifier's log and put the log in the error."""
    code = ctypes.create_string_buffer(program(map_fd, skip_ifindex))
    lic = ctypes.create_string_buffer(b"GPL")
    count = (len(code) - 1) // 8

    def load(log: ctypes.Array[ctypes.c_char] | None) -> int:
        level, size, addr = (1, len(log), ctypes.addressof(log)) if log is not None else (0, 0, 0)
        attr = _attr("<IIQQIIQII16s", BPF_PROG_TYPE_SCHED_CLS, count, ctypes.addressof(code),
                     ctypes.addressof(lic), level, size, addr, 0, 0, b"fl_ecn_mark")  # fmt: skip
        return _bpf(BPF_PROG_LOAD, attr, "bpf(PROG_LOAD)")

    try:
        return load(None)
    except OSError as exc:
        log = ctypes.create_string_buffer(1 << 20)
        try:
            return load(log)
        except OSError:
            text = log.value.decode(errors="replace").strip()
            raise EcnMarkError(f"the kernel refused the ECN marker: {exc}; verifier log:\n{text}") from exc


def _prog_id(fd: int) -> int:
    info = ctypes.create_string_buffer(64)  # struct bpf_prog_info: type u32, id u32, ...
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _attr("<IIQ", fd, len(info), ctypes.addressof(info)), "bpf(OBJ_GET_INFO)")
    return int(struct.unpack_from("<I", info.raw, 4)[0])


def _pin(fd: int, path: Path) -> None:
    name = ctypes.create_string_buffer(os.fsencode(path))
    _bpf(BPF_OBJ_PIN, _attr("<QII", ctypes.addressof(name), fd, 0), f"bpf(OBJ_PIN) {path}")


def _read_state(fd: int) -> dict[str, int]:
    value = ctypes.create_string_buffer(_VALUE.size)
    _map_io(BPF_MAP_LOOKUP_ELEM, fd, value, "bpf(MAP_LOOKUP_ELEM)")
    return dict(zip(FIELDS, _VALUE.unpack(value.raw), strict=True))


def _stats(state: dict[str, int]) -> dict[str, int]:
    """The counters, and the queue drained up to now (ktime_get_ns and monotonic_ns are the same clock)."""
    queue = state["queue"]
    if state["last_ns"] and state["rate"]:
        elapsed = max(0, time.monotonic_ns() - state["last_ns"])
        queue = max(0, queue - elapsed * state["rate"])
    keys = ("packets", "bytes", "ect_packets", "marked", "overflow", "peak_queue_bytes")
    return {**{k: state[k] for k in keys}, "queue_bytes": queue // NS_PER_S}


def pinned_stats(tag: str) -> dict[str, int]:
    """`EcnMarker.stats()` of a marker attached by another process, read through its pinned map."""
    path = PIN_ROOT / tag / "state"
    name = ctypes.create_string_buffer(os.fsencode(path))
    try:
        fd = _bpf(BPF_OBJ_GET, _attr("<QII", ctypes.addressof(name), 0, 0), f"bpf(OBJ_GET) {path}")
    except OSError as exc:
        raise EcnMarkError(f"ECN marker {tag!r}: cannot open its pinned map: {exc}") from exc
    try:
        return _stats(_read_state(fd))
    finally:
        os.close(fd)


# --- tc and bpffs ----------------------------------------------------------------------------------------
def _run(args: list[str], what: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise EcnMarkError(f"{what}: `{' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def ensure_bpffs() -> None:
    """Mount bpffs at /sys/fs/bpf unless a bpf filesystem is already there (pins need one)."""
    with open("/proc/mounts", encoding="utf-8") as mounts:
        if any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in mounts if len(line.split()) > 2):
            return
    _run(["mount", "-t", "bpf", "bpf", str(BPFFS)], f"mounting bpffs at {BPFFS}")


def _filters(dev: str) -> dict[str, list[dict[str, Any]]]:
    """`tc -j filter show` of the device's clsact hooks, by hook ("ingress", "egress")."""
    return {hook: json.loads(_run(["tc", "-j", "filter", "show", "dev", dev, hook],
                                  f"{dev}: listing {hook} filters") or "[]")
            for hook in ("ingress", "egress")}  # fmt: skip


def _prog_ids(filters: list[dict[str, Any]]) -> set[int]:
    return {int(f["options"]["prog"]["id"]) for f in filters if "prog" in f.get("options", {})}


def _has_clsact(dev: str) -> bool:
    return " clsact " in _run(["tc", "qdisc", "show", "dev", dev], f"{dev}: listing qdiscs")


def _device_exists(dev: str) -> bool:
    try:
        socket.if_nametoindex(dev)
    except OSError:
        return False
    return True


@functools.cache
def ecn_marking_available() -> str | None:
    """None if markers can be attached here, else why not (loads the program once to find out)."""
    if sys.platform != "linux" or sys.byteorder != "little" or platform.machine() not in _SYSCALL_BPF:
        return f"ECN marking needs little-endian Linux on {'/'.join(_SYSCALL_BPF)}"
    if os.geteuid() != 0:
        return "ECN marking needs root (bpf(2), tc, bpffs)"
    if shutil.which("tc") is None:
        return "ECN marking needs iproute2's tc"
    if not BPFFS.is_dir():
        return f"ECN marking needs {BPFFS} to mount bpffs on"
    try:
        map_fd = _create_map()
        try:
            os.close(_load_program(map_fd))
        finally:
            os.close(map_fd)
    except (OSError, EcnMarkError) as exc:
        return f"the kernel cannot load the ECN marker: {exc}"
    return None


class EcnMarker:
    """A phantom-queue ECN CE marker on one device's egress (see the module docstring).

    `rate_bps` is the link's modelled (scaled) rate in bits/s, the rate HTB shapes it to; the phantom queue
    drains at `rate_bps * drain_fraction`.  `kmin_bytes`/`kmax_bytes`/`pmax` are DCQCN's marking profile,
    `limit_bytes` (default 2 * kmax) bounds the phantom queue like a buffer.  `pref` is the tc filter
    preference; None picks one below every filter already on the egress hook, so the marker runs first.
    `ifb`: the IFB a later filter redirects this device's packets to; the IFB hands them back to this
    device's egress, where the classifier would see them a second time (re-injection skips tc *actions*,
    not direct-action classifiers), so packets arriving from it (skb->ingress_ifindex) are ignored.
    """

    def __init__(
        self,
        dev: str,
        rate_bps: float,
        kmin_bytes: int,
        kmax_bytes: int,
        pmax: float,
        drain_fraction: float = 1.0,
        tag: str | None = None,
        limit_bytes: int | None = None,
        pref: int | None = None,
        ifb: str | None = None,
    ) -> None:
        if not dev or len(dev) > 15 or "/" in dev or dev.strip() != dev:
            raise ValueError(f"dev: {dev!r} is not an interface name")
        if not math.isfinite(rate_bps) or rate_bps <= 0:
            raise ValueError(f"rate_bps: must be a positive number of bits/s, got {rate_bps!r}")
        if not math.isfinite(drain_fraction) or not 0 < drain_fraction <= 1:
            raise ValueError(f"drain_fraction: must be in (0, 1], got {drain_fraction!r}")
        rate = int(rate_bps * drain_fraction / 8)
        if not 1 <= rate <= MAX_RATE_BYTES:
            raise ValueError(f"rate_bps: the drain rate {rate} bytes/s is outside 1..{MAX_RATE_BYTES}")
        if kmin_bytes < 0:
            raise ValueError(f"kmin_bytes: must be >= 0, got {kmin_bytes}")
        if not kmin_bytes < kmax_bytes <= MAX_KMAX:
            raise ValueError(f"kmax_bytes: must be > kmin_bytes ({kmin_bytes}) and <= {MAX_KMAX}")
        if not math.isfinite(pmax) or not 0 < pmax <= 1:
            raise ValueError(f"pmax: must be in (0, 1], got {pmax!r}")
        limit = 2 * kmax_bytes if limit_bytes is None else limit_bytes
        if not kmax_bytes <= limit <= MAX_LIMIT:
            raise ValueError(f"limit_bytes: must be in [kmax_bytes, {MAX_LIMIT}], got {limit}")
        if pref is not None and not 1 <= pref <= 0xFFFF:
            raise ValueError(f"pref: must be in 1..65535, got {pref}")
        self.tag = dev if tag is None else tag
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.tag):  # bpffs refuses names with dots
            raise ValueError(f"tag: {self.tag!r} must be 1-64 of [A-Za-z0-9_-]")
        if ifb is not None and (not ifb or len(ifb) > 15 or "/" in ifb):
            raise ValueError(f"ifb: {ifb!r} is not an interface name")
        self.dev, self.rate, self.pref, self.ifb = dev, rate, pref, ifb
        limit_nb = limit * NS_PER_S
        self._config = {"rate": rate, "empty_ns": -(-limit_nb // rate), "limit": limit_nb,
                        "kmin": kmin_bytes, "kmax": kmax_bytes, "pmax": round(pmax * PMAX_ONE)}  # fmt: skip
        self.pin_dir = PIN_ROOT / self.tag
        self.prog_pin, self.map_pin = self.pin_dir / "prog", self.pin_dir / "state"
        self.prog_id: int | None = None
        self._map_fd: int | None = None
        self._prog_fd: int | None = None
        self._added_clsact = False
        self._attached_pref: int | None = None

    def _choose_pref(self, egress: list[dict[str, Any]]) -> int:
        taken = sorted({int(f["pref"]) for f in egress})
        if self.pref is not None:
            if self.pref in taken:
                raise EcnMarkError(f"{self.dev}: egress filter pref {self.pref} is already taken")
            return self.pref
        if not taken:
            return 1
        if taken[0] <= 1:
            raise EcnMarkError(
                f"{self.dev}: a filter at egress pref 1 runs before any other; the marker cannot go first "
                "(on a QoS port attach it to the port's IFB, whose HTB is the queue)"
            )
        return taken[0] - 1

    def attach(self) -> None:
        """Load, pin and attach the program; on any failure undo what was done and raise EcnMarkError."""
        if self._attached_pref is not None:
            raise EcnMarkError(f"{self.dev}: ECN marker {self.tag!r} is already attached")
        if not _device_exists(self.dev):
            raise EcnMarkError(f"{self.dev}: no such device in this network namespace")
        ensure_bpffs()
        if self.pin_dir.exists():
            raise EcnMarkError(f"{self.dev}: {self.pin_dir} exists (another marker, or a leftover: unpin it)")
        try:
            self._map_fd = _create_map()
            value = ctypes.create_string_buffer(_VALUE.pack(*(self._config.get(k, 0) for k in FIELDS)))
            _map_io(BPF_MAP_UPDATE_ELEM, self._map_fd, value, f"{self.dev}: bpf(MAP_UPDATE_ELEM)")
            skip = 0
            if self.ifb is not None:
                if not _device_exists(self.ifb):
                    raise EcnMarkError(f"{self.dev}: its IFB {self.ifb}: no such device")
                skip = socket.if_nametoindex(self.ifb)
            self._prog_fd = _load_program(self._map_fd, skip)
            self.prog_id = _prog_id(self._prog_fd)
            self.pin_dir.mkdir(parents=True)
            _pin(self._prog_fd, self.prog_pin)
            _pin(self._map_fd, self.map_pin)
            if not _has_clsact(self.dev):
                _run(["tc", "qdisc", "add", "dev", self.dev, "clsact"], f"{self.dev}: adding clsact")
                self._added_clsact = True
            pref = self._choose_pref(_filters(self.dev)["egress"])
            _run(["tc", "filter", "add", "dev", self.dev, "egress", "pref", str(pref), "protocol", "all",
                  "bpf", "direct-action", "object-pinned", str(self.prog_pin)],
                 f"{self.dev}: attaching the ECN marker")  # fmt: skip
            self._attached_pref = pref
        except (OSError, EcnMarkError) as exc:
            self.detach()
            if isinstance(exc, EcnMarkError):
                raise
            raise EcnMarkError(f"{self.dev}: {exc}") from exc

    def stats(self) -> dict[str, int]:
        """packets, bytes, ect_packets, marked, overflow, peak_queue_bytes, queue_bytes (drained to now)."""
        if self._map_fd is None:
            raise EcnMarkError(f"{self.dev}: ECN marker {self.tag!r} is not attached")
        return _stats(_read_state(self._map_fd))

    def detach(self) -> None:
        """Remove this marker's filter and pins (and clsact if it added it and no filter is left). Idempotent;
        a device that is gone took its filters with it."""
        try:
            if _device_exists(self.dev):
                pref, ours = self._attached_pref, _prog_ids(_filters(self.dev)["egress"])
                if pref is not None and self.prog_id in ours:
                    _run(["tc", "filter", "del", "dev", self.dev, "egress", "pref", str(pref)],
                         f"{self.dev}: removing the ECN marker")  # fmt: skip
                if self._added_clsact and not any(_filters(self.dev).values()):
                    _run(["tc", "qdisc", "del", "dev", self.dev, "clsact"], f"{self.dev}: removing clsact")
        finally:
            self._attached_pref, self._added_clsact = None, False
            for fd in (self._prog_fd, self._map_fd):
                if fd is not None:
                    os.close(fd)
            self._prog_fd = self._map_fd = None
            unpin(self.tag)

    def __enter__(self) -> EcnMarker:
        self.attach()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.detach()


def unpin(tag: str) -> None:
    """Remove a marker's pins (its program and map are freed once no filter uses them); missing is fine."""
    pin_dir = PIN_ROOT / tag
    for name in ("prog", "state"):
        (pin_dir / name).unlink(missing_ok=True)
    for d in (pin_dir, PIN_ROOT):
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # not empty: another marker's pins
            break


__all__ = ["EcnMarkError", "EcnMarker", "ecn_marking_available", "ensure_bpffs", "pinned_stats", "unpin"]
