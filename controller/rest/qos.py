"""REST for the QoS policy (`/api/v1/qos`): read it resolved, replace it whole, ask a path's class.

    GET  /api/v1/qos                      the running policy: resolved tables, queues, generation
    PUT  /api/v1/qos[?dry_run=true]       a new policy (the YAML file's fields as JSON), validated whole:
                                          422 naming the field, nothing changes; dry run: what would change
    GET  /api/v1/qos/events[?since=ID]    policy changes
    GET  /api/v1/qos/path?src=&dst=[&pkey=&dscp=]   the qos-level a path gets (OpenSM's PathRecord SL)

Per-port per-queue counters live where the queues are: the emulator's API (`GET /api/v1/qos/counters` of
`fabriclab emulate up`, see `emulation.api`).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request

from controller.qosfile import QosFileError
from controller.qosstate import QosNotSaved, QosStore
from controller.rest.common import API, ApiError
from controller.rest.models import QosEventView, QosPathView, QosView
from controller.sm.qos import dscp_to_sl, group_members, match_level, sl_to_dscp

#: The largest policy body accepted (a policy is a few KB; the Guard bounds every body as well).
MAX_POLICY_BYTES = 256 * 1024


def _policy_body(raw: bytes) -> Any:
    if len(raw) > MAX_POLICY_BYTES:
        raise ApiError(413, f"policy larger than {MAX_POLICY_BYTES} bytes", None)
    try:
        data = json.loads(raw or b"null")
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"body is not valid JSON: {str(exc)[:120]}", None) from None
    if not isinstance(data, dict):
        raise ApiError(422, "body must be a JSON object (the policy file's fields)", None)
    return data


def mount_qos(app: FastAPI, store: QosStore, mutation: list[Any]) -> None:
    @app.get(f"{API}/qos", response_model=QosView)
    def get_qos() -> dict[str, Any]:
        snap = store.snapshot()
        return {"generation": snap.generation, "source": snap.source, "policy": snap.resolved}

    @app.put(f"{API}/qos", dependencies=mutation)
    async def put_qos(request: Request, dry_run: bool = False) -> dict[str, Any]:
        """Replace the policy whole (validated in full first; a bad one changes nothing)."""
        data = _policy_body(await request.body())
        try:
            if dry_run:
                return store.dry_run(data)
            return store.replace_data(data, "rest", time.time())
        except QosFileError as exc:
            raise ApiError(422, str(exc), exc.field) from None
        except QosNotSaved as exc:  # as routing and P_Key changes answer it: nothing changed
            raise ApiError(500, str(exc), None) from None

    @app.get(f"{API}/qos/events", response_model=list[QosEventView])
    def qos_events(since: Annotated[int, Query(ge=0, le=2**62)] = 0) -> list[dict[str, Any]]:
        return store.events(since)

    @app.get(f"{API}/qos/path", response_model=QosPathView)
    def qos_path(
        src: Annotated[str, Query(max_length=128)],
        dst: Annotated[str, Query(max_length=128)],
        pkey: Annotated[int | None, Query(ge=1, le=0xFFFF)] = None,
        dscp: Annotated[int | None, Query(ge=0, le=63, description="requested traffic class")] = None,
    ) -> dict[str, Any]:
        snap = store.snapshot()
        for field, name in (("src", src), ("dst", dst)):
            if name not in store.fabric.nodes:
                raise ApiError(404, f"unknown node {name!r}", field)
        policy = snap.policy
        members = {g.name: group_members(g, store.fabric) for g in policy.port_groups}
        level = match_level(policy, members, src, dst, pkey, dscp)
        mark = sl_to_dscp(policy)[level.sl]
        return {
            "src": src,
            "dst": dst,
            "level": level.name,
            "sl": level.sl,
            "dscp": mark,
            "vl": policy.sl2vl[level.sl],
            "queue": policy.sl2vl[level.sl],
            "rate_limit_gbps": level.rate_limit_gbps,
            "generation": snap.generation,
            "classified_sl": None if mark is None else dscp_to_sl(policy)[mark],
        }


__all__ = ["MAX_POLICY_BYTES", "mount_qos"]
