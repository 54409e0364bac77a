"""REST for the QoS policy (`/api/v1/qos`): read it resolved, replace it whole, ask a path's class.

    GET  /api/v1/qos                      the running policy: resolved tables, queues, generation
    PUT  /api/v1/qos[?dry_run=true]       a new policy (the YAML file's fields as JSON), validated whole:
                                          422 naming the field, nothing changes; dry run: what would change
    GET  /api/v1/qos/events[?since=ID]    policy changes (the `qos_policy` entries of `GET /events`)
    GET  /api/v1/qos/path?src=&dst=[&pkey=&dscp=]   the qos-level a path gets (OpenSM's PathRecord SL)

The policy is one of the operator's choices the decision core owns: a change is a `QosPolicyRequested`,
saved with the rest in ``--state-dir`` before it takes effect, one generation, one record in the event log
(`controller.core.operator`).  Reads come from the published snapshot.  Per-port per-queue counters live
where the queues are: the emulator's API (`GET /api/v1/qos/counters` of `fabriclab emulate up`, see
`emulation.api`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request

from controller.core.state import Record, RecordKind
from controller.formats.qosfile import QosFileError, policy_from_data
from controller.httpguard import API, ApiError
from controller.published import Published
from controller.rest.changes import run_change
from controller.rest.models import QosEventView, QosPathView, QosView
from controller.service import FabricService
from controller.sm.qos import QosPolicy, diff, dscp_to_sl, group_members, match_level, resolve, sl_to_dscp

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


def event_view(record: Record | dict[str, Any]) -> dict[str, Any]:
    """A `qos_policy` record of the event log as `/qos/events` shows it."""
    data = record.as_dict() if isinstance(record, Record) else record
    return {
        "id": data["id"],
        "time": data["at"],
        "kind": data["kind"],
        "generation": data.get("generation", 0),
        "source": data.get("reason", ""),
        "changes": list(data.get("changes", ())),
    }


def mount_qos(app: FastAPI, service: FabricService, mutation: list[Any]) -> None:
    resolved_last: list[tuple[QosPolicy, dict[str, Any]]] = []  # the last policy resolved: reads repeat

    def resolved(pub: Published) -> dict[str, Any]:
        policy = pub.state.config.qos
        if resolved_last and resolved_last[0][0] is policy:
            return resolved_last[0][1]
        table = resolve(policy, pub.context.declared)
        resolved_last[:] = [(policy, table)]
        return table

    @app.get(f"{API}/qos", response_model=QosView)
    def get_qos() -> dict[str, Any]:
        pub = service.snapshot()
        config = pub.state.config
        return {"generation": pub.state.generation, "source": config.qos_source, "policy": resolved(pub)}

    @app.put(f"{API}/qos", dependencies=mutation)
    async def put_qos(request: Request, dry_run: bool = False) -> dict[str, Any]:
        """Replace the policy whole (validated in full first; a bad one changes nothing)."""
        data = _policy_body(await request.body())
        pub = service.snapshot()
        try:
            policy = policy_from_data(data, "body", pub.context.declared)
        except QosFileError as exc:
            raise ApiError(422, str(exc), exc.field) from None
        if dry_run:
            changes = diff(resolved(pub), resolve(policy, pub.context.declared))
            return {"dry_run": True, "changes": changes}
        return event_view(await run_change(service.set_qos, policy, "rest"))

    @app.get(f"{API}/qos/events", response_model=list[QosEventView])
    def qos_events(since: Annotated[int, Query(ge=0, le=2**62)] = 0) -> list[dict[str, Any]]:
        records = service.snapshot().state.records
        return [event_view(r) for r in records if r.kind is RecordKind.QOS_POLICY and r.id > since]

    @app.get(f"{API}/qos/path", response_model=QosPathView)
    def qos_path(
        src: Annotated[str, Query(max_length=128)],
        dst: Annotated[str, Query(max_length=128)],
        pkey: Annotated[int | None, Query(ge=1, le=0xFFFF)] = None,
        dscp: Annotated[int | None, Query(ge=0, le=63, description="requested traffic class")] = None,
    ) -> dict[str, Any]:
        pub = service.snapshot()
        fabric = pub.context.declared
        for field, name in (("src", src), ("dst", dst)):
            if name not in fabric.nodes:
                raise ApiError(404, f"unknown node {name!r}", field)
        policy = pub.state.config.qos
        members = {g.name: group_members(g, fabric) for g in policy.port_groups}
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
            "generation": pub.state.generation,
            "classified_sl": None if mark is None else dscp_to_sl(policy)[mark],
        }


__all__ = ["MAX_POLICY_BYTES", "event_view", "mount_qos"]
