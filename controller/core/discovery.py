"""Discovery inputs of the decision core: LLDP sightings of cables and hosts seen at switch ports, folded
into the immutable `Discovery` of the state (`controller.sm.validation`)."""

from __future__ import annotations

from controller.core.events import HostSeen, LinksSeen, LogLevel
from controller.core.step import Builder
from controller.sm.manager import SubnetContext
from topologies.model import PortRef


def links_seen(context: SubnetContext, step: Builder, event: LinksSeen) -> None:
    """LLDP sightings into discovery; a cable seen where the topology declares another is warned once."""
    names = context.switch_of_dpid
    sightings = []
    warned = set(step.state.warned_cables)
    for s in event.sightings:
        if s.src_dpid not in names or s.dst_dpid not in names:
            continue
        src, dst = PortRef(names[s.src_dpid], s.src_port), PortRef(names[s.dst_dpid], s.dst_port)
        sightings.append((src, dst, s.at))
        declared = context.declared.peer(src.node, src.port)
        if declared != dst and (src, dst) not in warned:
            warned.add((src, dst))
            step.log(LogLevel.WARNING, f"cabling: {src} sees {dst}, declared peer is {declared or 'nothing'}")
    step.update(discovery=step.state.discovery.links_seen(sightings), warned_cables=frozenset(warned))


def host_seen(context: SubnetContext, step: Builder, event: HostSeen) -> None:
    """A host's frame at a switch port: where the host is cabled, as discovery sees it."""
    switch = context.switch_of_dpid.get(event.dpid)
    if switch is not None:
        at = PortRef(switch, event.in_port)
        step.update(discovery=step.state.discovery.host_seen(event.host, event.host_port, at, event.at))


__all__ = ["host_seen", "links_seen"]
