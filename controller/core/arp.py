"""The answer to an ARP request, decided from the published state: who asked (a host sighting for the core)
and whether to reply, with which MAC.

Answered on the southbound's thread, at once — a host's first packet must not wait behind a recompute in
the worker's queue — so this is a pure function of what is already published (the address table, fixed
at start, and the partitions in force), not a core event.  A target in another tenant's partition is not
revealed (`controller.sm.isolation.arp_allowed`)."""

from __future__ import annotations

from typing import NamedTuple

from controller.core.events import HostSeen
from controller.sm.isolation import arp_allowed
from controller.sm.manager import SubnetContext
from controller.sm.partitions import Partitions


class ArpAnswer(NamedTuple):
    seen: HostSeen | None  # the asker, when its IP and MAC are a known host's: for the core
    reply_mac: int | None  # the target's MAC to answer with; None: no reply


def arp_answer(
    context: SubnetContext,
    partitions: Partitions | None,
    dpid: int,
    in_port: int,
    sender_ip: int,
    sender_mac: int,
    target_ip: int,
    now: float,
) -> ArpAnswer:
    addresses = context.addresses
    asker = addresses.by_ipv4.get(sender_ip)
    seen = HostSeen(asker.host, asker.port, dpid, in_port, now) if asker and asker.mac == sender_mac else None
    target = addresses.by_ipv4.get(target_ip)
    if target is None:
        return ArpAnswer(seen, None)
    switch = context.switch_of_dpid.get(dpid)
    if not arp_allowed(partitions, context.attached, switch, in_port, target.host):
        return ArpAnswer(seen, None)  # another tenant's address is not revealed
    return ArpAnswer(seen, target.mac)


__all__ = ["ArpAnswer", "arp_answer"]
