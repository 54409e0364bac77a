"""The P_Key edit rules (`controller.sm.pkey_edits`), pure: each refusal of the REST API (404/409/422) is a
kind here, and an accepted edit gives the new partitions without touching the old ones."""

from __future__ import annotations

import pytest

from controller.sm import pkey_edits
from controller.sm.partitions import DEFAULT_PKEY, Membership
from topologies.generators import fat_tree

FABRIC = fat_tree(4)
START = pkey_edits.running(None, FABRIC)  # OpenSM's default: everyone full in 0x7fff


def created() -> pkey_edits.Edit:
    return pkey_edits.create(
        START, FABRIC, {"pkey": "0x0010", "name": "a", "members": [{"host": "h1", "membership": "full"}]}
    )


def test_create_then_the_same_pkey_again_conflicts() -> None:
    edit = created()
    assert edit.pkey == 0x10 and edit.change == "create 0x0010"
    assert edit.partitions.get(0x10) is not None and START.get(0x10) is None  # the old value is untouched
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.create(edit.partitions, FABRIC, {"pkey": "0x8010", "name": "b"})  # same low 15 bits
    assert err.value.kind == "conflict" and err.value.field == "pkey"


def test_a_name_another_pkey_uses_is_refused_naming_name() -> None:
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.create(created().partitions, FABRIC, {"pkey": "0x0011", "name": "a"})
    assert err.value.kind == "invalid" and err.value.field == "name"


def test_unknown_members_and_pkeys() -> None:
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.create(START, FABRIC, {"pkey": "0x0012", "name": "c", "members": [{"host": "h99"}]})
    assert err.value.kind == "invalid"
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.find(START, "0x0042")
    assert err.value.kind == "not_found"
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.find(START, "banana")
    assert err.value.kind == "not_found"


def test_adding_merges_and_replacing_replaces() -> None:
    parts = created().partitions
    added = pkey_edits.set_members(parts, FABRIC, "0x10", [{"host": "h2", "membership": "limited"}], False)
    assert dict(added.partitions.get(0x10).hosts) == {"h1": Membership.FULL, "h2": Membership.LIMITED}  # type: ignore[union-attr]
    again = pkey_edits.set_members(
        added.partitions, FABRIC, "0x10", [{"host": "h2", "membership": "full"}], False
    )
    assert again.partitions.get(0x10).hosts["h2"] is Membership.FULL  # type: ignore[union-attr]
    replaced = pkey_edits.set_members(added.partitions, FABRIC, "0x10", [{"host": "h3"}], True)
    assert set(replaced.partitions.get(0x10).hosts) == {"h3"}  # type: ignore[union-attr]


def test_removing_needs_members_that_are_there() -> None:
    parts = created().partitions
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.remove_members(parts, FABRIC, "0x10", ["h2"])
    assert err.value.kind == "invalid" and "not a member" in err.value.message
    with pytest.raises(pkey_edits.EditError):
        pkey_edits.remove_members(parts, FABRIC, "0x10", [",", " "])
    gone = pkey_edits.remove_members(parts, FABRIC, "0x10", ["h1"])
    assert gone.partitions.get(0x10).members == ()  # type: ignore[union-attr]


def test_the_default_partition_cannot_be_deleted_others_can() -> None:
    with pytest.raises(pkey_edits.EditError) as err:
        pkey_edits.delete(START, hex(DEFAULT_PKEY))
    assert err.value.kind == "invalid"
    assert pkey_edits.delete(created().partitions, "0x10").partitions.get(0x10) is None
