"""Typed views of the controller's published state: the request and response bodies of the REST API.

Every response has a model here, so the OpenAPI document describes it; every view is built from one
`Published` snapshot (`controller.service`), never from live internals, so a response is consistent in
itself and never waits for the worker.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controller.published import PortCounters, Published
from controller.sm.policies import PolicyRegistry
from controller.sm.tables import Hop


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class Health(_Out):
    status: str = Field(description="'ok' once the first routing is computed")
    uptime_s: float
    switches_declared: int
    switches_connected: int
    in_sync: bool = Field(description="every connected switch holds exactly the current generation")
    generation: int
    engine: str
    routing_ok: bool
    threads: int
    failed_updates: int
    unknown_switches: list[str]
    state_age_s: float = Field(description="seconds since the worker last published its state")


class SwitchSummary(_Out):
    name: str
    dpid: str
    lid: int
    connected: bool


class HostView(_Out):
    name: str
    port: int
    lid: int
    mac: str
    ipv4: str
    attached_to: str


class CountersView(_Out):
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int


class LinkView(_Out):
    id: int
    a: str
    b: str
    bw_gbps: float
    up: bool
    a_counters: CountersView | None = None
    b_counters: CountersView | None = None
    counters_at: float | None = Field(None, description="when the counters were polled (epoch seconds)")


class FabricView(_Out):
    name: str
    engine: str
    generation: int
    switches: list[SwitchSummary]
    hosts: list[HostView]
    links: list[LinkView]


class SwitchView(_Out):
    name: str
    dpid: str
    connected: bool
    in_sync: bool
    ports_down: list[int]
    flows: int | None = Field(None, description="flows the switch holds (None: not read yet)")
    groups: int | None = None
    desired_flows: int
    desired_groups: int


class LftEntry(_Out):
    lid: int
    port: int
    dest: str


class LftView(_Out):
    switch: str
    generation: int
    engine: str
    entries: list[LftEntry]


class HopView(_Out):
    node: str
    in_port: int | None = Field(description="None at the sending host")
    out_port: int | None = Field(description="None at the receiving host")


class RouteView(_Out):
    src: str
    dst: str
    generation: int
    hops: list[HopView]
    path: str


class VerificationView(_Out):
    ok: bool
    unreachable_pairs: int
    loop_entries: int
    deadlock_free: bool | None
    alternatives_deadlock_free: bool | None = Field(
        None, description="also deadlock-free over every equal-cost alternative (failover, multipath)"
    )
    mean_hops: float
    max_hops: int


class RoutingView(_Out):
    engine: str
    engines: list[str]
    fast_failover: bool
    multipath: bool = Field(description="the routing policy uses equal-cost alternatives (not 'static')")
    policy: str = Field(description="routing policy: static, ecmp, spray or adaptive (see /routing/policy)")
    generation: int
    digest: str
    verification: VerificationView
    down_links: list[str]
    lost_hosts: list[str]


class RoutingUpdate(BaseModel):
    """Change the routing engine and/or forwarding options; omitted fields keep their value."""

    model_config = ConfigDict(extra="forbid", strict=True)
    engine: str | None = Field(None, max_length=64)
    fast_failover: bool | None = None
    multipath: bool | None = None
    dry_run: bool = False


class PolicyView(_Out):
    """The routing policy in force, what it means, and what adaptive routing has done."""

    policy: str
    summary: str
    multipath: bool = Field(description="uses the equal-cost alternatives")
    per_packet: bool = Field(description="senders vary the UDP source port per packet (expect reordering)")
    adaptive: bool
    interval_ms: int
    threshold: float
    hysteresis: float
    classes: dict[str, str] = Field(description='per-DSCP exceptions: {"26": "static"}')
    policies: list[str] = Field(description="available policies")
    generation: int
    slot_tables: int = Field(description="sets of equal-cost ports with a slot table, over all switches")
    samples: int = Field(description="counter samples handed to adaptive routing")
    moves: int = Field(description="slot moves made by adaptive routing")
    utilisation_at: float | None = Field(None, description="when the last sample was taken (epoch s)")
    hottest: list[str] = Field(description="the most utilised switch ports at the last sample")


class PolicyUpdate(BaseModel):
    """Choose the routing policy; omitted fields keep their value."""

    model_config = ConfigDict(extra="forbid", strict=True)
    policy: str | None = Field(None, max_length=32)
    interval_ms: int | None = Field(None, description="adaptive: counter polling interval, >= 10 ms")
    threshold: float | None = Field(None, description="adaptive: utilisation that makes traffic move, (0, 1]")
    hysteresis: float | None = Field(None, description="adaptive: moves stop/restore below threshold - this")
    classes: dict[str, str] | None = Field(
        None, max_length=64, description='per-DSCP exceptions, {"26": "static"}; {} clears them'
    )
    dry_run: bool = False


class DryRunResult(_Out):
    dry_run: bool
    engine: str
    verification_ok: bool
    switches_changed: int
    flow_mods: int


class EventView(_Out):
    """One controller event; fields that do not apply to its kind are left out."""

    model_config = ConfigDict(frozen=True, extra="allow")
    id: int
    kind: str
    at: float
    generation: int | None = None
    engine: str | None = None
    switch: str | None = None
    dpid: str | None = None
    ports: list[str] | None = None
    ports_down: list[int] | None = None
    detected_at: float | None = None
    computed_ms: float | None = None
    installed_ms: float | None = None
    cleaned_ms: float | None = None
    switches_updated: int | None = None
    flow_mods: int | None = None
    failed_switches: dict[str, str] | None = None
    verification_ok: bool | None = None
    lost_hosts: list[str] | None = None
    changed_destinations: int | None = None
    reason: str | None = None
    entries_lost: int | None = None
    policy: str | None = None
    moves: list[str] | None = None


class LinkStatus(_Out):
    link: str
    status: str
    seen: list[str] | None = None


class HostStatus(_Out):
    host: str
    declared: str
    status: str
    seen: str | None = None


class ValidationView(_Out):
    complete: bool
    connected_switches: int
    declared_switches: int
    summary: dict[str, int]
    links: list[LinkStatus]
    unexpected: list[str]
    hosts: list[HostStatus]
    hosts_miswired: int


# --- builders ----------------------------------------------------------------------------------------------


def health(pub: Published, now: float) -> Health:
    state = pub.state
    current = state.current
    return Health(
        status="ok" if current is not None else "starting",
        uptime_s=round(now - pub.started_at, 3),
        switches_declared=len(pub.context.dpids),
        switches_connected=len(state.connected),
        in_sync=state.in_sync,
        generation=state.generation,
        engine=state.config.engine,
        routing_ok=bool(current and current.verification.ok),
        threads=threading.active_count(),
        failed_updates=state.failed_updates,
        unknown_switches=sorted(f"{d:016x}" for d in state.unknown_switches),
        state_age_s=round(max(0.0, now - pub.published_at), 3),
    )


def links(pub: Published, counters: bool) -> list[LinkView]:
    context, state = pub.context, pub.state
    stats = pub.stats if counters else None
    result = []
    for index, link in enumerate(context.declared.links):
        entry: dict[str, Any] = {
            "id": index,
            "a": str(link.a),
            "b": str(link.b),
            "bw_gbps": link.bw_gbps,
            "up": context.link_up(index, state.ports_down),
        }
        if stats is not None:
            entry["counters_at"] = stats.at
            for side, ref in (("a_counters", link.a), ("b_counters", link.b)):
                found: PortCounters | None = stats.counters.get((ref.node, ref.port))
                entry[side] = CountersView(**found.__dict__) if found is not None else None
        result.append(LinkView(**entry))
    return result


def fabric(pub: Published) -> FabricView:
    context, state = pub.context, pub.state
    declared = context.declared
    return FabricView(
        name=declared.name,
        engine=state.config.engine,
        generation=state.generation,
        switches=[
            SwitchSummary(
                name=s.name,
                dpid=f"{s.guid:016x}",
                lid=context.lids.lid(s.name),
                connected=s.name in state.connected,
            )
            for s in declared.switches
        ],
        hosts=[
            HostView(
                name=a.host,
                port=a.port,
                lid=a.lid,
                mac=a.mac_str,
                ipv4=a.ipv4_str,
                attached_to=str(declared.peer(a.host, a.port)),
            )
            for a in context.addresses
        ],
        links=links(pub, counters=False),
    )


def switch(pub: Published, name: str) -> SwitchView:
    state = pub.state
    installed = state.installed.get(name)
    program = state.current.programs.get(name) if state.current else None
    return SwitchView(
        name=name,
        dpid=f"{pub.context.dpids[name]:016x}",
        connected=name in state.connected,
        in_sync=name in state.synced and name in state.connected,
        ports_down=sorted(r.port for r in state.ports_down if r.node == name),
        flows=len(installed.flows) if installed else None,
        groups=len(installed.groups) if installed else None,
        desired_flows=len(program.flows) if program else 0,
        desired_groups=len(program.groups) if program else 0,
    )


def policy(pub: Published, policies: PolicyRegistry) -> PolicyView:
    state = pub.state
    config = state.config
    made = policies.create(config.options.policy, config.policy_params)
    load = state.load
    hottest = sorted(load.utilisation.items(), key=lambda item: (-item[1], str(item[0])))[:5]
    return PolicyView(
        policy=made.name,
        summary=made.summary,
        multipath=made.multipath,
        per_packet=made.per_packet,
        adaptive=made.adaptive,
        interval_ms=config.policy_params.interval_ms,
        threshold=config.policy_params.threshold,
        hysteresis=config.policy_params.hysteresis,
        classes={str(dscp): name for dscp, name in config.options.classes},
        policies=policies.names(),
        generation=state.generation,
        slot_tables=state.current.slot_sets if state.current else 0,
        samples=load.samples,
        moves=load.moves,
        utilisation_at=load.at,
        hottest=[f"{ref} {util:.0%}" for ref, util in hottest],
    )


class PKeyMemberView(_Out):
    host: str | None = Field(None, description="a host of the fabric (absent for a GUID member)")
    guid: str | None = Field(None, description="a port GUID not (yet) on the fabric, 0x-prefixed")
    membership: str = Field(description="full, limited or both")


class PKeyView(_Out):
    name: str
    pkey: str = Field(description="the P_Key, 0x-prefixed (the membership bit not set)")
    ip_over_ib: bool | None = None
    mtu_limit: int | None = None
    rate_limit: float | None = None
    service_level: int | None = None
    scope: int | None = None
    members: list[PKeyMemberView]


class PKeysView(_Out):
    partitions: list[PKeyView]


class QosView(_Out):
    generation: int
    source: str = Field(description="where the running policy came from: default, file, rest, saved")
    policy: dict[str, Any] = Field(description="the running policy resolved against the fabric (docs/qos.md)")


class QosEventView(_Out):
    id: int
    time: float
    kind: str
    generation: int
    source: str
    changes: list[str] = Field(description="top-level sections of the policy that changed")


class QosPathView(_Out):
    src: str
    dst: str
    level: str = Field(description="the QoS level the pair's traffic matches")
    sl: int
    dscp: int | None = Field(description="the DSCP that marks the level's SL (None: not marked)")
    vl: int
    queue: int
    rate_limit_gbps: float | None
    generation: int
    classified_sl: int | None = Field(description="the SL a switch classifies that DSCP into")


def hops(path: list[Hop]) -> list[HopView]:
    return [HopView(node=h.node, in_port=h.in_port, out_port=h.out_port) for h in path]


__all__ = [
    "DryRunResult",
    "EventView",
    "FabricView",
    "Health",
    "LftEntry",
    "LftView",
    "LinkView",
    "PKeyMemberView",
    "PKeyView",
    "PKeysView",
    "PolicyUpdate",
    "PolicyView",
    "QosEventView",
    "QosPathView",
    "QosView",
    "RouteView",
    "RoutingUpdate",
    "RoutingView",
    "SwitchView",
    "ValidationView",
    "VerificationView",
]
