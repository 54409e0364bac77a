"""REST answers stay bounded and honest under bad input and a failing disk: every mutation that cannot be
saved (a read-only or full state directory) answers "state not saved, nothing changed" and changes nothing
(running state, events, files — no temporary left); no answer echoes more than ~80 characters of any
value; a boolean is not a P_Key; an empty member list is not a change; the page never shows server paths."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.observe import web
from controller.rest.api import create_app
from controller.service import FabricService
from controller.statestore import STATE_FILE, StateStore
from tests.conftest import ROOT
from tests.emulation_support import REQUIRE_ENV
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.generators import fat_tree

TENANT = {
    "pkey": "0x8001",
    "name": "tenantA",
    "members": [{"host": "h1", "membership": "full"}, {"host": "h5"}],
}
POLICY = {"qos_levels": {"DEFAULT": {"sl": 0}, "training": {"sl": 1}}, "vlarb": {"low": "0:64, 1:192"}}


class Rig:
    """The real service over fake switches, QoS store and app, on one state directory."""

    def __init__(self, state_dir: Path) -> None:
        fabric = fat_tree(4)
        self.state_dir = state_dir
        self.service = FabricService.for_fabric(fabric, StateStore(state_dir), lldp_interval_s=3600)
        fake = FakeFabric(fabric, self.service.context.addresses)
        sb = FakeSouthbound(fake, self.service)
        self.service.start(sb)
        for dpid in sorted(sb.dpids.values()):
            sb.up.add(dpid)
            self.service.switch_connected(dpid, 0.0)
        self.service.sync()
        self.client = TestClient(create_app(self.service, None))

    def view(self) -> dict[str, Any]:
        """Everything a change could alter, as the API shows it."""
        get = self.client.get
        return {
            "routing": get("/api/v1/routing").json(),
            "pkeys": get("/api/v1/pkeys").json(),
            "qos": get("/api/v1/qos").json(),
            "qos_events": get("/api/v1/qos/events").json(),
            "events": [e for e in get("/api/v1/events").json() if e.get("kind") != "state_save_failed"],
        }

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.state_dir.iterdir()) if p.is_file()}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.service.stop()


MUTATIONS: list[tuple[str, str, Any]] = [
    ("put", "/api/v1/qos", POLICY),
    ("put", "/api/v1/routing", {"engine": "minhop"}),
    ("put", "/api/v1/routing/policy", {"policy": "ecmp"}),
    ("post", "/api/v1/pkeys", TENANT),
]


def _refused_whole(rig: Rig) -> None:
    before, files = rig.view(), rig.files()
    for method, path, body in MUTATIONS:
        answer = getattr(rig.client, method)(path, json=body)
        assert answer.status_code == 500, (path, answer.text)
        assert answer.json()["error"].startswith("state not saved, nothing changed"), answer.text
        assert "Traceback" not in answer.text
    assert rig.view() == before
    assert rig.files() == files  # no temporary file left, nothing rewritten


def test_a_save_that_fails_changes_nothing_for_every_mutation(rig: Rig) -> None:
    """The state file is a (non-empty) directory: every rename fails, as on a broken disk."""
    assert rig.client.put("/api/v1/qos", json=POLICY).status_code == 200  # it works before
    (rig.state_dir / STATE_FILE).unlink()
    (rig.state_dir / STATE_FILE / "x").mkdir(parents=True)
    _refused_whole(rig)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs of the test's own (remounted read-only or filled by the test)."""
    mount = tmp_path / "state"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=False,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"cannot mount a tmpfs for the read-only test: {done.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_read_only_then_full_state_directory_changes_nothing(small_disk: Path) -> None:
    rig = Rig(small_disk)
    try:
        assert rig.client.put("/api/v1/qos", json=POLICY).status_code == 200
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
        _refused_whole(rig)
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
        filler = small_disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # fill the disk to the last byte
            for size in (65536, 4096, 1):
                with contextlib.suppress(OSError):  # ENOSPC: on to smaller writes
                    while os.write(fd, b"\0" * size) == size:
                        pass
        finally:
            os.close(fd)
        rig_files = {k: v for k, v in rig.files().items() if k != "filler"}
        before = rig.view()
        for method, path, body in MUTATIONS:
            answer = getattr(rig.client, method)(path, json=body)
            assert answer.status_code == 500 and "state not saved, nothing changed" in answer.text, (
                answer.text
            )
        assert rig.view() == before
        assert {k: v for k, v in rig.files().items() if k != "filler"} == rig_files
        filler.unlink()  # room again: the same changes go through
        for method, path, body in MUTATIONS:
            answer = getattr(rig.client, method)(path, json=body)
            assert answer.status_code == 200, answer.text
    finally:
        rig.service.stop()


