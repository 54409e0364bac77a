"""REST for partitions (UFM-style /api/v1/pkeys) over the real service and fake switches: create, members
added, replaced and removed, delete; every change reaches the switches make-before-break, is persisted and
an event; bad input is 422 naming the field and changes nothing (state, disk, switches); the token guards
mutations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from controller.formats.partitions_file import load_partitions
from controller.service import FabricService
from controller.statestore import StateStore
from tests.test_rest_api import Rig
from topologies.generators import fat_tree

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    r.connect_all()
    yield r
    r.stop()


def _isolate_default(rig: Rig) -> None:
    """Every host a limited member of 0x7fff (what a partitions file without a Default rule means)."""
    members = [{"host": f"h{i}", "membership": "limited"} for i in range(1, 17)]
    r = rig.client.put("/api/v1/pkeys/0x7fff/members", json={"members": members})
    assert r.status_code == 200, r.text


def _holdings(rig: Rig) -> dict[str, Any]:
    return {n: dict(s.flows) for n, s in rig.fake.switches.items()}


def test_create_list_get_members_and_delete(rig: Rig, tmp_path: Path) -> None:
    assert rig.client.get("/api/v1/pkeys").json()["partitions"][0]["pkey"] == "0x7fff"
    _isolate_default(rig)
    assert not rig.fake.delivers("h1", "h5")
    body = {"pkey": "0x8001", "name": "tenantA", "ip_over_ib": True, "service_level": 2,
            "members": [{"host": "h1", "membership": "full"}, {"host": "h5"}]}  # fmt: skip
    r = rig.client.post("/api/v1/pkeys", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["event"]["kind"] == "partition_change" and r.json()["event"]["switches_updated"] >= 1
    view = rig.client.get("/api/v1/pkeys/0x8001").json()
    assert view == rig.client.get("/api/v1/pkeys/0x0001").json()  # only the low 15 bits count
    assert view["name"] == "tenantA" and view["ip_over_ib"] and view["service_level"] == 2
    assert view["members"] == [{"host": "h1", "membership": "full"}, {"host": "h5", "membership": "limited"}]
    assert rig.fake.delivers("h1", "h5") and rig.fake.delivers("h5", "h1")
    assert not rig.fake.delivers("h2", "h5")
    # persisted: a restarted controller enforces the same partitions
    saved = json.loads((tmp_path / "controller-state.json").read_text())
    assert [p["pkey"] for p in saved["partitions"]] == ["0x0001", "0x7fff"]
    # add members (h9 limited: talks to h1, not to h5)
    r = rig.client.post("/api/v1/pkeys/0x0001/members", json={"members": [{"host": "h9"}]})
    assert r.status_code == 200, r.text
    assert rig.fake.delivers("h9", "h1") and not rig.fake.delivers("h9", "h5")
    # replace the member list
    r = rig.client.put("/api/v1/pkeys/0x0001/members",
                       json={"members": [{"host": "h2", "membership": "full"}, {"host": "h3"}]})  # fmt: skip
    assert r.status_code == 200, r.text
    assert rig.fake.delivers("h2", "h3") and not rig.fake.delivers("h1", "h5")
    # remove a member
    r = rig.client.delete("/api/v1/pkeys/0x0001/members/h3")
    assert r.status_code == 200, r.text
    assert [m["host"] for m in r.json()["partition"]["members"]] == ["h2"]
    assert not rig.fake.delivers("h2", "h3")
    # delete
    assert rig.client.delete("/api/v1/pkeys/0x0001").status_code == 200
    assert rig.client.get("/api/v1/pkeys/0x0001").status_code == 404
    kinds = [e["kind"] for e in rig.client.get("/api/v1/events").json()]
    assert kinds.count("partition_change") == 6
    assert rig.state.in_sync


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", "/api/v1/pkeys", {"pkey": "0x8000", "name": "x"}, "pkey"),
        ("post", "/api/v1/pkeys", {"pkey": "0x10000", "name": "x"}, "pkey"),
        ("post", "/api/v1/pkeys", {"pkey": 0, "name": "x"}, "pkey"),
        ("post", "/api/v1/pkeys", {"pkey": "0x5", "name": "x", "members": [{"host": "h99"}]}, "members"),
        ("post", "/api/v1/pkeys", {"pkey": "0x5", "name": "x",
                                   "members": [{"host": "h1", "membership": "ful"}]}, "members.0.membership"),
        ("post", "/api/v1/pkeys", {"pkey": "0x5", "name": "Default"}, "name"),  # name of another P_Key
        ("post", "/api/v1/pkeys", {"pkey": "0x5", "name": "x", "mtu_limit": 9}, "mtu_limit"),
        ("post", "/api/v1/pkeys", {"pkey": "0x5", "name": "x", "colour": "red"}, "colour"),
        ("post", "/api/v1/pkeys", {"name": "x"}, "pkey"),
        ("put", "/api/v1/pkeys/0x7fff/members", {"members": [{"guid": "0x1234"}]}, "members"),
        ("post", "/api/v1/pkeys/0x7fff/members", {"members": [{"host": "h1", "guid": "0x1"}]}, "members.0"),
    ],
)  # fmt: skip
def test_bad_changes_are_422_naming_the_field_and_change_nothing(
    rig: Rig, tmp_path: Path, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    _isolate_default(rig)
    state = rig.state.config.partitions
    disk = (tmp_path / "controller-state.json").read_text()
    held = _holdings(rig)
    r = getattr(rig.client, method)(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] is not None and r.json()["field"].startswith(field.split(".", maxsplit=1)[0]), (
        r.json()
    )
    assert field.rsplit(".", maxsplit=1)[-1] in r.json()["field"] or field in r.json()["error"], r.json()
    assert rig.state.config.partitions == state
    assert (tmp_path / "controller-state.json").read_text() == disk
    assert _holdings(rig) == held


def test_conflicts_and_unknowns(rig: Rig) -> None:
    assert rig.client.post("/api/v1/pkeys", json={"pkey": "0x7fff", "name": "again"}).status_code == 409
    assert rig.client.get("/api/v1/pkeys/0x0042").status_code == 404
    assert rig.client.get("/api/v1/pkeys/banana").status_code == 404
    assert rig.client.delete("/api/v1/pkeys/0x7fff").status_code == 422
    assert rig.client.delete("/api/v1/pkeys/0x7fff/members/h99").status_code == 422
    assert rig.client.post("/api/v1/pkeys", content=b"{", headers=JSON).status_code == 400


def test_mutations_need_the_token(tmp_path: Path) -> None:
    rig = Rig(tmp_path, token="s3cret-token-for-tests")
    try:
        rig.connect_all()
        body = {"pkey": "0x3", "name": "t"}
        assert rig.client.post("/api/v1/pkeys", json=body).status_code == 401
        assert rig.client.delete("/api/v1/pkeys/0x7fff/members/h1").status_code == 401
        assert rig.client.get("/api/v1/pkeys").status_code == 200
        auth = {"Authorization": "Bearer s3cret-token-for-tests"}
        assert rig.client.post("/api/v1/pkeys", json=body, headers=auth).status_code == 200
    finally:
        rig.stop()


def test_saved_partitions_survive_a_restart(tmp_path: Path) -> None:
    conf = tmp_path / "p.conf"
    conf.write_text("a=0x10 : h1=full, h2 ; b=0x20 : h3=full, h4, ALL_SWITCHES ;\n")
    fabric = fat_tree(4)
    first = FabricService.for_fabric(
        fabric, StateStore(tmp_path / "state"), lambda c: type(c)(c.engine, c.options, c.policy_params,
                                                                  load_partitions(conf, fabric))
    )  # fmt: skip
    first.start(_NoSouthbound())
    first.sync()
    first.stop()
    again = FabricService.for_fabric(fabric, StateStore(tmp_path / "state"))
    assert again.snapshot().state.config.partitions == load_partitions(conf, fabric)


class _NoSouthbound:
    """A southbound with no switches: the service computes and saves, nothing connects."""

    def connected(self) -> set[int]:
        return set()

    def read_switch(self, dpid: int, timeout_s: float = 10.0) -> Any:
        raise ConnectionError("no switches")

    def push(self, deltas: Any, phase: str, timeout_s: float = 10.0) -> dict[int, str]:
        return {}

    def probe_links(self, dpids: Any) -> int:
        return 0

    def port_stats(self, timeout_s: float = 2.0) -> dict[tuple[int, int], dict[str, int]]:
        return {}

    def slot_stats(self, timeout_s: float = 2.0) -> dict[Any, int]:
        return {}


def test_concurrent_edits_are_serialised_by_the_worker_none_lost(rig: Rig) -> None:
    """Four clients add a member to one partition at once.  Each edit is decided by the core against the
    partitions running when the worker reaches it (no lock in REST): every member is there afterwards, each
    edit its own generation and event."""
    r = rig.client.post("/api/v1/pkeys", json={"pkey": "0x8001", "name": "t", "members": [{"host": "h1"}]})
    assert r.status_code == 200, r.text
    before = rig.client.get("/api/v1/health").json()["generation"]

    def add(host: str) -> int:
        answer = rig.client.post("/api/v1/pkeys/0x0001/members", json={"members": [{"host": host}]})
        return int(answer.status_code)

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(add, ["h2", "h3", "h4", "h5"]))
    assert codes == [200] * 4
    members = [m["host"] for m in rig.client.get("/api/v1/pkeys/0x0001").json()["members"]]
    assert sorted(members) == ["h1", "h2", "h3", "h4", "h5"]
    assert rig.client.get("/api/v1/health").json()["generation"] == before + 4
    events = [e for e in rig.client.get("/api/v1/events").json() if e["kind"] == "partition_change"]
    assert [e["reason"] for e in events[-4:]] == ["add members to 0x0001"] * 4
