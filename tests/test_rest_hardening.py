"""REST under hostile or broken input (issue 14, item 4): bounded bodies, no echo, 4xx for every malformed
body, DNS rebinding and cross-site requests refused, tokens done right, 503 instead of waiting forever,
reads that never wait for the worker, and API docs that work offline."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controller.httpguard import API, MAX_BODY_BYTES, Guard, allowed_hosts, token_from_env
from controller.rest import api as api_module
from controller.rest.api import create_app
from controller.service import MAX_PENDING_REQUESTS, Busy, FabricService
from controller.sm.intents import SwitchDelta
from controller.statestore import StateStore
from tests.fakes import FakeFabric, FakeSouthbound
from topologies.generators import fat_tree

JSON = {"Content-Type": "application/json"}
BASE = "http://127.0.0.1:8080"


class BlockingSouthbound(FakeSouthbound):
    """Pushes wait until released: the worker is busy for as long as a test wants."""

    def __init__(self, fake: FakeFabric, listener: object) -> None:
        super().__init__(fake, listener)
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()

    def push(self, deltas: Mapping[int, SwitchDelta], phase: str, timeout_s: float = 10.0) -> dict[int, str]:
        self.entered.set()
        self.release.wait(30)
        return super().push(deltas, phase, timeout_s)


class Rig:
    def __init__(self, state_dir: Path, token: str | None = None) -> None:
        fabric = fat_tree(4)
        self.service = FabricService.for_fabric(fabric, StateStore(state_dir), lldp_interval_s=3600)
        self.fake = FakeFabric(fabric, self.service.context.addresses)
        self.sb = BlockingSouthbound(self.fake, self.service)
        self.service.start(self.sb)
        for dpid in sorted(self.sb.dpids.values()):
            self.sb.up.add(dpid)
            self.service.switch_connected(dpid, 0.0)
        self.service.sync()
        self.app = create_app(self.service, token, allowed_hosts("127.0.0.1", 8080))
        self.client = TestClient(self.app, base_url=BASE)

    def put(self, body: str | bytes, headers: dict[str, str] | None = None) -> Any:
        return self.client.put("/api/v1/routing", content=body, headers=JSON if headers is None else headers)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.sb.release.set()
    r.service.stop()


def test_a_huge_body_is_refused_before_it_is_read_and_never_echoed(rig: Rig) -> None:
    body = b'{"engine": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}'
    response = rig.put(body)
    assert response.status_code == 413
    assert len(response.content) < 200 and b"xxxx" not in response.content


def test_a_body_without_length_is_still_bounded(rig: Rig) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536

    response = rig.client.put("/api/v1/routing", content=chunks(), headers=JSON)
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("[" * 100_000, 400),  # RecursionError inside the JSON parser
        ('{"engine": ' + "9" * 5000 + "}", 400),  # past Python's integer digit limit
        ('{"engine": "' + "e" * 5000 + '"}', 422),  # too long a name; not echoed
        ('{"' + "k" * 5000 + '": 1}', 422),
        ("\xff\xfe", 400),
        ("", 422),
        ("null", 422),
    ],
    ids=["deep", "digits", "long-value", "long-key", "not-utf8", "empty", "null"],
)
def test_malformed_bodies_get_a_4xx_and_change_nothing(rig: Rig, body: str, status: int) -> None:
    generation = rig.service.snapshot().state.generation
    response = rig.put(body.encode("utf-8", "surrogateescape") if body != "\xff\xfe" else b"\xff\xfe")
    assert response.status_code == status, response.text
    assert len(response.content) < 600
    assert rig.service.snapshot().state.generation == generation


def test_dns_rebinding_and_cross_site_requests_are_refused(rig: Rig) -> None:
    engine = rig.service.snapshot().state.config.engine
    rebound = rig.put('{"engine": "sssp"}', {"Host": "attacker.example", **JSON})
    assert rebound.status_code == 400 and rebound.json()["field"] == "Host"
    plain = rig.put('{"engine": "sssp"}', {"Content-Type": "text/plain"})
    assert plain.status_code == 415 and plain.json()["field"] == "Content-Type"
    bare = rig.put('{"engine": "sssp"}', {})
    assert bare.status_code == 415
    assert rig.service.snapshot().state.config.engine == engine
    for host in ("127.0.0.1:8080", "localhost:8080", "localhost", "[::1]:8080"):
        assert rig.client.get("/api/v1/health", headers={"Host": host}).status_code == 200, host
    # curl -d sends form encoding; a PUT needs a CORS preflight from any web page, so it is accepted
    curl = rig.put('{"engine": "updn"}', {"Content-Type": "application/x-www-form-urlencoded"})
    assert curl.status_code == 200 and rig.service.snapshot().state.config.engine == "updn"


def test_wildcard_binds_accept_any_host_unless_narrowed() -> None:
    assert allowed_hosts("0.0.0.0", 8080) is None
    narrowed = allowed_hosts("0.0.0.0", 8080, ["fabric.example"])
    assert narrowed is not None and "fabric.example:8080" in narrowed
    assert allowed_hosts("10.1.2.3", 80) == frozenset({"10.1.2.3", "10.1.2.3:80"})


def test_tokens(tmp_path: Path) -> None:
    r = Rig(tmp_path, token="s3cret")
    try:
        denied = r.put('{"engine": "updn"}')
        assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
        twice = r.client.put(
            "/api/v1/routing",
            content='{"engine": "updn"}',
            headers=[
                ("Content-Type", "application/json"),
                ("Authorization", "Bearer s3cret"),
                ("Authorization", "Bearer s3cret"),
            ],
        )
        assert twice.status_code == 400 and twice.json()["field"] == "Authorization"
        assert r.put('{"engine": "updn"}', {"Authorization": "Bearer s3cret", **JSON}).status_code == 200
    finally:
        r.service.stop()
    with pytest.raises(ValueError, match="set but empty"):
        token_from_env("")
    with pytest.raises(ValueError):
        token_from_env(" padded ")
    assert token_from_env(None) is None and token_from_env("abc") == "abc"


def test_reads_never_wait_for_the_worker_and_a_backlog_gets_503(rig: Rig) -> None:
    rig.sb.release.clear()
    rig.sb.entered.clear()
    busy = threading.Thread(target=lambda: rig.put('{"engine": "sssp", "fast_failover": false}'), daemon=True)
    busy.start()
    assert rig.sb.entered.wait(10)  # the worker is now stuck in a push
    start = time.monotonic()
    health = rig.client.get("/api/v1/health")
    routing = rig.client.get("/api/v1/routing")
    assert health.status_code == 200 and routing.status_code == 200
    assert time.monotonic() - start < 1.0
    with pytest.raises(Busy):
        rig.service.set_routing("updn", None, timeout_s=0.2)  # never started: cancelled, not applied later
    waiting = [
        threading.Thread(target=lambda: rig.put('{"engine": "minhop"}'), daemon=True) for _ in range(4)
    ]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 10
    while rig.service.waiting_requests() < MAX_PENDING_REQUESTS and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = rig.put('{"engine": "updn"}')
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    rig.sb.release.set()
    busy.join(30)
    for t in waiting:
        t.join(30)
    rig.service.sync()
    assert rig.service.snapshot().state.config.engine == "minhop"  # the cancelled "updn" never ran


def test_dry_runs_are_bounded(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    inside = threading.Semaphore(0)
    from controller.core.fabric import dry_run as real

    def slow(*args: Any) -> dict[str, Any]:
        inside.release()
        gate.wait(10)
        return real(*args)

    monkeypatch.setattr(api_module, "dry_run", slow)
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(rig.put('{"dry_run": true}').status_code))
        for _ in range(api_module.MAX_CONCURRENT_DRY_RUNS)
    ]
    for t in threads:
        t.start()
    for _ in threads:
        assert inside.acquire(timeout=10)
    extra = rig.put('{"dry_run": true}')
    assert extra.status_code == 503 and extra.headers["Retry-After"]
    gate.set()
    for t in threads:
        t.join(10)
    assert results == [200] * len(threads)


def test_a_client_that_disconnects_mid_body_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append("app")

    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"eng', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: Any) -> None:
        raise AssertionError("nothing must be sent to a client that left")

    scope = {"type": "http", "method": "PUT", "path": "/api/v1/routing",
             "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                         (b"transfer-encoding", b"chunked")]}  # fmt: skip
    guard = Guard(app, allowed_hosts("127.0.0.1", 8080))
    with caplog.at_level("INFO", logger="fabriclab.rest"):
        asyncio.run(guard(scope, receive, send))
    assert reached == []
    assert [r.message for r in caplog.records] == [
        "PUT /api/v1/routing: client went away before sending its whole body"
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_api_docs_are_served_without_internet(rig: Rig) -> None:
    page = rig.client.get("/docs")
    assert page.status_code == 200 and "cdn" not in page.text.lower()
    assert "/docs-assets/swagger-ui-bundle.js" in page.text
    script = rig.client.get("/docs-assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000


def test_every_get_answers_a_named_model_in_the_openapi_document(rig: Rig, tmp_path: Path) -> None:
    """Every GET (QoS and P_Keys included: the app is built with a QoS store) documents its 200 body as a
    named model or a list of one — not an untyped object."""
    app = create_app(rig.service, None, allowed_hosts("127.0.0.1", 8080))
    spec = TestClient(app, base_url=BASE).get("/openapi.json").json()
    gets = {path: ops["get"] for path, ops in spec["paths"].items() if "get" in ops}
    assert {f"{API}/qos", f"{API}/qos/events", f"{API}/qos/path", f"{API}/pkeys"} <= set(gets)
    for path, operation in gets.items():
        schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
        named = "$ref" in schema or (schema.get("type") == "array" and "$ref" in schema.get("items", {}))
        assert named, (path, schema)
