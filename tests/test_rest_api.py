"""REST API and service behaviour over fake switches: views, routing changes, errors that change nothing,
tokens, events with timings, validation, restart without churn, and recovery from a failed update."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.core.state import FabricState
from controller.rest.api import create_app
from controller.service import FabricService
from controller.statestore import StateStore
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.generators import fat_tree


class Rig:
    def __init__(self, state_dir: Path, token: str | None = None, fake: FakeFabric | None = None) -> None:
        fabric = fat_tree(4)
        self.service = FabricService.for_fabric(fabric, StateStore(state_dir), lldp_interval_s=3600)
        self.fake = fake or FakeFabric(fabric, self.service.context.addresses)
        self.sb = FakeSouthbound(self.fake, self.service)
        self.service.start(self.sb)
        self.client = TestClient(create_app(self.service, token))

    @property
    def state(self) -> FabricState:
        return self.service.snapshot().state

    def put(self, body: str, **headers: str) -> Any:
        return self.client.put(
            "/api/v1/routing", content=body, headers={"Content-Type": "application/json", **headers}
        )

    def connect_all(self) -> None:
        for dpid in sorted(self.sb.dpids.values()):
            self.sb.up.add(dpid)
            self.service.switch_connected(dpid, 0.0)
        self.settle()

    def settle(self) -> None:
        self.service.sync()

    def cut(self, index: int, up: bool = False) -> None:
        for end in self.fake.set_link(index, up=up):
            self.service.port_status(self.sb.dpids[end.node], end.port, up, 1.0)
        self.settle()

    def stop(self) -> None:
        self.service.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    r.connect_all()
    yield r
    r.stop()


def test_fabric_switches_and_lft_views(rig: Rig) -> None:
    fabric = rig.client.get("/api/v1/fabric").json()
    assert len(fabric["switches"]) == 20 and all(s["connected"] for s in fabric["switches"])
    assert {h["name"] for h in fabric["hosts"]} == {f"h{i}" for i in range(1, 17)}
    h1 = next(h for h in fabric["hosts"] if h["name"] == "h1")
    assert h1["ipv4"] == f"10.0.0.{h1['lid']}" and h1["mac"].startswith("02:fa:b1:00:")
    lft = rig.client.get("/api/v1/switches/leaf1/lft").json()
    assert len(lft["entries"]) == 16 + 20
    assert rig.client.get("/api/v1/switches/nope/lft").status_code == 404
    switches = rig.client.get("/api/v1/switches").json()
    assert all(s["flows"] == s["desired_flows"] and s["flows"] > 0 for s in switches)
    health = rig.client.get("/api/v1/health").json()
    assert health["in_sync"] and health["switches_connected"] == 20 and health["routing_ok"]
    rig.fake.assert_delivers(rig.fake.all_pairs())


def test_routes_follow_the_installed_tables(rig: Rig) -> None:
    body = rig.client.get("/api/v1/routes", params={"src": "h1", "dst": "h16"}).json()
    nodes = [h["node"] for h in body["hops"]]
    assert nodes[0] == "h1" and nodes[-1] == "h16" and len(nodes) == 7
    trace = rig.fake.trace("h1", "h16")
    assert [p.split(">")[1] for p in trace[1:-1]] == nodes[1:-1]
    bad = rig.client.get("/api/v1/routes", params={"src": "h1", "dst": "h99"})
    assert bad.status_code == 404 and bad.json()["field"] == "dst"
    missing = rig.client.get("/api/v1/routes", params={"src": "h1"})
    assert missing.status_code == 422 and missing.json()["field"] == "dst"


def test_routing_change_reprograms_and_persists(rig: Rig, tmp_path: Path) -> None:
    before = rig.state.generation
    response = rig.put(json.dumps({"engine": "sssp"}))
    assert response.status_code == 200, response.text
    event = response.json()
    assert event["kind"] == "routing_change" and event["generation"] == before + 1 and event["flow_mods"] > 0
    assert rig.client.get("/api/v1/routing").json()["engine"] == "sssp"
    assert json.loads((tmp_path / "controller-state.json").read_text())["engine"] == "sssp"
    rig.fake.assert_delivers(rig.fake.all_pairs())
    assert rig.state.in_sync


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ('{"engine": "nope"}', 400, "engine"),
        ('{"engin": "sssp"}', 422, "engin"),
        ('{"multipath": "yes"}', 422, "multipath"),
        ('{"engine": 3}', 422, "engine"),
        ("[1, 2]", 422, None),
        ("not json", 400, None),
    ],
)
def test_bad_bodies_are_rejected_whole_and_change_nothing(
    rig: Rig, tmp_path: Path, body: str, status: int, field: str | None
) -> None:
    state = (tmp_path / "controller-state.json").read_text()
    generation, pushes = rig.state.generation, rig.sb.pushes
    response = rig.put(body)
    assert response.status_code == status
    assert response.json()["field"] == field and response.json()["error"]
    assert rig.state.generation == generation and rig.sb.pushes == pushes
    assert (tmp_path / "controller-state.json").read_text() == state


def test_dry_run_reports_without_changing(rig: Rig) -> None:
    generation = rig.state.generation
    report = rig.put('{"engine": "minhop", "dry_run": true}').json()
    assert report["dry_run"] and report["flow_mods"] > 0
    assert rig.state.generation == generation and rig.state.config.engine == "ftree"


def test_token_guards_mutations_only(tmp_path: Path) -> None:
    r = Rig(tmp_path, token="s3cret")
    try:
        assert r.client.get("/api/v1/routing").status_code == 200
        denied = r.put('{"engine": "updn"}')
        assert denied.status_code == 401 and denied.json()["field"] == "Authorization"
        assert denied.headers["WWW-Authenticate"] == "Bearer"
        wrong = r.put('{"engine": "updn"}', Authorization="Bearer x")
        assert wrong.status_code == 401 and r.state.config.engine == "ftree"
        ok = r.put('{"engine": "updn"}', Authorization="Bearer s3cret")
        assert ok.status_code == 200 and r.state.config.engine == "updn"
    finally:
        r.stop()


def test_link_failure_event_has_timings_and_reroutes(rig: Rig) -> None:
    link = next(i for i, lk in enumerate(rig.fake.fabric.links) if lk.a.node == "agg1" or lk.b.node == "agg1")
    since = rig.state.records[-1].id
    rig.cut(link)
    events = rig.client.get("/api/v1/events", params={"since": since}).json()
    down = [e for e in events if e["kind"] == "port_down"]
    assert len(down) == 1, events  # both ends coalesced or the second is a no-op
    assert down[0]["cleaned_ms"] >= down[0]["installed_ms"] >= down[0]["computed_ms"] >= 0
    assert down[0]["flow_mods"] > 0
    links = rig.client.get("/api/v1/links").json()
    assert [lk["up"] for lk in links].count(False) == 1 and all("b_counters" in lk for lk in links)
    rig.fake.assert_delivers(rig.fake.all_pairs())
    rig.cut(link, up=True)
    assert rig.client.get("/api/v1/events").json()[-1]["kind"] == "port_up"
    assert rig.state.in_sync


def test_validation_report_after_discovery(rig: Rig) -> None:
    report = rig.client.get("/api/v1/validation").json()
    assert report["complete"] and report["summary"] == {"ok": 32}
    leaf1, agg2 = rig.sb.dpids["leaf1"], rig.sb.dpids["agg2"]
    rig.service.link_seen(leaf1, 3, agg2, 4, 5.0)  # leaf1:3 is declared to go to agg1:1
    report = rig.client.get("/api/v1/validation").json()
    assert not report["complete"] and report["summary"]["miswired"] >= 1 and report["unexpected"]


def test_restart_reconciles_without_rewriting(tmp_path: Path) -> None:
    first = Rig(tmp_path)
    first.connect_all()
    assert first.put('{"engine": "sssp"}').status_code == 200
    fake = first.fake
    first.stop()
    second = Rig(tmp_path, fake=fake)
    try:
        assert second.state.config.engine == "sssp"
        messages = sum(s.messages for s in fake.switches.values())
        second.connect_all()
        assert sum(s.messages for s in fake.switches.values()) == messages  # nothing rewritten
        connects = [r for r in second.state.records if r.kind == "switch_connect"]
        assert len(connects) == 20 and all(r.flow_mods == 0 for r in connects)
        assert second.state.in_sync
    finally:
        second.stop()


def test_stale_and_foreign_entries_are_removed_on_connect(tmp_path: Path) -> None:
    r = Rig(tmp_path)
    try:
        from controller.sm.intents import FlowIntent, match

        junk = FlowIntent(0, 5, match(eth_dst=0x0200000000AA), (("output", 1),), 0x1234)
        r.fake.switches["leaf1"].add_flow(junk)
        r.connect_all()
        assert junk.key not in r.fake.switches["leaf1"].flows
        assert r.state.in_sync
    finally:
        r.stop()


def test_a_failed_update_is_repaired_by_reading_the_switch_back(rig: Rig) -> None:
    rig.sb.fail_next.update(rig.sb.dpids.values())
    response = rig.put('{"engine": "minhop"}').json()
    assert response["failed_switches"]
    rig.settle()
    assert rig.state.in_sync
    rig.fake.assert_delivers(rig.fake.all_pairs())


def test_unknown_paths_answer_in_the_same_error_format(rig: Rig) -> None:
    response = rig.client.get("/api/v1/nothing-here")
    assert response.status_code == 404 and response.json() == {"error": "Not Found", "field": None}


def test_openapi_documents_every_endpoint(rig: Rig) -> None:
    paths = rig.client.get("/openapi.json").json()["paths"]
    for path in (
        "health",
        "fabric",
        "switches",
        "switches/{name}/lft",
        "links",
        "routes",
        "routing",
        "validation",
        "events",
    ):
        assert f"/api/v1/{path}" in paths
    assert "requestBody" in paths["/api/v1/routing"]["put"]
    assert rig.client.get("/docs").status_code == 200


def test_policy_view_change_dry_run_and_legacy_multipath(rig: Rig) -> None:
    view = rig.client.get("/api/v1/routing/policy").json()
    assert view["policy"] == "static" and view["policies"] == ["static", "ecmp", "spray", "adaptive"]
    headers = {"Content-Type": "application/json"}
    dry = rig.client.put(
        "/api/v1/routing/policy", content='{"policy": "spray", "dry_run": true}', headers=headers
    )
    assert dry.status_code == 200 and dry.json()["dry_run"] and dry.json()["flow_mods"] > 0
    assert rig.client.get("/api/v1/routing/policy").json()["policy"] == "static"  # a dry run changes nothing
    done = rig.client.put("/api/v1/routing/policy", content='{"policy": "spray"}', headers=headers)
    assert done.status_code == 200 and done.json()["kind"] == "policy_change"
    routing = rig.client.get("/api/v1/routing").json()
    assert routing["policy"] == "spray" and routing["multipath"] is True
    assert rig.put('{"multipath": false}').status_code == 200  # the legacy switch: off is static
    assert rig.client.get("/api/v1/routing/policy").json()["policy"] == "static"
    assert rig.put('{"multipath": true}').status_code == 200  # on is ecmp
    assert rig.client.get("/api/v1/routing/policy").json()["policy"] == "ecmp"
    saved = json.loads((rig.service.store.path).read_text())  # type: ignore[union-attr]
    assert saved["policy"] == "ecmp" and saved["multipath"] is True
    bad = rig.client.put("/api/v1/routing/policy", content='{"interval_ms": 9}', headers=headers)
    assert bad.status_code == 422 and bad.json()["field"] == "interval_ms"
