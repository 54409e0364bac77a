"""The controller's Prometheus metrics, read from published snapshots.

Two parts:

* `FabricCollector` builds gauges and counters at scrape time from the latest `Published` snapshot: routing
  generation and engine, switches connected and in sync, the switch ports' OpenFlow counters, link state
  and utilisation.  Nothing is copied or counted twice: the snapshot is the source.

  **Per tier by default, per port on request.**  A k=16 fat-tree has 5,120 switch ports and 3,072 links:
  one series per port and link was 4.4 MB and 0.4-2.8 s a scrape.  `/metrics` therefore sums the port
  counters per tier (`fabriclab_port_*_total{tier}`), counts the links up per tier
  (`fabriclab_link_up{tier}`) and gives each tier's hottest link direction
  (`fabriclab_link_utilisation_ratio{tier}`); `/metrics?detail=ports` has the same families with one
  series per switch port, link and direction (labels `switch`, `port`, `link`, `src`, `dst`, `tier`).
* `RecordFollower` turns the event log (`FabricState.records`, immutable `Record`s) into what needs history:
  events by kind, reroute and failover latency histograms, flow-mods sent.  It keeps a cursor (the last
  record id seen) and is fed from every scrape and by `Observer`'s thread a few times a second, so the log's
  bounded length (`MAX_RECORDS`) is never outrun in practice; if it ever were, the records it could not see
  are counted in `fabriclab_events_unobserved_total` rather than silently lost.

Names follow Prometheus conventions: `fabriclab_` prefix, base units (seconds, bytes, ratios), `_total` on
counters, labels `switch`, `port`, `tier`, `link`.  To add a family when its feature lands, add one line:

* per-queue counters (QoS): one `_port_counters` call over the queue stats with a `queue` label, e.g.
  `yield from _counters("fabriclab_queue", QUEUE_FIELDS, ("switch", "port", "tier", "queue"), rows)`;
* partition drops: `yield _counter("fabriclab_partition_drops_total", "...", ("pkey",), state.pkey_drops)`;

The routing policy is a label of the routing info (`policy`); policy changes and adaptive moves are event
kinds (`policy_change`, `adaptive_move`) like every other record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.core.state import Config, FabricState, Record, RecordKind
from controller.observe.model import Layout, link_key, link_utilisation
from controller.published import PortCounters, Published

#: Port counters exported per switch port: (metric name part, PortCounters field, help).
PORT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("receive_bytes", "rx_bytes", "Bytes received on a switch port (OpenFlow port stats)"),
    ("transmit_bytes", "tx_bytes", "Bytes transmitted on a switch port (OpenFlow port stats)"),
    ("receive_packets", "rx_packets", "Packets received on a switch port"),
    ("transmit_packets", "tx_packets", "Packets transmitted on a switch port"),
    ("receive_drops", "rx_dropped", "Packets dropped on receive at a switch port"),
    ("transmit_drops", "tx_dropped", "Packets dropped on transmit at a switch port"),
    ("receive_errors", "rx_errors", "Receive errors at a switch port"),
    ("transmit_errors", "tx_errors", "Transmit errors at a switch port"),
)
#: Records that carry reroute timings (detection -> computed / installed everywhere / old entries removed).
TIMED_KINDS = (RecordKind.PORT_DOWN, RecordKind.PORT_UP, RecordKind.SWITCH_CONNECT, RecordKind.ROUTING_CHANGE)
PHASES = (("computed", "computed_ms"), ("installed", "installed_ms"), ("cleaned", "cleaned_ms"))
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RecordFollower:
    """Counters and histograms fed by the event log, each record exactly once (by id)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Metrics unregistered by default: `FabricCollector` yields them right after feeding them."""
        self._lock = threading.Lock()
        self._last_id = 0
        self.events = Counter(
            "fabriclab_events", "Controller events logged, by kind", ["kind"], registry=registry
        )
        for kind in RecordKind:
            self.events.labels(kind.value)
        self.unobserved = Counter(
            "fabriclab_events_unobserved",
            "Events that left the bounded event log before metrics saw them (should stay 0)",
            registry=registry,
        )
        self.reroute = Histogram(
            "fabriclab_reroute_duration_seconds",
            "From detecting a change (port status, switch connection, operator request) to the new tables "
            "being computed / installed on every switch / the old entries removed",
            ["cause", "phase"],
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )
        for kind in TIMED_KINDS:
            for phase, _ in PHASES:
                self.reroute.labels(kind.value, phase)
        self.failover = Histogram(
            "fabriclab_failover_duration_seconds",
            "Link failures: from the port-down report to every switch holding tables that avoid the link "
            "(until then traffic relies on the switches' fast-failover groups)",
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.flow_mods = Counter(
            "fabriclab_flow_mods_sent",
            "OpenFlow flow and group modifications sent in rollouts",
            registry=registry,
        )
        self.switch_updates = Counter(
            "fabriclab_switch_updates", "Switches reprogrammed by rollouts", registry=registry
        )
        self.failed_switch_updates = Counter(
            "fabriclab_switch_update_failures",
            "Switches whose rollout failed (they are read back and fixed)",
            registry=registry,
        )

    def follow(self, records: Sequence[Record]) -> int:
        """Account for the records newer than the last seen; returns how many were new."""
        with self._lock:
            new: list[Record] = []
            for record in reversed(records):
                if record.id <= self._last_id:
                    break
                new.append(record)
            if not new:
                return 0
            new.reverse()
            missed = new[0].id - self._last_id - 1
            if missed > 0:
                self.unobserved.inc(missed)
            for record in new:
                self._account(record)
            self._last_id = new[-1].id
            return len(new)

    def collect(self) -> Iterator[Metric]:
        for metric in (
            self.events,
            self.unobserved,
            self.reroute,
            self.failover,
            self.flow_mods,
            self.switch_updates,
            self.failed_switch_updates,
        ):
            yield from metric.collect()

    def _account(self, record: Record) -> None:
        self.events.labels(record.kind.value).inc()
        if record.kind in TIMED_KINDS:
            for phase, field in PHASES:
                value = getattr(record, field)
                if value is not None:
                    self.reroute.labels(record.kind.value, phase).observe(value / 1000.0)
            if record.kind is RecordKind.PORT_DOWN and record.installed_ms is not None:
                self.failover.observe(record.installed_ms / 1000.0)
        if record.flow_mods:
            self.flow_mods.inc(record.flow_mods)
        if record.switches_updated:
            self.switch_updates.inc(record.switches_updated)
        if record.failed_switches:
            self.failed_switch_updates.inc(len(record.failed_switches))


def _gauge(name: str, doc: str, value: float, labels: Mapping[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _routing_labels(config: Config) -> dict[str, str]:
    return {
        "engine": config.engine,
        "fast_failover": str(config.options.fast_failover).lower(),
        "multipath": str(config.options.multipath).lower(),
        "policy": config.options.policy,
    }


def _counters(
    prefix: str,
    fields: Iterable[tuple[str, str, str]],
    label_names: Sequence[str],
    rows: Iterable[tuple[Sequence[str], Any]],
) -> Iterator[Metric]:
    """One counter family per field: `{prefix}_{name}_total`, a sample per row (labels, counters)."""
    rows = list(rows)
    for name, attribute, doc in fields:
        family = CounterMetricFamily(f"{prefix}_{name}", doc, labels=list(label_names))
        for labels, counters in rows:
            family.add_metric(list(labels), float(getattr(counters, attribute)))
        yield family


class FabricCollector(Collector):
    """Gauges and counters of one published snapshot (see the module docstring)."""

    def __init__(
        self,
        snapshot: Callable[[], Published],
        follower: RecordFollower,
        layout: Layout,
        capacity_factor: float = 1.0,
        detail: bool = False,
    ) -> None:
        """`detail`: a series per switch port, link and direction (else per tier)."""
        self.snapshot, self.follower, self.layout = snapshot, follower, layout
        self.capacity_factor, self.detail = capacity_factor, detail

    def collect(self) -> Iterator[Metric]:
        pub = self.snapshot()
        self.follower.follow(pub.state.records)
        yield from self.follower.collect()
        yield from self._routing(pub.state, pub)
        yield from self._switches(pub)
        yield from self._ports(pub)
        yield from self._links(pub)

    def _routing(self, state: FabricState, pub: Published) -> Iterator[Metric]:
        current = state.current
        yield _gauge(
            "fabriclab_controller_start_time_seconds", "When the controller started (epoch)", pub.started_at
        )
        yield _gauge(
            "fabriclab_routing_generation", "Generation of the current forwarding tables", state.generation
        )
        yield _gauge(
            "fabriclab_routing_info", "The routing in force (value 1)", 1, _routing_labels(state.config)
        )
        yield _gauge(
            "fabriclab_routing_verified",
            "1 if the current tables passed verification",
            float(bool(current and current.verification.ok)),
        )
        yield _gauge(
            "fabriclab_routing_in_sync",
            "1 if every connected switch holds the current tables",
            float(state.in_sync),
        )
        yield _gauge(
            "fabriclab_routing_lost_hosts",
            "Hosts the current tables cannot reach",
            len(current.lost_hosts) if current else 0,
        )
        yield _gauge(
            "fabriclab_state_age_seconds",
            "Seconds since the controller's worker last published",
            max(0.0, time.time() - pub.published_at),
        )

    def _switches(self, pub: Published) -> Iterator[Metric]:
        state, tiers = pub.state, self.layout.tiers
        names = [s.name for s in pub.context.declared.switches]
        yield _gauge("fabriclab_switches_declared", "Switches in the declared fabric", len(names))
        yield _gauge(
            "fabriclab_switches_connected", "Declared switches connected over OpenFlow", len(state.connected)
        )
        yield _gauge(
            "fabriclab_switches_in_sync",
            "Connected switches holding the current tables",
            len(state.connected & state.synced),
        )
        yield _gauge(
            "fabriclab_switches_unknown",
            "Connected datapaths that are not in the declared fabric",
            len(state.unknown_switches),
        )
        connected = GaugeMetricFamily(
            "fabriclab_switch_connected",
            "1 if the switch is connected over OpenFlow",
            labels=["switch", "tier"],
        )
        for name in names:
            connected.add_metric([name, tiers.of(name)], float(name in state.connected))
        yield connected

    def _ports(self, pub: Published) -> Iterator[Metric]:
        stats = pub.stats
        counters: Mapping[tuple[str, int], PortCounters] = stats.counters if stats is not None else {}
        tiers = self.layout.tiers
        if self.detail:
            rows = [((s, str(p), tiers.of(s)), c) for (s, p), c in sorted(counters.items())]
            yield from _counters("fabriclab_port", PORT_FIELDS, ("switch", "port", "tier"), rows)
        else:
            sums: dict[str, list[int]] = {}
            for (switch, _), c in counters.items():
                total = sums.setdefault(tiers.of(switch), [0] * len(PORT_FIELDS))
                for i, (_, attribute, _) in enumerate(PORT_FIELDS):
                    total[i] += getattr(c, attribute)
            tier_rows = [((tier,), _Summed(dict(zip((f[1] for f in PORT_FIELDS), values, strict=True))))
                         for tier, values in sorted(sums.items())]  # fmt: skip
            yield from _counters("fabriclab_port", PORT_FIELDS, ("tier",), tier_rows)
        if stats is not None:
            yield _gauge(
                "fabriclab_port_stats_timestamp_seconds", "When port counters were polled (epoch)", stats.at
            )

    def _links(self, pub: Published) -> Iterator[Metric]:
        context, tiers, detail = pub.context, self.layout.tiers, self.detail
        links = context.declared.links
        labels = ["link", "tier"] if detail else ["tier"]
        doc = "1 if both ends of the link are up" if detail else "Links with both ends up, per tier"
        up = GaugeMetricFamily("fabriclab_link_up", doc, labels=labels)
        counts: dict[str, float] = {}
        for index, link in enumerate(links):
            value = float(context.link_up(index, pub.state.ports_down))
            if detail:
                up.add_metric([link_key(link), tiers.of_link(link)], value)
            else:
                tier = tiers.of_link(link)
                counts[tier] = counts.get(tier, 0.0) + value
        for tier, count in sorted(counts.items()):
            up.add_metric([tier], count)
        yield up
        usage = link_utilisation(context.declared, pub.previous_stats, pub.stats, self.capacity_factor)
        family = GaugeMetricFamily(
            "fabriclab_link_utilisation_ratio",
            "Share of the link's capacity used from src to dst over the last polling interval"
            if detail
            else "The busiest link direction of the tier: share of its capacity used over the last interval",
            labels=["link", "src", "dst", "tier"] if detail else ["tier"],
        )
        hottest: dict[str, float] = {}
        for link, pair in zip(links, usage or [], strict=False):
            for (src, dst), ratio in zip(((link.a, link.b), (link.b, link.a)), pair, strict=True):
                if ratio is None:
                    continue
                if detail:
                    family.add_metric([link_key(link), src.node, dst.node, tiers.of_link(link)], ratio)
                else:
                    tier = tiers.of_link(link)
                    hottest[tier] = max(hottest.get(tier, 0.0), ratio)
        for tier, busiest in sorted(hottest.items()):
            family.add_metric([tier], busiest)
        yield family


class _Summed:
    """Port counters summed over a tier, read like `PortCounters` by `_counters`."""

    def __init__(self, values: Mapping[str, int]) -> None:
        self.__dict__.update(values)


class Observer:
    """Follows the published snapshots a few times a second on its own thread, so event counts never
    depend on how often Prometheus scrapes.  `start()`/`stop()` from the composition root."""

    def __init__(self, snapshot: Callable[[], Published], follower: RecordFollower, interval_s: float = 0.5):
        self.snapshot, self.follower, self.interval_s = snapshot, follower, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fabric-observer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.follower.follow(self.snapshot().state.records)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def controller_registry(
    snapshot: Callable[[], Published], layout: Layout, capacity_factor: float = 1.0
) -> tuple[CollectorRegistry, RecordFollower, CollectorRegistry]:
    """The registry `/metrics` serves (the fabric's metrics per tier; the REST layer adds its request
    latency to it), the event follower, and the registry of `/metrics?detail=ports` (the fabric's
    metrics per switch port and link; the same event counters)."""
    registry = CollectorRegistry()
    follower = RecordFollower()
    registry.register(FabricCollector(snapshot, follower, layout, capacity_factor))
    detailed = CollectorRegistry()
    detailed.register(FabricCollector(snapshot, follower, layout, capacity_factor, detail=True))
    return registry, follower, detailed


__all__ = [
    "PORT_FIELDS",
    "FabricCollector",
    "Observer",
    "RecordFollower",
    "controller_registry",
]
