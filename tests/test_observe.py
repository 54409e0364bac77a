"""Metrics, the live view's data and the page over fake switches (no emulation): tiers and layout on
generated and imported fabrics, utilisation from two counter polls, each event counted once, frames that
carry what changed and no more often than allowed, a bounded number of streams, a page that ships its own
assets (or says how to build them), and the emulator's API opened to the controller's page only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.core.state import Record, RecordKind
from controller.observe import web
from controller.observe.live import LiveOptions, LiveView
from controller.observe.metrics import RecordFollower
from controller.observe.model import Layout, link_key, link_utilisation, per_mille
from controller.published import PortCounters, PortStats
from controller.rest.api import create_app
from emulation.api import create_app as create_emulator_app
from emulation.metrics import HeadroomReading, SwitchPort, emulator_registry
from tests.conftest import ROOT
from tests.observe_support import parse_metrics, require_bundle, total
from tests.test_rest_api import Rig
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.ibnet import load_ibnet
from topologies.tiers import Tiers


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    r.connect_all()
    yield r
    r.stop()


# --- tiers and layout --------------------------------------------------------------------------------------


def test_tiers_agree_between_generated_and_imported_fabrics() -> None:
    generated = Tiers(fat_tree(4))
    imported = Tiers(
        load_ibnet(ROOT / "tests" / "data" / "opensm-ft3-k4" / "fabric.net")
    )  # no tiers declared
    for tiers in (generated, imported):
        assert tiers.names == ("host", "leaf", "aggregation", "core")
        counts = [sum(1 for v in tiers.level.values() if v == i) for i in range(4)]
        assert counts == [16, 8, 8, 4]
        assert tiers.link_tiers() == ("host-leaf", "leaf-aggregation", "aggregation-core")
    assert Tiers(leaf_spine(4, 2, 4)).names == ("host", "leaf", "spine")


def test_layout_puts_rails_side_by_side_and_hosts_under_their_leaf() -> None:
    fabric = rail(servers=4, gpus=8, groups=2)
    layout = Layout(fabric)
    leaves = layout.rows[1]
    rails = [fabric.nodes[n].rail or 0 for n in leaves]
    assert rails == sorted(rails) and len(set(rails)) == 8  # rail 0's leaves of both groups, then rail 1's...
    x = {n: p.x for n, p in layout.placements.items()}
    assert all(0 < v < 1 for v in x.values())
    for host in fabric.hosts:
        (leaf,) = {p.node for r, (_, p) in fabric.port_map.items() if r.node == host.name}
        row = layout.rows[1]
        i = row.index(leaf)
        neighbours = [x[row[j]] for j in (i - 1, i + 1) if 0 <= j < len(row)]
        assert all(abs(x[host.name] - x[leaf]) < abs(n - x[leaf]) for n in neighbours)  # nearest its leaf


def test_large_fabrics_start_collapsed_by_pod() -> None:
    for k, collapsed in ((8, False), (16, True)):
        fabric = fat_tree(k)
        view = LiveView(lambda: None, Layout(fabric))._build_view()  # type: ignore[arg-type,return-value]
        assert view["collapsed"] is collapsed
        assert len(view["groups"]) == k
        assert (
            sum(len(g["members"]) for g in view["groups"]) == len(fabric.nodes) - (k // 2) ** 2
        )  # all but cores
        assert len(view["links"]) == len(fabric.links) and len(view["nodes"]) == len(fabric.nodes)


def _counters(tx: int, rx: int) -> PortCounters:
    return PortCounters(0, 0, rx, tx, 0, 0, 0, 0)


def test_utilisation_is_the_difference_of_two_polls_per_direction() -> None:
    fabric = fat_tree(4)
    host_link = next(
        k for k in fabric.links if fabric.nodes[k.a.node].is_host or fabric.nodes[k.b.node].is_host
    )
    host, leaf = (
        (host_link.a, host_link.b) if fabric.nodes[host_link.a.node].is_host else (host_link.b, host_link.a)
    )
    up = next(k for k in fabric.links if k.a.node.startswith("leaf") and k.b.node.startswith("agg"))
    at = {ref: (0, 0) for ref in fabric.port_map if fabric.nodes[ref.node].is_switch}
    before = PortStats(10.0, {(r.node, r.port): _counters(*v) for r, v in at.items()})
    later = dict(at)
    later[leaf] = (100_000_000 // 8, 400_000_000 // 8)  # 1 s: 100 Mb/s to the host, 400 Mb/s from it
    later[up.a] = (2_000_000_000 // 8, 0)
    after = PortStats(11.0, {(r.node, r.port): _counters(*v) for r, v in later.items()})
    usage = link_utilisation(fabric, before, after, factor=1.0)
    assert usage is not None
    index = fabric.links.index(host_link)
    from_host = 400e6 / 400e9
    to_host = 100e6 / 400e9
    expected = (from_host, to_host) if host_link.a == host else (to_host, from_host)
    assert usage[index] == pytest.approx(expected)
    assert usage[fabric.links.index(up)] == pytest.approx((2e9 / 400e9, 0.0))
    scaled = link_utilisation(fabric, before, after, factor=200e-3 / 400)  # 400G=200M
    assert scaled is not None and scaled[fabric.links.index(up)][0] == pytest.approx(
        10.0
    )  # 2 Gb/s on 200 Mb/s
    assert link_utilisation(fabric, None, after) is None and link_utilisation(fabric, after, after) is None
    flat = per_mille(usage)
    assert len(flat) == 2 * len(fabric.links) and flat[2 * fabric.links.index(up)] == 5
    missing = PortStats(12.0, {})
    assert link_utilisation(fabric, after, missing) == [(None, None)] * len(fabric.links)


# --- metrics -----------------------------------------------------------------------------------------------


def _record(i: int, kind: RecordKind, **fields: object) -> Record:
    return Record(id=i, kind=kind, at=float(i), **fields)  # type: ignore[arg-type]


def test_each_record_is_counted_once_and_gaps_are_counted_not_hidden() -> None:
    follower = RecordFollower()
    records = [_record(1, RecordKind.ROUTING_COMPUTED), _record(2, RecordKind.PORT_DOWN, installed_ms=12.0,
               computed_ms=3.0, cleaned_ms=15.0, flow_mods=40, switches_updated=6)]  # fmt: skip
    assert follower.follow(records) == 2
    assert follower.follow(records) == 0  # the same snapshot again: nothing twice
    later = [
        *records,
        _record(5, RecordKind.PORT_UP, installed_ms=8.0, flow_mods=10, failed_switches={"x": "y"}),
    ]
    assert follower.follow(later[-1:]) == 1  # 3 and 4 left the log before they were seen
    samples = parse_metrics("\n".join(_exposition(follower)))
    assert total(samples, "fabriclab_events_total", kind="port_down") == 1
    assert total(samples, "fabriclab_events_total") == 3
    assert total(samples, "fabriclab_events_unobserved_total") == 2
    assert total(samples, "fabriclab_failover_duration_seconds_count") == 1
    assert total(samples, "fabriclab_failover_duration_seconds_sum") == pytest.approx(0.012)
    assert total(samples, "fabriclab_reroute_duration_seconds_count", cause="port_up", phase="installed") == 1
    assert total(samples, "fabriclab_flow_mods_sent_total") == 50
    assert total(samples, "fabriclab_switch_update_failures_total") == 1


def _exposition(follower: RecordFollower) -> list[str]:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(follower)
    return [generate_latest(registry).decode()]


def test_metrics_endpoint_follows_the_published_state(rig: Rig) -> None:
    rig.client.get("/api/v1/switches/leaf1")
    rig.client.get("/api/v1/switches/nope")
    rig.client.get("/no/such/path/12345")
    before = parse_metrics(rig.client.get("/metrics").text)
    assert total(before, "fabriclab_switches_connected") == 20
    assert total(before, "fabriclab_switch_connected", tier="core") == 4
    assert total(before, "fabriclab_link_up") == 48
    assert total(before, "fabriclab_events_total", kind="switch_connect") == 20
    assert total(before, "fabriclab_routing_verified") == 1
    latency = {
        dict(lbl).get("route") for (n, lbl) in before if n == "fabriclab_http_request_duration_seconds_count"
    }
    assert {"/api/v1/switches/{name}", "unmatched"} <= latency  # templates, never raw paths
    assert not any("nope" in r or "12345" in r for r in latency if r)
    assert total(before, "fabriclab_http_request_duration_seconds_count", code="404") == 2
    index = 20  # a leaf-aggregation link
    link = rig.service.context.declared.links[index]
    rig.cut(index)
    after = parse_metrics(rig.client.get("/metrics").text)
    detail = parse_metrics(rig.client.get("/metrics?detail=ports").text)
    assert total(detail, "fabriclab_link_up", link=link_key(link)) == 0
    assert total(after, "fabriclab_link_up") == total(before, "fabriclab_link_up") - 1  # counted per tier
    assert total(after, "fabriclab_events_total", kind="port_down") == 1
    assert total(after, "fabriclab_failover_duration_seconds_count") == 1
    assert total(after, "fabriclab_flow_mods_sent_total") > total(before, "fabriclab_flow_mods_sent_total")
    assert total(after, "fabriclab_routing_generation") == total(before, "fabriclab_routing_generation") + 1
    assert total(after, "fabriclab_port_receive_bytes_total", tier="leaf") >= 0  # families present per tier


# --- the live view -----------------------------------------------------------------------------------------


def test_view_describes_every_node_and_link(rig: Rig) -> None:
    view = rig.client.get("/api/v1/view").json()
    fabric = rig.service.context.declared
    assert [n["name"] for n in view["nodes"]] == list(fabric.nodes)
    keys = {
        f"{view['nodes'][a]['name']}:{ap}-{view['nodes'][b]['name']}:{bp}"
        for a, ap, b, bp, *_ in view["links"]
    }
    assert keys == {link_key(k) for k in fabric.links}
    assert view["levels"] == ["host", "leaf", "aggregation", "core"] and view["collapsed"] is False
    assert view["engine"] == "ftree" and "ftree" in view["engines"] and view["token_required"] is False


async def _messages(live: LiveView, count: int, since: int = 0) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stream = live.stream(since)
    try:
        async for chunk in stream:
            text = chunk.decode()
            if text.startswith("id:"):
                found.append(json.loads(text.split("data: ", 1)[1]))
                if len(found) == count:
                    break
    finally:
        await stream.aclose()
    return found


def test_frames_carry_failures_and_new_events_once(rig: Rig) -> None:
    clock = [1000.0]
    live = LiveView(rig.service.snapshot, Layout(rig.service.context.declared), options=LiveOptions(0.05),
                    clock=lambda: clock[0])  # fmt: skip
    (first,) = asyncio.run(_messages(live, 1))
    assert first["down"] == [] and first["connected"] == 20
    events = first["events"]
    assert isinstance(events, list) and len(events) == 21  # routing computed + 20 switches
    last = int(events[-1]["id"])
    rig.cut(20)
    clock[0] += 0.1  # past the frame interval: the next frame is built from the new snapshot
    (second,) = asyncio.run(_messages(live, 1, since=last))
    assert second["down"] == [20]
    events = second["events"]
    assert isinstance(events, list) and [e["kind"] for e in events] == ["port_down"]
    assert live.clients == 0  # closed streams give their place back


def test_frames_are_built_at_most_once_per_interval_whatever_the_clients(rig: Rig) -> None:
    live = LiveView(rig.service.snapshot, Layout(rig.service.context.declared), options=LiveOptions(0.5))
    first = live.frame(now=100.0)
    rig.cut(20)  # a new snapshot
    assert live.frame(now=100.2) is first  # too soon: the same frame for everyone
    newer = live.frame(now=100.6)
    assert newer.seq == first.seq + 1 and json.loads(newer.state_json)["down"] == [20]
    assert live.frame(now=105.0) is newer  # nothing changed: nothing rebuilt
    assert live.frames_built == 2


def test_streams_are_capped(rig: Rig) -> None:
    obs = web.Observability.for_service(rig.service.snapshot, options=LiveOptions(max_clients=0))
    client = TestClient(create_app(rig.service, None, None, obs))
    busy = client.get("/api/v1/view/stream")
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "5"


def test_page_ships_its_own_assets(rig: Rig) -> None:
    require_bundle()
    page = rig.client.get("/")
    assert page.status_code == 200
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp
    assert 'src="/ui/dist/fabric-view.js"' in page.text and "http" not in page.text.split("<body>")[0]
    script = rig.client.get("/ui/dist/fabric-view.js")
    assert script.status_code == 200 and len(script.content) > 10_000
    licences = rig.client.get("/ui/dist/THIRD-PARTY-LICENSES.txt").text
    assert "d3-selection" in licences and "ISC" in licences


def test_page_without_its_bundle_says_how_to_build_it(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web, "BUNDLE", Path("/nonexistent/fabric-view.js"))
    page = rig.client.get("/")
    assert page.status_code == 503 and web.BUILD_HINT in page.text


# --- the emulator's side -----------------------------------------------------------------------------------


def test_emulator_api_is_open_to_the_controllers_page_only() -> None:
    app = create_emulator_app(lambda a, t: f"{a} {t}", {}, "tok", ("127.0.0.1", 8081), None,
                              ["http://127.0.0.1:8080"])  # fmt: skip
    client = TestClient(app, base_url="http://127.0.0.1:8081")
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = client.options("/api/v1/faults", headers={"Origin": "http://127.0.0.1:8080", **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://127.0.0.1:8080"
    evil = client.options("/api/v1/faults", headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in evil.headers
    body = '{"action": "link_down", "target": "leaf1:3"}'
    headers = {"Origin": "http://127.0.0.1:8080", "Content-Type": "application/json"}
    assert (
        client.post("/api/v1/faults", content=body, headers=headers).status_code == 401
    )  # still needs the token
    done = client.post("/api/v1/faults", content=body, headers={**headers, "Authorization": "Bearer tok"})
    assert done.status_code == 200 and done.headers["access-control-allow-origin"] == "http://127.0.0.1:8080"
    assert "fabriclab_http_request_duration_seconds_count" in client.get("/metrics").text


def test_emulator_metrics_read_interfaces_and_export_headroom() -> None:
    ports = [SwitchPort("leaf1", 1, "leaf", "lo"), SwitchPort("leaf1", 2, "leaf", "no-such-intf")]
    readings = [HeadroomReading("max_pps", "packets/s forwarded without loss", 12345.0),
                HeadroomReading("Bad-Name", "refused", 1.0)]  # fmt: skip
    registry, collector = emulator_registry(ports, [lambda: readings])
    from prometheus_client import generate_latest

    samples = parse_metrics(generate_latest(registry).decode())
    assert (
        "fabriclab_emulator_port_receive_bytes_total",
        (("port", "1"), ("switch", "leaf1"), ("tier", "leaf")),
    ) in samples
    assert total(samples, "fabriclab_emulator_port_receive_bytes_total", port="2") == 0  # absent: no sample
    assert total(samples, "fabriclab_emulator_headroom_max_pps") == 12345.0
    assert not any("Bad" in name for name, _ in samples)
    assert total(samples, "fabriclab_emulator_cpus") >= 1
    collector.add_headroom(lambda: [HeadroomReading("max_pps", "a second source of the same name", 1.0)])
    again = parse_metrics(generate_latest(registry).decode())
    assert total(again, "fabriclab_emulator_headroom_max_pps") == 12345.0  # the first source wins


def test_metrics_are_per_tier_by_default_and_per_port_on_request_k16() -> None:
    """At k=16 (5,120 switch ports, 3,072 links) a series per port and link was 4.4 MB a scrape: the default
    sums the port counters and counts the links up per tier, with the same family names; the per-entity
    series are one query away, and their sums are the default's."""
    import time as clock

    from prometheus_client import generate_latest

    from controller.core.events import Start
    from controller.core.fabric import FabricCore
    from controller.observe.metrics import controller_registry
    from controller.published import Published
    from controller.sm.manager import SubnetContext

    fabric = fat_tree(16)
    context = SubnetContext.build(fabric)
    core = FabricCore(context)
    state = core.handle(core.initial_state(), clock.time(), Start()).state
    ports = [(r.node, r.port) for r in fabric.port_map if fabric.nodes[r.node].is_switch]

    def stats(at: float, scale: int) -> PortStats:
        return PortStats(at, {p: _counters(scale * (i + 1), scale * (i + 2)) for i, p in enumerate(ports)})

    pub = Published(context, state, stats(1.0, 1000), 0.0, 1.0, stats(0.0, 10))
    registry, _, detailed = controller_registry(lambda: pub, Layout(fabric))
    default_text, detail_text = generate_latest(registry), generate_latest(detailed)
    assert len(default_text) < 600_000 < len(detail_text)
    default, detail = parse_metrics(default_text.decode()), parse_metrics(detail_text.decode())
    family = "fabriclab_port_transmit_bytes_total"
    assert {dict(lbl).get("switch") for n, lbl in default if n == family} == {None}  # no per-port series
    assert len({lbl for n, lbl in detail if n == family}) == len(ports) == 5120
    for tier in ("leaf", "aggregation", "core"):
        assert total(default, family, tier=tier) == total(detail, family, tier=tier) > 0
    for tier in ("leaf-aggregation", "aggregation-core"):  # links between switches (host links: no stats)
        assert total(default, "fabriclab_link_up", tier=tier) == total(detail, "fabriclab_link_up", tier=tier)
        hottest = max(v for (n, lbl), v in detail.items()
                      if n == "fabriclab_link_utilisation_ratio" and ("tier", tier) in lbl)  # fmt: skip
        assert total(default, "fabriclab_link_utilisation_ratio", tier=tier) == hottest
    assert total(default, "fabriclab_link_up") == len(fabric.links)


def test_metrics_detail_must_be_ports(rig: Rig) -> None:
    answer = rig.client.get("/metrics?detail=everything")
    assert answer.status_code == 422 and answer.json()["field"] == "detail"
    assert rig.client.get("/metrics?detail=ports").status_code == 200
