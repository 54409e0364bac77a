"""Fabric validation: what link discovery (LLDP) and host sightings (ARP) saw, against the declared cabling.

Like `ibdiagnet`'s cabling check: every declared switch-to-switch link is `ok` (seen with the declared ports),
`down` (a port reports no link), `miswired` (a port of it was seen cabled to something else), `missing`
(both switches connected for longer than the grace period and nothing seen) or `pending` (too early to
tell).  Links seen but not declared are `unexpected`.  Host links cannot be probed (hosts do not speak
LLDP); a host's ARP arriving on a port is a sighting: `ok` on its declared port, `miswired` elsewhere,
`unverified` until it talks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topologies.model import Fabric, PortRef

#: Seconds after both ends connected before a declared link that was never seen counts as missing.
DISCOVERY_GRACE_S = 5.0


@dataclass
class Discovery:
    declared: Fabric
    dpids: Mapping[str, int]
    connected_at: dict[str, float] = field(default_factory=dict)
    #: Seen one-way links: (from port, to port) -> last time seen.
    seen: dict[tuple[PortRef, PortRef], float] = field(default_factory=dict)
    #: Host port sightings: (host, host port) -> (switch port where its packets arrived, time).
    hosts: dict[tuple[str, int], tuple[PortRef, float]] = field(default_factory=dict)

    def switch_connected(self, switch: str, now: float) -> None:
        self.connected_at[switch] = now

    def switch_disconnected(self, switch: str) -> None:
        self.connected_at.pop(switch, None)
        self.seen = {k: v for k, v in self.seen.items() if switch not in (k[0].node, k[1].node)}

    def forget_port(self, switch: str, port: int) -> None:
        ref = PortRef(switch, port)
        self.seen = {k: v for k, v in self.seen.items() if ref not in k}

    def link_seen(self, src: PortRef, dst: PortRef, now: float) -> None:
        # A port has one cable: a sighting replaces older ones that involve either port with someone else.
        cable = {src, dst}
        self.seen = {k: v for k, v in self.seen.items() if set(k) == cable or not (set(k) & cable)}
        self.seen[(src, dst)] = now

    def host_seen(self, host: str, host_port: int, at: PortRef, now: float) -> None:
        self.hosts[(host, host_port)] = (at, now)

    def expire(self, now: float, ttl_s: float) -> None:
        self.seen = {k: t for k, t in self.seen.items() if now - t <= ttl_s}

    def complete(self, ports_down: Mapping[PortRef, float], now: float) -> bool:
        return bool(self.report(ports_down, now)["complete"])

    def report(
        self, ports_down: Mapping[PortRef, float], now: float, grace_s: float = DISCOVERY_GRACE_S
    ) -> dict[str, Any]:
        declared = self.declared
        neighbours: dict[PortRef, set[PortRef]] = {}
        for src, dst in self.seen:
            neighbours.setdefault(src, set()).add(dst)
            neighbours.setdefault(dst, set()).add(src)
        links: list[dict[str, Any]] = []
        matched: set[tuple[PortRef, PortRef]] = set()
        for link in declared.links:
            a, b = link.a, link.b
            if not (declared.nodes[a.node].is_switch and declared.nodes[b.node].is_switch):
                continue
            entry: dict[str, Any] = {"link": str(link)}
            wrong = sorted(
                f"{end} sees {other}"
                for end in (a, b)
                for other in neighbours.get(end, ())
                if other not in (a, b)
            )
            if a in ports_down or b in ports_down:
                entry["status"] = "down"
            elif b in neighbours.get(a, ()):
                entry["status"] = "ok"
                matched.update({(a, b), (b, a)})
            elif wrong:
                entry["status"] = "miswired"
                entry["seen"] = wrong
            elif a.node in self.connected_at and b.node in self.connected_at:
                since = max(self.connected_at[a.node], self.connected_at[b.node])
                entry["status"] = "missing" if now - since > grace_s else "pending"
            else:
                entry["status"] = "pending"
            links.append(entry)
        unexpected = sorted({f"{min(s, d)}--{max(s, d)}" for s, d in self.seen if (s, d) not in matched})
        hosts: list[dict[str, Any]] = []
        for link in declared.links:
            for host_end, switch_end in ((link.a, link.b), (link.b, link.a)):
                if not declared.nodes[host_end.node].is_host:
                    continue
                sighting = self.hosts.get((host_end.node, host_end.port))
                entry = {"host": str(host_end), "declared": str(switch_end)}
                if sighting is None:
                    entry["status"] = "unverified"
                elif sighting[0] == switch_end:
                    entry["status"] = "ok"
                else:
                    entry["status"] = "miswired"
                    entry["seen"] = str(sighting[0])
                hosts.append(entry)
        summary: dict[str, int] = {}
        for entry in links:
            summary[entry["status"]] = summary.get(entry["status"], 0) + 1
        bad_hosts = sum(1 for h in hosts if h["status"] == "miswired")
        complete = all(e["status"] in ("ok", "down") for e in links) and not unexpected and not bad_hosts
        return {
            "complete": complete,
            "connected_switches": len(self.connected_at),
            "declared_switches": len(declared.switches),
            "summary": summary,
            "links": links,
            "unexpected": unexpected,
            "hosts": hosts,
            "hosts_miswired": bad_hosts,
        }


__all__ = ["DISCOVERY_GRACE_S", "Discovery"]
