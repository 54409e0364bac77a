"""REST API (`/api/v1`, OpenAPI at `/docs`): the fabric as the subnet manager sees it, and routing control.

Talks to the service facade only (never to os-ken).  Request bodies are strict (unknown fields rejected);
every error is JSON `{"error": ..., "field": ...}` naming the offending field, and a rejected request
changes nothing.  When `token` is set, mutating calls need `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.service import FabricService
from controller.sm.engines import UnknownEngine
from controller.sm.intents import ForwardingOptions
from controller.sm.manager import UnknownSwitch
from controller.sm.tables import RouteError

API = "/api/v1"
_Model = TypeVar("_Model", bound=BaseModel)


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


class RoutingUpdate(BaseModel):
    """Change the routing engine and/or forwarding options; omitted fields keep their value."""

    model_config = ConfigDict(extra="forbid", strict=True)
    engine: str | None = None
    fast_failover: bool | None = None
    multipath: bool | None = None
    dry_run: bool = False


def create_app(service: FabricService, token: str | None = None) -> FastAPI:
    app = FastAPI(
        title="fabriclab controller",
        version="1",
        description="Subnet-manager-style controller for Ethernet/OpenFlow AI fabrics.",
    )
    manager = service.manager

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message, "field": exc.field}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail), "field": None}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
        field = ".".join(loc) or None
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        return JSONResponse({"error": message, "field": field}, status_code=422)

    def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is None:
            return
        expected = f"Bearer {token}"
        if authorization is None or not hmac.compare_digest(authorization.encode(), expected.encode()):
            raise ApiError(401, "missing or wrong bearer token", "Authorization")

    def switch_or_404(name: str) -> str:
        if name not in manager.dpids:
            raise ApiError(404, f"unknown switch {name!r}", "name")
        return name

    @app.get(f"{API}/health")
    def health() -> dict[str, Any]:
        connected = service.connected_switches()
        with service.lock:
            current = manager.current
            return {
                "status": "ok",
                "uptime_s": round(time.time() - service.started_at, 3),
                "switches_declared": len(manager.dpids),
                "switches_connected": len(connected),
                "in_sync": service.in_sync(),
                "generation": manager.generation,
                "engine": manager.engine,
                "routing_ok": bool(current and current.verification.ok),
                "threads": threading.active_count(),
                "failed_updates": service.failed_updates,
                "unknown_switches": sorted(f"{d:016x}" for d in service.unknown_switches),
            }

    @app.get(f"{API}/fabric")
    def fabric() -> dict[str, Any]:
        connected = service.connected_switches()
        with service.lock:
            declared = manager.declared
            return {
                "name": declared.name,
                "engine": manager.engine,
                "generation": manager.generation,
                "switches": [
                    {
                        "name": s.name,
                        "dpid": f"{s.guid:016x}",
                        "lid": manager.lids.lid(s.name),
                        "connected": s.name in connected,
                    }
                    for s in declared.switches
                ],
                "hosts": [
                    {
                        "name": a.host,
                        "port": a.port,
                        "lid": a.lid,
                        "mac": a.mac_str,
                        "ipv4": a.ipv4_str,
                        "attached_to": str(declared.peer(a.host, a.port)),
                    }
                    for a in manager.addresses
                ],
                "links": _links(service, counters=None),
            }

    @app.get(f"{API}/switches")
    def switches() -> list[dict[str, Any]]:
        connected = service.connected_switches()
        with service.lock:
            return [_switch_view(service, s.name, connected) for s in manager.declared.switches]

    @app.get(f"{API}/switches/{{name}}")
    def switch(name: str) -> dict[str, Any]:
        switch_or_404(name)
        connected = service.connected_switches()
        with service.lock:
            return _switch_view(service, name, connected)

    @app.get(f"{API}/switches/{{name}}/lft")
    def lft(name: str) -> dict[str, Any]:
        switch_or_404(name)
        with service.lock:
            try:
                table = manager.lft(name)
            except UnknownSwitch as exc:
                raise ApiError(404, str(exc), "name") from None
            endpoints = manager.lids.endpoints
            return {
                "switch": name,
                "generation": manager.generation,
                "engine": manager.engine,
                "entries": [
                    {
                        "lid": lid,
                        "port": port,
                        "dest": f"{endpoints[lid].node}"
                        + (f":{endpoints[lid].port}" if endpoints[lid].port else ""),
                    }
                    for lid, port in sorted(table.items())
                    if lid in endpoints
                ],
            }

    @app.get(f"{API}/links")
    def links(counters: bool = True) -> list[dict[str, Any]]:
        stats = service.southbound.port_stats() if counters and service.southbound else None
        with service.lock:
            return _links(service, stats)

    @app.get(f"{API}/routes")
    def routes(src: Annotated[str, Query()], dst: Annotated[str, Query()]) -> dict[str, Any]:
        with service.lock:
            for field, value in (("src", src), ("dst", dst)):
                if value not in manager.declared.nodes:
                    raise ApiError(404, f"unknown node {value!r}", field)
            try:
                hops = manager.route(src, dst)
            except RouteError as exc:
                raise ApiError(409, str(exc), "dst") from None
            return {
                "src": src,
                "dst": dst,
                "generation": manager.generation,
                "hops": [{"node": h.node, "in_port": h.in_port, "out_port": h.out_port} for h in hops],
                "path": " ".join(str(h) for h in hops),
            }

    @app.get(f"{API}/routing")
    def get_routing() -> dict[str, Any]:
        with service.lock:
            current = manager.require_current()
            v = current.verification
            return {
                "engine": manager.engine,
                "engines": manager.registry.names(),
                "fast_failover": manager.options.fast_failover,
                "multipath": manager.options.multipath,
                "generation": manager.generation,
                "digest": current.tables.digest(),
                "verification": {
                    "ok": v.ok,
                    "unreachable_pairs": v.unreachable_pairs,
                    "loop_entries": v.loop_entries,
                    "deadlock_free": v.deadlock.acyclic if v.deadlock else None,
                    "mean_hops": round(v.mean_hops, 3),
                    "max_hops": v.max_hops,
                },
                "down_links": list(current.down_links),
                "lost_hosts": list(current.lost_hosts),
            }

    @app.put(
        f"{API}/routing", dependencies=[Depends(require_token)], openapi_extra=_body_schema(RoutingUpdate)
    )
    async def put_routing(request: Request) -> dict[str, Any]:
        """Recompute with another engine/options and reprogram the switches (`dry_run`: report only).
        The body is JSON whatever the Content-Type says (`curl -d` sends form encoding by default)."""
        update = _parse_body(await request.body(), RoutingUpdate)
        if update.engine is not None and update.engine not in manager.registry:
            names = ", ".join(manager.registry.names())
            raise ApiError(
                400, f"engine: unknown routing engine {update.engine!r} (available: {names})", "engine"
            )
        options = ForwardingOptions(
            manager.options.fast_failover if update.fast_failover is None else update.fast_failover,
            manager.options.multipath if update.multipath is None else update.multipath,
        )
        try:
            result: dict[str, Any] = await run_in_threadpool(
                service.set_routing, update.engine, options, update.dry_run
            )
        except UnknownEngine as exc:
            raise ApiError(400, str(exc), "engine") from None
        return result

    @app.get(f"{API}/validation")
    def validation() -> dict[str, Any]:
        return service.validation()

    @app.get(f"{API}/events")
    def events(
        since: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> list[dict[str, Any]]:
        return service.recent_events(since, limit)

    return app


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def _parse_body(raw: bytes, model: type[_Model]) -> _Model:
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}", None) from None
    if not isinstance(data, dict):
        raise ApiError(422, "body must be a JSON object", None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(422, f"{field}: {first['msg']}", field) from None


def _switch_view(service: FabricService, name: str, connected: set[str]) -> dict[str, Any]:
    manager = service.manager
    installed = service.installed.get(name)
    program = manager.current.programs.get(name) if manager.current else None
    return {
        "name": name,
        "dpid": f"{manager.dpids[name]:016x}",
        "connected": name in connected,
        "ports_down": sorted(r.port for r in manager.ports_down if r.node == name),
        "flows": len(installed.flows) if installed else None,
        "groups": len(installed.groups) if installed else None,
        "desired_flows": len(program.flows) if program else 0,
        "desired_groups": len(program.groups) if program else 0,
    }


def _links(
    service: FabricService, counters: dict[tuple[int, int], dict[str, int]] | None
) -> list[dict[str, Any]]:
    manager = service.manager
    result = []
    for index, link in enumerate(manager.declared.links):
        entry: dict[str, Any] = {
            "id": index,
            "a": str(link.a),
            "b": str(link.b),
            "bw_gbps": link.bw_gbps,
            "up": manager.link_up(index),
        }
        if counters is not None:
            for side, ref in (("a_counters", link.a), ("b_counters", link.b)):
                dpid = manager.dpids.get(ref.node)
                if dpid is not None:
                    entry[side] = counters.get((dpid, ref.port))
        result.append(entry)
    return result


__all__ = ["API", "RoutingUpdate", "create_app"]
