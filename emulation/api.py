"""The emulator's own small REST API: inject faults into a running emulated fabric, see what was done.

Faults belong to the emulator, not the controller (the controller must learn about them the way it would
from real switches), so `fabriclab emulate up` serves this beside Mininet (default 127.0.0.1:8081):

    curl -X POST localhost:8081/api/v1/faults -d '{"action": "link_down", "target": "leaf1:3"}'
    curl localhost:8081/api/v1/faults

Bodies are strict JSON (whatever the Content-Type), errors are `{"error", "field"}`, and with
FABRICLAB_API_TOKEN set a POST needs `Authorization: Bearer <token>`, as on the controller.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

API = "/api/v1"


class FaultRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    action: Literal["link_down", "link_up", "switch_down", "switch_up"]
    target: str


def create_app(
    apply: Callable[[str, str], str], summary: dict[str, Any], token: str | None = None
) -> FastAPI:
    """`apply(action, target)` performs a fault and describes it, or raises ValueError/KeyError."""
    app = FastAPI(title="fabriclab emulator", version="1")
    log: list[dict[str, Any]] = []
    lock = threading.Lock()

    def error(status: int, message: str, field: str | None) -> JSONResponse:
        return JSONResponse({"error": message, "field": field}, status_code=status)

    @app.get(f"{API}/emulation")
    def emulation() -> dict[str, Any]:
        return summary

    @app.get(f"{API}/faults")
    def faults() -> list[dict[str, Any]]:
        with lock:
            return list(log)

    @app.post(f"{API}/faults", response_model=None)
    async def inject(request: Request) -> JSONResponse | dict[str, Any]:
        if token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return error(401, "missing or wrong bearer token", "Authorization")
        try:
            body = json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, f"body is not valid JSON: {exc}", None)
        if not isinstance(body, dict):
            return error(422, "body must be a JSON object", None)
        try:
            fault = FaultRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            return error(422, f"{field}: {first['msg']}", field)
        try:
            done = apply(fault.action, fault.target)
        except (ValueError, KeyError) as exc:
            return error(422, str(exc).strip("'\""), "target")
        entry = {"at": round(time.time(), 6), "action": fault.action, "target": fault.target, "applied": done}
        with lock:
            log.append(entry)
        return entry

    return app


__all__ = ["FaultRequest", "create_app"]
