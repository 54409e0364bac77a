"""The emulator's own small REST API: inject faults into a running emulated fabric, see what was done.

Faults belong to the emulator, not the controller (the controller must learn about them the way it would
from real switches), so `fabriclab emulate up` serves this beside Mininet (default 127.0.0.1:8081):

    curl -X POST localhost:8081/api/v1/faults -H 'Content-Type: application/json' \
         -d '{"action": "link_down", "target": "leaf1:3"}'
    curl localhost:8081/api/v1/faults

Same guard, error shape and token rules as the controller's API (`controller.httpguard`); `/metrics` serves
the emulator's own counters (`emulation.metrics`); the controller's live view may call it from the browser
(CORS for the controller's origin only).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict

from controller.httpguard import (
    API,
    ApiError,
    ErrorBody,
    allow_page_origins,
    allowed_hosts,
    install,
    parse_body,
    require_token_dependency,
)

#: Faults kept for GET /faults; older ones are dropped (a long-running fabric must not grow without bound).
MAX_FAULT_LOG = 1000


class FaultRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    action: Literal["link_down", "link_up", "switch_down", "switch_up"]
    target: str


class FaultRecord(BaseModel):
    at: float
    action: str
    target: str
    applied: str


class EmulationSummary(BaseModel):
    fabric: str
    switches: int
    hosts: int
    pairs: int
    pairs_reachable: int
    verified_s: float


def create_app(
    apply: Callable[[str, str], str],
    summary: dict[str, Any],
    token: str | None = None,
    address: tuple[str, int] = ("127.0.0.1", 8081),
    registry: CollectorRegistry | None = None,
    page_origins: Sequence[str] = (),
    qos_counters: Callable[[], dict[str, dict[str, dict[str, int]]]] | None = None,
) -> FastAPI:
    """`apply(action, target)` performs a fault and describes it, or raises ValueError/KeyError.
    `registry`: the emulator's metrics, served at `/metrics` with this API's request latency;
    `page_origins`: origins of the controller's live view, which may inject faults from the browser."""
    app = FastAPI(title="fabriclab emulator", version="1", docs_url=None)
    install(app, allowed_hosts(*address), registry=registry if registry is not None else CollectorRegistry())
    allow_page_origins(app, page_origins)
    log: list[FaultRecord] = []
    lock = threading.Lock()
    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody} for code in (400, 401, 413, 415, 422, 503)
    }

    @app.get(f"{API}/emulation", response_model=EmulationSummary)
    def emulation() -> EmulationSummary:
        return EmulationSummary.model_validate(summary)

    if qos_counters is not None:

        @app.get(f"{API}/qos/counters")
        def qos_queue_counters() -> dict[str, dict[str, dict[str, int]]]:
            """Per switch port (`leaf1:3`), per queue (`q1`; a rate-limited SL's leaf `q3/sl3`): bytes,
            packets, drops, overlimits and backlog of the QoS queues (`emulation.qosqueues`)."""
            return qos_counters()

    @app.get(f"{API}/faults", response_model=list[FaultRecord])
    def faults() -> list[FaultRecord]:
        with lock:
            return list(log)

    @app.post(
        f"{API}/faults",
        response_model=FaultRecord,
        responses=errors,
        dependencies=[Depends(require_token_dependency(token))],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": FaultRequest.model_json_schema()}},
            }
        },
    )
    async def inject(request: Request) -> FaultRecord:
        fault = parse_body(await request.body(), FaultRequest)
        try:
            done = apply(fault.action, fault.target)
        except (ValueError, KeyError) as exc:
            raise ApiError(422, str(exc).strip("'\"")[:200], "target") from None
        except FaultNotApplied as exc:  # a valid fault the fabric could not carry out (a machine gone, ...)
            raise ApiError(503, f"not applied: {exc}"[:300], "target") from None
        entry = FaultRecord(at=round(time.time(), 6), action=fault.action, target=fault.target, applied=done)
        with lock:
            log.append(entry)
            del log[:-MAX_FAULT_LOG]
        return entry

    return app


class FaultNotApplied(RuntimeError):
    """A valid fault that the running fabric could not carry out (its words say why)."""


__all__ = ["FaultNotApplied", "FaultRecord", "FaultRequest", "create_app"]