def test_a_boolean_is_not_a_pkey_and_strings_are_not_numbers(rig: Rig) -> None:
    before = rig.view()
    for body, field in (
        ({**TENANT, "pkey": True}, "pkey"),
        ({**TENANT, "mtu_limit": "4"}, "mtu_limit"),
        ({**TENANT, "ip_over_ib": 1}, "ip_over_ib"),
        ({**TENANT, "members": [{"host": "h1", "guid": False}]}, "members.0.guid"),
    ):
        answer = rig.client.post("/api/v1/pkeys", json=body)
        assert answer.status_code == 422 and answer.json()["field"].startswith(field), answer.text
    assert rig.view() == before


@pytest.mark.parametrize("members", [",,,", " , ", ",%20,"])
def test_removing_no_members_is_refused_not_recorded(rig: Rig, members: str) -> None:
    before = rig.view()
    answer = rig.client.delete(f"/api/v1/pkeys/0x7fff/members/{members}")
    assert answer.status_code == 422 and answer.json()["field"] == "members", answer.text
    assert rig.view() == before  # no event, no new generation


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/pkeys", {**TENANT, "members": [{"host": "m" * 900_000}]}),
        ("post", "/api/v1/pkeys", {**TENANT, "name": "n" * 500_000}),
        ("get", "/api/v1/pkeys/" + "7" * 60_000, None),
        ("delete", "/api/v1/pkeys/0x7fff/members/" + "h" * 60_000, None),
        ("put", "/api/v1/qos", {"qos_levels": {"DEFAULT": {"sl": 0}, "q" * 200_000: {"sl": 1}}}),
        ("put", "/api/v1/routing", {"engine": "e" * 300_000}),
        ("get", "/api/v1/qos/path?src=" + "s" * 100 + "&dst=h1", None),
    ],
    ids=["member-900KB", "name-500KB", "path-60K", "delete-60K", "qos-key-200KB", "engine-300KB", "query"],
)
def test_no_error_echoes_an_unbounded_value(rig: Rig, method: str, path: str, body: Any) -> None:
    kwargs = {"json": body} if body is not None else {}
    answer = getattr(rig.client, method)(path, **kwargs)
    assert 400 <= answer.status_code < 500, answer.text[:300]
    assert len(answer.content) < 1000, len(answer.content)
    error = answer.json()["error"]
    assert "…" in error or len(error) < 200, error


def test_the_page_without_its_bundle_names_no_server_path(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web, "BUNDLE", tmp_path / "absent" / "fabric-view.js")
    answer = rig.client.get("/")
    assert answer.status_code == 503 and "npm run build" in answer.text
    assert str(ROOT) not in answer.text and str(tmp_path) not in answer.text
    assert "controller/observe/page/dist/fabric-view.js" in answer.text


def test_good_changes_still_go_through(rig: Rig) -> None:
    assert rig.client.post("/api/v1/pkeys", json=TENANT).status_code == 200
    answer = rig.client.delete("/api/v1/pkeys/0x0001/members/h5")
    assert answer.status_code == 200, answer.text
    saved = json.loads((rig.state_dir / STATE_FILE).read_text())
    assert [m["host"] for p in saved["partitions"] if p["pkey"] == "0x0001" for m in p["members"]] == ["h1"]
