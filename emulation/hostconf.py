"""Host interfaces configured in-process: setns plus raw rtnetlink, instead of a shell per host.

`lightnet.run_in_hosts` configures a host with `ip netns exec NAME sh -ec "..."`: a fork, an exec of `sh`,
and an exec of `ip`/`ethtool` per line — six processes per host, ~45 s for 1,024 hosts on two cores.  The
kernel work is a handful of netlink messages and one ioctl, so here one thread enters each host's network
namespace (`setns(CLONE_NEWNET)`), opens a NETLINK_ROUTE socket there (a socket belongs to the namespace it
was created in, so every request, and the ioctls made on it, address that host) and sends the messages
written with `struct`.  No third-party library: the handful of messages does not justify a dependency.

Per host, in this order (the same end state as the shell lines, checked by tests/test_hostconf.py):

1. `lo` up (loopback is always ifindex 1 in a namespace);
2. interface index by name (SIOCGIFINDEX on the namespace's socket);
3. IPv6 address generation off (IFLA_AF_SPEC/AF_INET6/IFLA_INET6_ADDR_GEN_MODE = NONE) while the link is
   still down, so no link-local address is ever generated;
4. any IPv6 address already there flushed (an interface that was up before: RTM_GETADDR dump, filtered by
   the kernel thanks to NETLINK_GET_STRICT_CHK, then RTM_DELADDR each);
5. TX checksum offload off: ETHTOOL_STXCSUM with 0 clears NETIF_F_CSUM_MASK|FCOE_CRC|SCTP_CRC from the
   wanted features — the same set `ethtool -K IF tx off` clears (all `tx-checksum-*`); the kernel then drops
   what depends on it (TSO, GSO), exactly as for the shell version;
6. MTU, if given;  7. the IPv4 address (IFA_LOCAL and IFA_ADDRESS, scope universe);  8. link up.

Namespaces are per thread, so other threads of the process never see the switch; the thread hops from
host to host and returns to its original namespace once, in a `finally`, whatever happens.
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x300, 0x200, 0x400
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 16, 20, 21, 22
IFLA_MTU, IFLA_AF_SPEC, IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE = 4, 26, 8, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFF_UP, LOOPBACK_IFINDEX = 0x1, 1
SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK, NETLINK_GET_STRICT_CHK = 270, 10, 11, 12
NLM_F_ACK_TLVS, NLMSGERR_ATTR_MSG = 0x200, 1
SIOCGIFINDEX, SIOCETHTOOL, ETHTOOL_STXCSUM = 0x8933, 0x8946, 0x17
_IFREQ_SIZE = 40
_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBi")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTA = struct.Struct("=HH")
_libc = ctypes.CDLL(None, use_errno=True)


class HostConfigError(RuntimeError):
    """A host could not be configured: which host, which step, and the kernel's reason."""

    def __init__(self, host: str, step: str, reason: str) -> None:
        super().__init__(f"host {host}: {step} failed: {reason}")
        self.host, self.step, self.reason = host, step, reason


@dataclass(frozen=True)
class HostIntf:
    """One host: its namespace (a path such as /run/netns/NAME) and the one interface to configure."""

    netns: str
    interface: str
    ipv4: str | None
    prefix_len: int
    mtu: int | None = None


def _attr(kind: int, payload: bytes) -> bytes:
    """One rtattr, padded to 4 bytes (the padding is not counted in its length)."""
    length = _RTA.size + len(payload)
    return _RTA.pack(length, kind) + payload + b"\0" * (-length % 4)


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + _RTA.size <= len(data):
        length, kind = _RTA.unpack_from(data, offset)
        if length < _RTA.size:
            return
        yield kind & 0x3FFF, data[offset + _RTA.size : offset + length]
        offset += (length + 3) & ~3


