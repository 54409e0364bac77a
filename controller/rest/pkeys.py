"""REST for partitions, modelled on UFM's P_Key API (`/api/v1/pkeys`).

* ``GET /pkeys`` — every partition with its members; ``GET /pkeys/{pkey}`` — one (``0x8001`` and ``0x0001``
  name the same partition: only the low 15 bits count).
* ``POST /pkeys`` — create: ``pkey``, ``name``, optional ``ip_over_ib``, ``mtu_limit``, ``service_level``,
  ``rate_limit`` (IBTA codes, as OpenSM's flags) and ``members`` (``[{host | guid, membership}]``).
* ``POST /pkeys/{pkey}/members`` — add members (a member already there takes the membership given);
  ``PUT /pkeys/{pkey}/members`` — replace the member list; ``DELETE /pkeys/{pkey}/members/{members}`` —
  remove members (comma-separated host names or GUIDs, like UFM's ``/guids/{guids}``).
* ``DELETE /pkeys/{pkey}`` — delete (not the default partition, 0x7fff).

Every change is validated whole against the fabric here (422 naming the field: unknown member, P_Key out of
range, a name already used by another P_Key), then handed to the worker as one `PartitionsRequested`: the
decision core persists it in ``--state-dir`` before it takes effect, rolls it out make-before-break to every
switch (or reports the switches that failed), and logs a ``partition_change`` event.  Reads come from the
published snapshot.  Changes are serialised here, so two clients never overwrite each other's edit.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict

from controller.rest.changes import run_change
from controller.rest.common import API, ApiError, ErrorBody, parse_body, require_token_dependency
from controller.rest.models import PKeysView, PKeyView
from controller.service import FabricService, Published
from controller.sm.partitions import (
    DEFAULT_PKEY,
    Member,
    Partition,
    PartitionError,
    Partitions,
    default_partitions,
    parse_pkey,
    pkey_str,
)
from controller.sm.partitions_conf import member_of_dict, resolve, rule_from_dict
from topologies.errors import InputError


class _Body(BaseModel):
    """Strict, like the routing bodies: `{"pkey": true}` is not P_Key 0x0001, `"mtu_limit": "4"` not 4."""

    model_config = ConfigDict(extra="forbid", strict=True)


class MemberIn(_Body):
    host: str | None = None
    guid: str | int | None = None
    membership: str | None = None


class PKeyCreate(_Body):
    pkey: str | int
    name: str
    ip_over_ib: bool = False
    mtu_limit: int | None = None
    service_level: int | None = None
    rate_limit: int | None = None
    index0: bool | None = None  # UFM's; accepted and ignored (no P_Key table index on Ethernet)
    members: list[MemberIn] = []


class MembersIn(_Body):
    members: list[MemberIn]


def _current(pub: Published) -> Partitions:
    parts = pub.state.config.partitions
    return parts if parts is not None else default_partitions(h.name for h in pub.context.declared.hosts)


def _pkey_or_404(pub: Published, text: str) -> Partition:
    try:
        pkey = parse_pkey(text)
    except PartitionError as exc:
        raise ApiError(404, exc.message, "pkey") from None
    found = _current(pub).get(pkey)
    if found is None:
        raise ApiError(404, f"no partition with P_Key {pkey_str(pkey)}", "pkey")
    return found


def _resolved(pub: Published, body: dict[str, Any]) -> Partition:
    """A partition body (the mapping form) resolved against the fabric: 422 naming the field."""
    try:
        rule = rule_from_dict(body, 0)
        return resolve([rule], pub.context.declared, add_default=False).partitions[0]
    except InputError as exc:
        raise ApiError(422, f"{exc.field}: {exc.message}" if exc.field else exc.message, exc.field) from None


def _members(body: list[MemberIn]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in body]


def _spec(partition: Partition) -> dict[str, Any]:
    """A partition as a body `_resolved` takes (the mapping form, members as they are)."""
    spec = partition.as_dict()
    spec["pkey"] = partition.pkey
    return spec


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


def mount_pkeys(app: FastAPI, service: FabricService, token: str | None) -> None:
    mutation = [Depends(require_token_dependency(token))]
    changes = asyncio.Lock()  # held across awaits: an asyncio lock, never a thread lock

    def snap() -> Published:
        return service.snapshot()

    async def apply(new: Partitions, change: str, pkey: int) -> dict[str, Any]:
        record = await run_change(service.set_partitions, new, change)
        after = snap().state.config.partitions
        shown = after.get(pkey) if after is not None else None
        return {"partition": shown.as_dict() if shown is not None else None, "event": record}

    def check_names(current: Partitions, partition: Partition) -> None:
        for other in current.partitions:
            if other.name == partition.name and other.pkey != partition.pkey:
                raise ApiError(
                    422,
                    f"name: partition {partition.name!r} already has P_Key {pkey_str(other.pkey)}",
                    "name",
                )

    @app.get(f"{API}/pkeys", response_model=PKeysView, response_model_exclude_none=True)
    def list_pkeys() -> dict[str, Any]:
        """Every partition with its members (OpenSM's default when none were configured)."""
        return _current(snap()).as_dict()

    @app.get(
        f"{API}/pkeys/{{pkey}}",
        response_model=PKeyView,
        response_model_exclude_none=True,
        responses=_errors(404),
    )
    def get_pkey(pkey: str) -> dict[str, Any]:
        return _pkey_or_404(snap(), pkey).as_dict()

    @app.post(
        f"{API}/pkeys",
        dependencies=mutation,
        responses=_errors(400, 401, 409, 413, 415, 422, 500, 503),
    )
    async def create_pkey(request: Request) -> dict[str, Any]:
        body = parse_body(await request.body(), PKeyCreate)
        spec = body.model_dump(exclude_none=True, exclude={"index0"})
        spec["members"] = _members(body.members)
        async with changes:
            pub = snap()
            partition = _resolved(pub, spec)
            current = _current(pub)
            if current.get(partition.pkey) is not None:
                raise ApiError(409, f"P_Key {pkey_str(partition.pkey)} exists", "pkey")
            check_names(current, partition)
            return await apply(current.replaced(partition), f"create {pkey_str(partition.pkey)}",
                               partition.pkey)  # fmt: skip

    async def change_members(pkey: str, body: MembersIn, replace_all: bool) -> dict[str, Any]:
        async with changes:
            pub = snap()
            old = _pkey_or_404(pub, pkey)
            spec = _spec(old)
            if replace_all:
                spec["members"] = _members(body.members)
                verb = "replace members of"
            else:
                added = _resolved(pub, {**spec, "members": _members(body.members)})
                keep = {(m.host, m.guid): m for m in old.members}
                keep.update({(m.host, m.guid): m for m in added.members})
                spec["members"] = [m.as_dict() for m in keep.values()]
                verb = "add members to"
            partition = _resolved(pub, spec)
            return await apply(_current(pub).replaced(partition), f"{verb} {pkey_str(old.pkey)}", old.pkey)

    @app.post(
        f"{API}/pkeys/{{pkey}}/members",
        dependencies=mutation,
        responses=_errors(400, 401, 404, 413, 415, 422, 500, 503),
    )
    async def add_members(pkey: str, request: Request) -> dict[str, Any]:
        return await change_members(pkey, parse_body(await request.body(), MembersIn), False)

    @app.put(
        f"{API}/pkeys/{{pkey}}/members",
        dependencies=mutation,
        responses=_errors(400, 401, 404, 413, 415, 422, 500, 503),
    )
    async def replace_members(pkey: str, request: Request) -> dict[str, Any]:
        return await change_members(pkey, parse_body(await request.body(), MembersIn), True)

    @app.delete(
        f"{API}/pkeys/{{pkey}}/members/{{members}}",
        dependencies=mutation,
        responses=_errors(401, 404, 422, 500, 503),
    )
    async def remove_members(pkey: str, members: str) -> dict[str, Any]:
        async with changes:
            pub = snap()
            old = _pkey_or_404(pub, pkey)
            words = [w.strip() for w in members.split(",") if w.strip()]
            if not words:  # ",,," would record a change that changes nothing
                raise ApiError(
                    422, "members: name one or more hosts or port GUIDs (comma-separated)", "members"
                )
            gone: set[tuple[str | None, int | None]] = set()
            for i, word in enumerate(words):
                given = {"guid": word} if word.lower().startswith("0x") else {"host": word}

                def err(message: str, *_: object) -> ApiError:
                    return ApiError(422, f"members: {message}", "members")

                member_of_dict(given, i, err)
                probe = _resolved(pub, {**_spec(old), "members": [given]})
                found = {(m.host, m.guid) for m in probe.members}
                if not found & {(m.host, m.guid) for m in old.members}:
                    raise ApiError(
                        422, f"members: {word!r} is not a member of {pkey_str(old.pkey)}", "members"
                    )
                gone |= found
            kept = tuple(m for m in old.members if (m.host, m.guid) not in gone)
            partition = replace(old, members=kept)
            return await apply(_current(pub).replaced(partition), f"remove members from {pkey_str(old.pkey)}",
                               old.pkey)  # fmt: skip

    @app.delete(f"{API}/pkeys/{{pkey}}", dependencies=mutation, responses=_errors(401, 404, 422, 500, 503))
    async def delete_pkey(pkey: str) -> dict[str, Any]:
        async with changes:
            pub = snap()
            old = _pkey_or_404(pub, pkey)
            if old.pkey == DEFAULT_PKEY:
                raise ApiError(422, "pkey: the default partition (0x7fff) cannot be deleted", "pkey")
            return await apply(_current(pub).without(old.pkey), f"delete {pkey_str(old.pkey)}", old.pkey)


__all__ = ["Member", "MemberIn", "MembersIn", "PKeyCreate", "mount_pkeys"]
