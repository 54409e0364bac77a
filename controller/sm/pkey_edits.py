"""The rules of a P_Key edit, as pure functions of the running partitions, the fabric and the request.

An edit (create a partition, add, replace or remove members, delete one) is validated whole here and gives
the new `Partitions` to hand to the decision core, or an `EditError` saying why not: `not_found` (no such
P_Key), `conflict` (the P_Key exists) or `invalid` (a field is wrong: an unknown member, a name another
P_Key uses, the default partition deleted).  The REST layer (`controller.rest.pkeys`) maps the kinds to
404/409/422 and nothing else; any other front end gets the same rules.  No I/O, no locks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from controller.sm.partitions import (
    DEFAULT_PKEY,
    Partition,
    PartitionError,
    Partitions,
    default_partitions,
    parse_pkey,
    pkey_str,
)
from controller.sm.partitions_conf import member_of_dict, resolve, rule_from_dict
from topologies.errors import InputError
from topologies.model import Fabric

Kind = Literal["not_found", "conflict", "invalid"]


class EditError(InputError):
    """Why an edit is refused; `kind` says how (module docstring), `field` which part of the request."""

    def __init__(self, kind: Kind, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.kind = kind


@dataclass(frozen=True)
class Edit:
    """An accepted edit: the partitions after it, a one-line description for the event log, the P_Key."""

    partitions: Partitions
    change: str
    pkey: int


def running(partitions: Partitions | None, fabric: Fabric) -> Partitions:
    """The partitions in force: the configured ones, or OpenSM's default (everyone full in 0x7fff)."""
    return partitions if partitions is not None else default_partitions(h.name for h in fabric.hosts)


def find(current: Partitions, text: str) -> Partition:
    """The partition a P_Key names (``0x8001`` and ``0x0001`` are the same: only the low 15 bits count)."""
    try:
        pkey = parse_pkey(text)
    except PartitionError as exc:
        raise EditError("not_found", exc.message, "pkey") from None
    found = current.get(pkey)
    if found is None:
        raise EditError("not_found", f"no partition with P_Key {pkey_str(pkey)}", "pkey")
    return found


def resolved(fabric: Fabric, spec: Mapping[str, Any]) -> Partition:
    """A partition in its mapping form (as a file or a request gives it), resolved against the fabric."""
    try:
        rule = rule_from_dict(dict(spec), 0)
        return resolve([rule], fabric, add_default=False).partitions[0]
    except InputError as exc:
        message = f"{exc.field}: {exc.message}" if exc.field else exc.message
        raise EditError("invalid", message, exc.field) from None


def spec_of(partition: Partition) -> dict[str, Any]:
    """A partition in the mapping form `resolved` takes (members as they are)."""
    spec = partition.as_dict()
    spec["pkey"] = partition.pkey
    return spec


def _check_name(current: Partitions, partition: Partition) -> None:
    for other in current.partitions:
        if other.name == partition.name and other.pkey != partition.pkey:
            raise EditError(
                "invalid",
                f"name: partition {partition.name!r} already has P_Key {pkey_str(other.pkey)}",
                "name",
            )


def create(current: Partitions, fabric: Fabric, spec: Mapping[str, Any]) -> Edit:
    """A new partition: its P_Key must be free and its name unused by another P_Key."""
    partition = resolved(fabric, spec)
    if current.get(partition.pkey) is not None:
        raise EditError("conflict", f"P_Key {pkey_str(partition.pkey)} exists", "pkey")
    _check_name(current, partition)
    return Edit(current.replaced(partition), f"create {pkey_str(partition.pkey)}", partition.pkey)


def set_members(
    current: Partitions, fabric: Fabric, text: str, members: Sequence[Mapping[str, Any]], replace_all: bool
) -> Edit:
    """Replace the member list (`replace_all`), or add members: one already there takes the membership
    given."""
    old = find(current, text)
    spec = spec_of(old)
    if replace_all:
        spec["members"] = [dict(m) for m in members]
        verb = "replace members of"
    else:
        added = resolved(fabric, {**spec, "members": [dict(m) for m in members]})
        keep = {(m.host, m.guid): m for m in old.members}
        keep.update({(m.host, m.guid): m for m in added.members})
        spec["members"] = [m.as_dict() for m in keep.values()]
        verb = "add members to"
    partition = resolved(fabric, spec)
    return Edit(current.replaced(partition), f"{verb} {pkey_str(old.pkey)}", old.pkey)


def remove_members(current: Partitions, fabric: Fabric, text: str, words: Iterable[str]) -> Edit:
    """Remove members named by host name or port GUID (``0x…``); each must be a member."""
    old = find(current, text)
    names = [w.strip() for w in words if w.strip()]
    if not names:  # ",,," would record a change that changes nothing
        raise EditError(
            "invalid", "members: name one or more hosts or port GUIDs (comma-separated)", "members"
        )

    def err(message: str, *_: object) -> EditError:
        return EditError("invalid", f"members: {message}", "members")

    gone: set[tuple[str | None, int | None]] = set()
    for i, word in enumerate(names):
        given = {"guid": word} if word.lower().startswith("0x") else {"host": word}
        member_of_dict(given, i, err)
        probe = resolved(fabric, {**spec_of(old), "members": [given]})
        found = {(m.host, m.guid) for m in probe.members}
        if not found & {(m.host, m.guid) for m in old.members}:
            raise EditError(
                "invalid", f"members: {word!r} is not a member of {pkey_str(old.pkey)}", "members"
            )
        gone |= found
    kept = tuple(m for m in old.members if (m.host, m.guid) not in gone)
    return Edit(current.replaced(replace(old, members=kept)), f"remove members from {pkey_str(old.pkey)}",
                old.pkey)  # fmt: skip


def delete(current: Partitions, text: str) -> Edit:
    """Delete a partition; the default one (0x7fff) stays."""
    old = find(current, text)
    if old.pkey == DEFAULT_PKEY:
        raise EditError("invalid", "pkey: the default partition (0x7fff) cannot be deleted", "pkey")
    return Edit(current.without(old.pkey), f"delete {pkey_str(old.pkey)}", old.pkey)


@dataclass(frozen=True)
class CreatePartition:
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class SetMembers:
    pkey: str
    members: tuple[Mapping[str, Any], ...]
    replace_all: bool


@dataclass(frozen=True)
class RemoveMembers:
    pkey: str
    words: tuple[str, ...]


@dataclass(frozen=True)
class DeletePartition:
    pkey: str


#: One edit as a value (what a front end asks; `apply` decides against the partitions then running).
PartitionEdit = CreatePartition | SetMembers | RemoveMembers | DeletePartition


def apply(current: Partitions, fabric: Fabric, edit: PartitionEdit) -> Edit:
    """`edit` on the running partitions: the new ones, or `EditError`."""
    if isinstance(edit, CreatePartition):
        return create(current, fabric, edit.spec)
    if isinstance(edit, SetMembers):
        return set_members(current, fabric, edit.pkey, edit.members, edit.replace_all)
    if isinstance(edit, RemoveMembers):
        return remove_members(current, fabric, edit.pkey, edit.words)
    return delete(current, edit.pkey)


__all__ = [
    "CreatePartition",
    "DeletePartition",
    "Edit",
    "EditError",
    "PartitionEdit",
    "RemoveMembers",
    "SetMembers",
    "apply",
    "create",
    "delete",
    "find",
    "remove_members",
    "resolved",
    "running",
    "set_members",
    "spec_of",
]