class _Netlink:
    """A NETLINK_ROUTE socket in the current namespace; one request at a time, each acknowledged."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        # Short acks (no echo of the request), the kernel's error text, kernel-side dump filtering.
        for option in (NETLINK_CAP_ACK, NETLINK_EXT_ACK, NETLINK_GET_STRICT_CHK):
            self.sock.setsockopt(SOL_NETLINK, option, 1)
        self.seq = 0

    def request(self, kind: int, body: bytes, flags: int = 0) -> list[tuple[int, bytes]]:
        """Send one message; return the dump's messages (type, payload), or [] once acked.  Raises OSError
        with the kernel's errno (and its extended-ack message, when it gives one)."""
        self.seq += 1
        flags |= NLM_F_REQUEST | NLM_F_ACK
        self.sock.send(_HDR.pack(_HDR.size + len(body), kind, flags, self.seq, 0) + body)
        replies: list[tuple[int, bytes]] = []
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + _HDR.size <= len(data):
                length, mtype, mflags, seq, _ = _HDR.unpack_from(data, offset)
                payload = data[offset + _HDR.size : offset + length]
                offset += (length + 3) & ~3
                if seq != self.seq:
                    continue
                if mtype not in (NLMSG_ERROR, NLMSG_DONE):
                    replies.append((mtype, payload))
                    continue
                (error,) = struct.unpack_from("=i", payload) if len(payload) >= 4 else (0,)
                if error == 0:
                    return replies
                message = os.strerror(-error)
                if mflags & NLM_F_ACK_TLVS:  # after the error and the (capped) request header
                    for kind_, value in _attrs(payload[4 + _HDR.size :]):
                        if kind_ == NLMSGERR_ATTR_MSG:
                            text = value.rstrip(b"\0").decode(errors="replace")
                            message += f" ({text})"
                raise OSError(-error, message)

    def ioctl(self, request: int, name: str, data: bytes) -> bytes:
        """An interface ioctl (struct ifreq) answered by this socket's namespace."""
        ifreq = struct.pack("16s", name.encode()) + data.ljust(_IFREQ_SIZE - 16, b"\0")
        return fcntl.ioctl(self.sock.fileno(), request, ifreq)

    def close(self) -> None:
        self.sock.close()


def _setlink(nl: _Netlink, index: int, flags: int = 0, change: int = 0, attrs: bytes = b"") -> None:
    nl.request(RTM_NEWLINK, _IFINFO.pack(socket.AF_UNSPEC, 0, index, flags, change) + attrs)


def _steps(nl: _Netlink, host: HostIntf) -> Iterator[str]:
    """Configure one host, yielding each step's name before doing it (so a failure is attributed to it)."""
    yield "lo up"
    _setlink(nl, LOOPBACK_IFINDEX, IFF_UP, IFF_UP)
    yield "interface index"
    if len(host.interface.encode()) >= 16:
        raise OSError(36, f"interface name too long: {host.interface!r}")
    (index,) = struct.unpack_from("=i", nl.ioctl(SIOCGIFINDEX, host.interface, b""), 16)
    yield "addrgenmode none"
    mode = _attr(IFLA_INET6_ADDR_GEN_MODE, bytes([IN6_ADDR_GEN_MODE_NONE]))
    _setlink(nl, index, attrs=_attr(IFLA_AF_SPEC, _attr(socket.AF_INET6, mode)))
    yield "ipv6 flush"
    dump = nl.request(RTM_GETADDR, _IFADDR.pack(socket.AF_INET6, 0, 0, 0, index), NLM_F_DUMP)
    for _, payload in dump:
        family, prefix_len, _, _, owner = _IFADDR.unpack_from(payload)
        address = dict(_attrs(payload[_IFADDR.size :])).get(IFA_ADDRESS)
        if family == socket.AF_INET6 and owner == index and address is not None:
            head = _IFADDR.pack(socket.AF_INET6, prefix_len, 0, 0, index)
            nl.request(RTM_DELADDR, head + _attr(IFA_ADDRESS, address))
    yield "tx checksum off"
    value = ctypes.create_string_buffer(struct.pack("=II", ETHTOOL_STXCSUM, 0))
    nl.ioctl(SIOCETHTOOL, host.interface, struct.pack("P", ctypes.addressof(value)))
    if host.mtu is not None:
        yield "mtu"
        _setlink(nl, index, attrs=_attr(IFLA_MTU, struct.pack("=I", host.mtu)))
    if host.ipv4 is not None:
        yield "ipv4 address"
        packed = ipaddress.IPv4Address(host.ipv4).packed
        body = _IFADDR.pack(socket.AF_INET, host.prefix_len, 0, 0, index)
        body += _attr(IFA_LOCAL, packed) + _attr(IFA_ADDRESS, packed)
        nl.request(RTM_NEWADDR, body, NLM_F_CREATE | NLM_F_EXCL)
    yield "link up"
    _setlink(nl, index, IFF_UP, IFF_UP)


def _enter(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def configure_hosts(hosts: Sequence[HostIntf]) -> None:
    """For each host: lo up; on its interface IPv6 address generation off (and any IPv6 address flushed),
    TX checksum offload off, MTU if given, the IPv4 address, link up.  Raises HostConfigError naming the
    host (the namespace's file name) and the step at the first failure, leaving later hosts untouched;
    always returns this thread to its original namespace (OSError if even that fails)."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        for host in hosts:
            name = os.path.basename(host.netns)
            step = "enter namespace"
            try:
                _enter(host.netns)
                nl = _Netlink()
                try:
                    for step in _steps(nl, host):  # noqa: B007 (the last name yielded is the failing step)
                        pass
                finally:
                    nl.close()
            except (OSError, ValueError, struct.error) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise HostConfigError(name, step, reason) from exc
    finally:
        try:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back to the original namespace failed: {os.strerror(err)}")
        finally:
            os.close(home)
