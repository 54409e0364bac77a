"""REST for partitions, modelled on UFM's P_Key API (`/api/v1/pkeys`).

* ``GET /pkeys`` — every partition with its members; ``GET /pkeys/{pkey}`` — one (``0x8001`` and ``0x0001``
  name the same partition: only the low 15 bits count).
* ``POST /pkeys`` — create: ``pkey``, ``name``, optional ``ip_over_ib``, ``mtu_limit``, ``service_level``,
  ``rate_limit`` (IBTA codes, as OpenSM's flags) and ``members`` (``[{host | guid, membership}]``).
* ``POST /pkeys/{pkey}/members`` — add members (a member already there takes the membership given);
  ``PUT /pkeys/{pkey}/members`` — replace the member list; ``DELETE /pkeys/{pkey}/members/{members}`` —
  remove members (comma-separated host names or GUIDs, like UFM's ``/guids/{guids}``).
* ``DELETE /pkeys/{pkey}`` — delete (not the default partition, 0x7fff).

Every change is validated whole against the fabric by the pure edit rules of `controller.sm.pkey_edits`
(404 no such P_Key, 409 it exists, 422 naming the field: unknown member, P_Key out of range, a name
already used by another P_Key, the default partition deleted), handed to the worker as one
`PartitionEditRequested` (the edit as a value): the decision core applies the rules to the partitions running
when its worker reaches the edit — so two clients never overwrite each other's edit, with no lock here —
persists the result in ``--state-dir`` before it takes effect, rolls it out make-before-break to every switch
(or reports the switches that failed), and logs a ``partition_change`` event.  Reads come from the published
snapshot.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict

from controller.httpguard import API, ErrorBody, parse_body, require_token_dependency
from controller.rest.changes import refused, run_change
from controller.rest.models import PKeysView, PKeyView
from controller.service import FabricService, Published
from controller.sm import pkey_edits
from controller.sm.partitions import Member, PartitionError, Partitions, parse_pkey


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
    return pkey_edits.running(pub.state.config.partitions, pub.context.declared)


def _members(body: list[MemberIn]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in body]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


def mount_pkeys(app: FastAPI, service: FabricService, token: str | None) -> None:
    mutation = [Depends(require_token_dependency(token))]

    def snap() -> Published:
        return service.snapshot()

    async def apply(edit: pkey_edits.PartitionEdit, pkey: str | int) -> dict[str, Any]:
        """One edit, decided and rolled out by the worker; the partition as it is afterwards."""
        record = await run_change(service.edit_partitions, edit)
        after = snap().state.config.partitions
        try:
            number = parse_pkey(pkey)
        except PartitionError:  # pragma: no cover - the edit was accepted, so its P_Key parsed
            number = None
        shown = after.get(number) if after is not None and number is not None else None
        return {"partition": shown.as_dict() if shown is not None else None, "event": record}

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
        try:
            return pkey_edits.find(_current(snap()), pkey).as_dict()
        except pkey_edits.EditError as exc:
            raise refused(exc) from None

    @app.post(
        f"{API}/pkeys",
        dependencies=mutation,
        responses=_errors(400, 401, 409, 413, 415, 422, 500, 503),
    )
    async def create_pkey(request: Request) -> dict[str, Any]:
        body = parse_body(await request.body(), PKeyCreate)
        spec = body.model_dump(exclude_none=True, exclude={"index0"})
        spec["members"] = _members(body.members)
        return await apply(pkey_edits.CreatePartition(spec), body.pkey)

    async def change_members(pkey: str, body: MembersIn, replace_all: bool) -> dict[str, Any]:
        members = tuple(_members(body.members))
        return await apply(pkey_edits.SetMembers(pkey, members, replace_all), pkey)

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
        return await apply(pkey_edits.RemoveMembers(pkey, tuple(members.split(","))), pkey)

    @app.delete(f"{API}/pkeys/{{pkey}}", dependencies=mutation, responses=_errors(401, 404, 422, 500, 503))
    async def delete_pkey(pkey: str) -> dict[str, Any]:
        return await apply(pkey_edits.DeletePartition(pkey), pkey)


__all__ = ["Member", "MemberIn", "MembersIn", "PKeyCreate", "mount_pkeys"]
