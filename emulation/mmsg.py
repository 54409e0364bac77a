"""Many datagrams per system call (Linux `sendmmsg`/`recvmmsg` through ctypes), laid out for numpy.

Why: at the emulator's capacity the probes' own cost is what limits it.  Measured on the k=4 fabric
(one shard, patch cables, AF_XDP ports) at 9,000 pkt/s per host: the 32 probe processes spent 0.59 cores
in the interpreter and 0.35 in the kernel, ovs-vswitchd 0.55 — a packet cost the probes three times what
it cost the switch.  A call per packet (`sendto`, `recvmsg`) builds a bytes object, a tuple and a list of
control messages per packet; here a batch is one call, the packets live in one preallocated buffer, and
their sequence numbers, send times and the kernel's arrival stamps are read and written as numpy arrays.

`Batch` is a ring of `slots` buffers of `slot_bytes` each (one `struct mmsghdr` and one `iovec` per slot,
and a control buffer per slot for the `SCM_TIMESTAMPNS` a receiver asked for).  The socket must be
connected (a sender) or bound (a receiver); no addresses are exchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket

import numpy as np
import numpy.typing as npt

MSG_DONTWAIT = 0x40
#: SCM_TIMESTAMPNS (= SO_TIMESTAMPNS on Linux): a `struct timespec` per datagram.
SCM_TIMESTAMPNS = 35
#: CMSG_SPACE(sizeof(struct timespec)) on 64-bit Linux: a 16-byte header, then the timespec.
CONTROL_BYTES = 32


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_Iovec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint32)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_Mmsghdr), ctypes.c_uint, ctypes.c_int]
_sendmmsg.restype = ctypes.c_int
_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_Mmsghdr), ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int


class Batch:
    """`slots` datagram buffers of `slot_bytes` each, for one socket."""

    def __init__(self, sock: socket.socket, slots: int, slot_bytes: int, control: bool = False) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"a batch needs slots >= 1 and slot_bytes >= 1, got {slots} x {slot_bytes}")
        self.fd = sock.fileno()
        self.slots, self.slot_bytes = slots, slot_bytes
        #: the datagrams: row i is slot i
        self.data = np.zeros((slots, slot_bytes), dtype=np.uint8)
        self.control = np.zeros((slots, CONTROL_BYTES), dtype=np.uint8) if control else None
        self._iov = (_Iovec * slots)()
        self._msgs = (_Mmsghdr * slots)()
        base = self.data.ctypes.data
        for i in range(slots):
            self._iov[i].base, self._iov[i].len = base + i * slot_bytes, slot_bytes
            hdr = self._msgs[i].hdr
            hdr.iov = ctypes.pointer(self._iov[i])
            hdr.iovlen = 1
        #: the mmsghdr array as bytes, to read lengths and reset control lengths without a loop per slot
        size = ctypes.sizeof(_Mmsghdr)
        flat = (ctypes.c_uint8 * (slots * size)).from_buffer(self._msgs)
        raw: npt.NDArray[np.uint8] = np.ctypeslib.as_array(flat)
        self._raw = raw.reshape(slots, size)
        self._len_at = _Mmsghdr.len.offset
        self._controllen_at = _Mmsghdr.hdr.offset + _Msghdr.controllen.offset
        if self.control is not None:
            for i in range(slots):
                self._msgs[i].hdr.control = self.control.ctypes.data + i * CONTROL_BYTES
            self._reset_control(slots)
        self._length = slot_bytes

    def _reset_control(self, count: int) -> None:
        at = self._controllen_at
        self._raw[:count, at : at + 8].view(np.uint64)[:, 0] = CONTROL_BYTES

    def send(self, count: int, length: int) -> tuple[int, int]:
        """Send slots 0..count-1, `length` bytes each: (sent, failed).  A datagram the kernel refuses
        (ENOBUFS, EAGAIN under load) is lost as a packet a NIC could not send, and the rest still go."""
        if length != self._length:
            for i in range(self.slots):
                self._iov[i].len = length
            self._length = length
        sent = failed = 0
        while sent + failed < count:
            start = sent + failed
            done = _sendmmsg(self.fd, ctypes.byref(self._msgs[start]), count - start, 0)
            if done < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                if err not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED, errno.EHOSTUNREACH,
                               errno.ENETUNREACH):  # fmt: skip
                    raise OSError(err, os.strerror(err))
                failed += 1
            else:
                sent += done
        return sent, failed

    def receive(self, fd: int | None = None) -> int:
        """Read what is waiting on this batch's socket (or on `fd`: one buffer can serve many sockets read
        one after another), up to `slots` datagrams, without blocking: how many (0 if none)."""
        got = _recvmmsg(self.fd if fd is None else fd, self._msgs, self.slots, MSG_DONTWAIT, None)
        if got < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, os.strerror(err))
        return int(got)

    def rearm(self, count: int) -> None:
        """After reading `count` datagrams: their control buffers may be written again."""
        if self.control is not None:
            self._reset_control(count)

    def lengths(self, count: int) -> npt.NDArray[np.int64]:
        """Bytes received in each of the first `count` slots."""
        at = self._len_at
        lengths: npt.NDArray[np.int64] = self._raw[:count, at : at + 4].view(np.uint32)[:, 0].astype(np.int64)
        return lengths

    def stamps(self, count: int) -> npt.NDArray[np.float64] | None:
        """The kernel's arrival time of each of the first `count` datagrams (seconds since the epoch), or
        None where a datagram carried no timestamp (the caller uses its own clock then)."""
        if self.control is None:
            return None
        ctl = self.control[:count]
        words = ctl.view(np.int64)  # cmsg_len, (level, type), tv_sec, tv_nsec
        level_type = ctl[:, 8:16].view(np.int32)
        at = self._controllen_at
        filled = self._raw[:count, at : at + 8].view(np.uint64)[:, 0] >= CONTROL_BYTES
        ok = (level_type[:, 0] == socket.SOL_SOCKET) & (level_type[:, 1] == SCM_TIMESTAMPNS) & filled
        if not ok.all():
            return None
        return np.asarray(words[:, 2] + words[:, 3] * 1e-9, dtype=np.float64)


__all__ = ["CONTROL_BYTES", "SCM_TIMESTAMPNS", "Batch"]
