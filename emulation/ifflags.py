"""Set an interface up or down with one ioctl (`SIOCSIFFLAGS`), in this process's network namespace.

`ip link set IF down` costs a process (~2-3 ms to start on this machine) before the kernel sees anything:
a failover benchmark that times a cut from before that spawn counts it as outage, and a drill that flaps
links at a fixed pace loses the pace on a busy machine.  The ioctl acts at once.
"""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def set_up(interface: str, up: bool) -> None:
    """Administratively up or down; on a veth, the peer loses (or regains) its carrier."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", interface.encode(), 0)
        flags = struct.unpack_from("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        flags = flags | IFF_UP if up else flags & ~IFF_UP
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", interface.encode(), flags))


__all__ = ["set_up"]
