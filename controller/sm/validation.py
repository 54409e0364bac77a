"""Fabric validation: what link discovery (LLDP) and host sightings (ARP) saw, against the declared cabling.

Like `ibdiagnet`'s cabling check: every declared switch-to-switch link is `ok` (seen with the declared ports),
`down` (a port reports no link), `miswired` (a port of it was seen cabled to something else), `missing`
(both switches connected for longer than the grace period and nothing seen) or `pending` (too early to
tell).  Links seen but not declared are `unexpected`.  Host links cannot be probed (hosts do not speak
LLDP); a host's ARP arriving on a port is a sighting: `ok` on its declared port, `miswired` elsewhere,
`unverified` until it talks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from topologies.model import Fabric, PortRef

#: Seconds after both ends connected before a declared link that was never seen counts as missing.
DISCOVERY_GRACE_S = 5.0


@dataclass(frozen=True)
class Discovery:
    """What discovery has seen so far.  Immutable: every change returns a new value, so the controller can
    publish it to readers without locks."""

    connected_at: Mapping[str, float] = field(default_factory=dict)
    #: Seen one-way links: sending port -> (receiving port, last time seen).  A port has one cable.
    seen: Mapping[PortRef, tuple[PortRef, float]] = field(default_factory=dict)
    #: Host port sightings: (host, host port) -> (switch port where its packets arrived, time).
    hosts: Mapping[tuple[str, int], tuple[PortRef, float]] = field(default_factory=dict)

    def switch_connected(self, switch: str, now: float) -> Discovery:
        return replace(self, connected_at={**self.connected_at, switch: now})

    def switch_disconnected(self, switch: str) -> Discovery:
        connected = {k: v for k, v in self.connected_at.items() if k != switch}
        seen = {k: v for k, v in self.seen.items() if switch not in (k.node, v[0].node)}
        return replace(self, connected_at=connected, seen=seen)

    def forget_port(self, switch: str, port: int) -> Discovery:
        return self.forget_ports([PortRef(switch, port)])

    def forget_ports(self, refs: Iterable[PortRef]) -> Discovery:
        """Without any sighting to or from these ports: one pass for all of them (a switch lost at k=16
        takes 32 ports down, and a pass per port over the 4,096 sightings was 40 ms of the reroute)."""
        gone = set(refs)
        toward = self._toward
        senders = {sender for ref in gone for sender in toward.get(ref, ())}
        drop = (gone & self.seen.keys()) | senders
        if not drop:
            return self
        seen = dict(self.seen)
        for ref in drop:
            del seen[ref]
        return replace(self, seen=seen)

    @cached_property
    def _toward(self) -> dict[PortRef, list[PortRef]]:
        """Receiving port -> the ports seen sending to it (one, as `links_seen` keeps it)."""
        toward: dict[PortRef, list[PortRef]] = {}
        for src, (peer, _) in self.seen.items():
            toward.setdefault(peer, []).append(src)
        return toward

    def links_seen(self, sightings: Iterable[tuple[PortRef, PortRef, float]]) -> Discovery:
        """Record (from port, to port, time) sightings.  A port has one cable: a sighting replaces older ones
        that pair either of its ports with another port."""
        seen = dict(self.seen)
        toward: dict[PortRef, PortRef] = {peer: src for src, (peer, _) in seen.items()}
        for src, dst, now in sightings:
            for port in (src, dst):
                other = dst if port == src else src
                old = seen.get(port)
                if old is not None and old[0] != other:
                    toward.pop(old[0], None)
                    del seen[port]
                sender = toward.get(port)
                if sender is not None and sender != other:
                    seen.pop(sender, None)
                    del toward[port]
            seen[src] = (dst, now)
            toward[dst] = src
        return replace(self, seen=seen)

    def host_seen(self, host: str, host_port: int, at: PortRef, now: float) -> Discovery:
        return replace(self, hosts={**self.hosts, (host, host_port): (at, now)})

    def expire(self, now: float, ttl_s: float) -> Discovery:
        if all(now - t <= ttl_s for _, t in self.seen.values()):
            return self
        return replace(self, seen={k: v for k, v in self.seen.items() if now - v[1] <= ttl_s})

    def report(
        self,
        declared: Fabric,
        ports_down: Mapping[PortRef, float],
        now: float,
        grace_s: float = DISCOVERY_GRACE_S,
    ) -> dict[str, Any]:
        neighbours: dict[PortRef, set[PortRef]] = {}
        pairs = [(src, dst) for src, (dst, _) in self.seen.items()]
        for src, dst in pairs:
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
        unexpected = sorted({f"{min(s, d)}--{max(s, d)}" for s, d in pairs if (s, d) not in matched})
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
