"""Reading partitions: OpenSM's ``partitions.conf`` grammar, a YAML form of the same model, and REST bodies.

OpenSM's grammar (``doc/partition-config.txt``)::

    # comment to the end of the line
    Name[=PKey][,ipoib][,rate=N][,mtu=N][,sl=N][,scope=N][,defmember=full|limited|both] :
        member[=full|limited|both], member, ... ;

A member is a port GUID (``0x...`` or decimal), a host name of the topology, or a keyword: ``ALL`` (every end
port), ``ALL_CAS`` (hosts), ``ALL_SWITCHES`` (switch port 0), ``ALL_ROUTERS`` (none here), ``SELF`` (the
SM's port: none here, the controller is not an end port).  Whitespace and line breaks may appear between
tokens.  A P_Key counts by its low 15 bits; a repeated P_Key merges into the first rule's partition; a rule
without a P_Key gets the lowest unused one; the default membership is ``limited``.

Where OpenSM is lenient, this reader is strict, because a silent guess in an isolation policy is a tenant
seeing another's traffic: an unknown member, an unrecognised membership (OpenSM: limited), an unknown flag,
or one name used for two different P_Keys is an error naming line and column.  Nothing is applied from a
file with any error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from controller.sm.partitions import (
    DEFAULT_NAME,
    DEFAULT_PKEY,
    Member,
    Membership,
    Partition,
    PartitionError,
    Partitions,
    parse_pkey,
)
from topologies.model import Fabric

KEYWORDS = ("ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF")
#: Flags with a small integer value and their allowed range (IBTA encodings, as OpenSM takes them).
_INT_FLAGS = {"rate": (2, 20), "mtu": (1, 5), "sl": (0, 15), "scope": (1, 15)}
_MAX_NAME = 64
_TOKEN = re.compile(r"\s+|#[^\n]*|(?P<punct>[=,:;])|(?P<word>[^\s=,:;#]+)")


class Token(NamedTuple):
    text: str
    line: int
    column: int


@dataclass
class Rule:
    """One ``definition : members ;`` as written (before resolution against a topology)."""

    name: str
    pkey: int | None
    line: int
    column: int | None = None
    ipoib: bool = False
    flags: dict[str, int] = field(default_factory=dict)
    defmember: Membership = Membership.LIMITED
    #: (member word, membership or None for the default, line, column)
    members: list[tuple[str, Membership | None, int, int | None]] = field(default_factory=list)
    #: How errors name each member's field (the YAML form: ``partitions[0].members[1]``); default "members".
    member_fields: list[str] | None = None


def _error(message: str, at: Token | None, field_: str | None = None) -> PartitionError:
    return PartitionError(message, field=field_, line=at.line if at else None,
                          column=at.column if at else None)  # fmt: skip


def tokens(text: str) -> Iterator[Token]:
    line, line_start = 1, 0
    for m in _TOKEN.finditer(text):
        start = m.start()
        kind = m.lastgroup
        if kind is not None:
            yield Token(m.group(kind), line, start - line_start + 1)
        newlines = m.group(0).count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + m.group(0).rindex("\n") + 1


def _membership(tok: Token) -> Membership:
    try:
        return Membership(tok.text.lower())
    except ValueError:
        raise _error(f"membership {tok.text!r} is not full, limited or both", tok, "membership") from None


def parse_conf(text: str) -> list[Rule]:
    """OpenSM's grammar -> rules (raises PartitionError with line and column, without a file name)."""
    toks = list(tokens(text))
    rules: list[Rule] = []
    i = 0
    while i < len(toks):
        end = next((j for j in range(i, len(toks)) if toks[j].text == ";"), None)
        if end is None:
            raise _error("rule not terminated by ';'", toks[-1])
        colon = next((j for j in range(i, end) if toks[j].text == ":"), None)
        if colon is None:
            raise _error("expected ':' between the partition definition and its members", toks[end])
        rules.append(_rule(toks[i:colon], toks[colon], toks[colon + 1 : end]))
        i = end + 1
    return rules


def _rule(head: Sequence[Token], colon: Token, body: Sequence[Token]) -> Rule:
    first = head[0] if head else colon
    rule = Rule("", None, first.line, first.column)
    parts = _split(head, colon)
    name_part = parts[0]
    if name_part:
        if name_part[0].text == "=":  # "=0x10 : ..." (no name)
            name_part = [Token("", first.line, first.column), *name_part]
        if not _is_word(name_part[0]):
            raise _error(f"expected a partition name, found {name_part[0].text!r}", name_part[0], "name")
        rule.name = name_part[0].text
        if len(rule.name) > _MAX_NAME:
            raise _error(f"partition name longer than {_MAX_NAME} characters", name_part[0], "name")
        if len(name_part) > 1:
            if name_part[1].text != "=" or len(name_part) != 3 or not _is_word(name_part[2]):
                raise _error("expected 'Name=PKey'", name_part[1], "pkey")
            try:
                rule.pkey = parse_pkey(name_part[2].text)
            except PartitionError as exc:
                raise _error(exc.message, name_part[2], "pkey") from None
    for part in parts[1:]:
        _flag(rule, part, colon)
    for part in _split(body, colon) if body else []:
        if not part:
            continue  # "a, , b": OpenSM skips empty items
        if not _is_word(part[0]):
            raise _error(f"expected a member, found {part[0].text!r}", part[0], "members")
        membership = None
        if len(part) > 1:
            if part[1].text != "=" or len(part) != 3 or not _is_word(part[2]):
                raise _error("expected 'member' or 'member=full|limited|both'", part[1], "members")
            membership = _membership(part[2])
        rule.members.append((part[0].text, membership, part[0].line, part[0].column))
    return rule


def _flag(rule: Rule, part: Sequence[Token], colon: Token) -> None:
    if not part:
        raise _error("empty flag between commas", colon, "flags")
    name = part[0]
    if not _is_word(name):
        raise _error(f"expected a flag, found {name.text!r}", name, "flags")
    key = name.text.lower()
    value = None
    if len(part) > 1:
        if part[1].text != "=" or len(part) != 3 or not _is_word(part[2]):
            raise _error(f"expected '{key}' or '{key}=value'", part[1], key)
        value = part[2]
    if key == "ipoib" and value is None:
        rule.ipoib = True
    elif key == "defmember" and value is not None:
        rule.defmember = _membership(value)
    elif key in _INT_FLAGS and value is not None:
        low, high = _INT_FLAGS[key]
        try:
            number = int(value.text, 0)
        except ValueError:
            raise _error(f"{key} must be an integer, not {value.text!r}", value, key) from None
        if not low <= number <= high:
            raise _error(f"{key}={number} is outside {low}..{high}", value, key)
        rule.flags[key] = number
    else:
        known = "ipoib, rate=, mtu=, sl=, scope=, defmember="
        raise _error(f"unknown flag {name.text!r} (known: {known})", name, "flags")


def _split(toks: Sequence[Token], where: Token) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    for tok in toks:
        if tok.text == ",":
            parts.append([])
        elif tok.text == ":":
            raise _error("unexpected ':' (is the ';' ending the rule before it missing?)", tok)
        else:
            parts[-1].append(tok)
    return parts


def _is_word(tok: Token) -> bool:
    return tok.text not in ("=", ",", ":", ";")


# --- mappings (the YAML form, REST bodies, the saved state) -------------------------------------------


_BODY_KEYS = {"name", "pkey", "ip_over_ib", "mtu_limit", "service_level", "rate_limit", "scope", "defmember",
              "members", "index0"}  # fmt: skip


def rule_from_dict(entry: Any, line: int, fail: Any = None) -> Rule:
    """One partition as a mapping (the YAML form, a REST body) -> a rule.  `fail(message, *field_path)`
    makes the located error; without it the error names the field only."""

    def err(message: str, *sub: str | int) -> PartitionError:
        if fail is not None:
            error: PartitionError = fail(message, *sub)
            return error
        return PartitionError(message, field=".".join(map(str, sub)) or None)

    if not isinstance(entry, dict):
        raise err("a partition must be a mapping")
    unknown = sorted(set(map(str, entry)) - _BODY_KEYS)
    if unknown:
        raise err(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_BODY_KEYS - {'index0'}))})",
                  unknown[0])  # fmt: skip
    name = entry.get("name", "")
    if not isinstance(name, str) or not re.fullmatch(r"[^\s=,:;#]{1,64}", name):
        raise err("name must be 1-64 characters without spaces or any of = , : ; #", "name")
    if "pkey" not in entry:
        raise err("pkey is required", "pkey")
    try:
        pkey = parse_pkey(entry["pkey"])
    except PartitionError as exc:
        raise err(exc.message, "pkey") from None
    rule = Rule(name, pkey, line)
    if "ip_over_ib" in entry:
        if not isinstance(entry["ip_over_ib"], bool):
            raise err("ip_over_ib must be true or false", "ip_over_ib")
        rule.ipoib = entry["ip_over_ib"]
    for key, flag in (
        ("mtu_limit", "mtu"),
        ("service_level", "sl"),
        ("rate_limit", "rate"),
        ("scope", "scope"),
    ):
        if key in entry and entry[key] is not None:
            value = entry[key]
            low, high = _INT_FLAGS[flag]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise err(f"{key} must be an integer in {low}..{high}", key)
            rule.flags[flag] = value
    if "defmember" in entry:
        try:
            rule.defmember = Membership(str(entry["defmember"]).lower())
        except ValueError:
            raise err("defmember must be full, limited or both", "defmember") from None
    members = entry.get("members", [])
    if not isinstance(members, list):
        raise err("members must be a list", "members")
    for i, member in enumerate(members):
        rule.members.append((*member_of_dict(member, i, err), line, None))
    return rule


def member_of_dict(member: Any, i: int, err: Any) -> tuple[str, Membership | None]:
    if not isinstance(member, dict) or len(set(member) & {"host", "guid"}) != 1:
        raise err("a member is {host: NAME | guid: 0x..., membership: full|limited|both}", "members", i)
    extra = sorted(set(member) - {"host", "guid", "membership"})
    if extra:
        raise err(f"unknown key {extra[0]!r} (allowed: host, guid, membership)", "members", i, extra[0])
    word = member.get("host", member.get("guid"))
    if "guid" in member and isinstance(word, int) and not isinstance(word, bool):
        word = hex(word)
    if not isinstance(word, str) or not word:
        raise err("host/guid must be a non-empty string", "members", i)
    membership = None
    if "membership" in member:
        try:
            membership = Membership(str(member["membership"]).lower())
        except ValueError:
            raise err("membership must be full, limited or both", "members", i, "membership") from None
    return word, membership


# --- resolution against a topology ------------------------------------------------------------------------


def resolve(rules: Iterable[Rule], fabric: Fabric, file: str | None = None,
            add_default: bool = True) -> Partitions:  # fmt: skip
    """Rules -> the fabric's partitions: members looked up, repeated P_Keys merged, missing P_Keys assigned,
    and (with `add_default`) OpenSM's implicit ``Default=0x7fff : ALL=limited, SELF=full ;``."""
    rules = list(rules)
    hosts = [h.name for h in fabric.hosts]
    order = {name: i for i, name in enumerate(hosts)}
    by_guid: dict[int, tuple[str | None, int]] = {}
    for node in fabric.nodes.values():
        if node.is_host:
            for port in range(1, node.ports + 1):
                by_guid[node.port_guid(port)] = (node.name, node.port_guid(port))
        else:
            by_guid[node.guid] = (None, node.guid)
    switches = sorted(n.guid for n in fabric.switches)
    used = {r.pkey for r in rules if r.pkey is not None}
    merged: dict[int, tuple[str, dict[_Key, Membership], Rule]] = {}
    names: dict[str, tuple[int, Rule]] = {}
    for rule in rules:
        if rule.pkey is None:
            rule.pkey = next(k for k in range(1, DEFAULT_PKEY) if k not in used)
            used.add(rule.pkey)
        if rule.name:
            seen = names.get(rule.name)
            if seen is not None and seen[0] != rule.pkey:
                raise PartitionError(
                    f"partition {rule.name!r} is defined with P_Key 0x{seen[0]:04x} on line "
                    f"{seen[1].line} and 0x{rule.pkey:04x} here", file=file, line=rule.line,
                    column=rule.column, field="name")  # fmt: skip
            names.setdefault(rule.name, (rule.pkey, rule))
        name, members, first = merged.setdefault(rule.pkey, (rule.name, {}, rule))
        if first is not rule:
            first.ipoib |= rule.ipoib
            first.flags.update({k: v for k, v in rule.flags.items() if k not in first.flags})
        for index, (word, membership, line, column) in enumerate(rule.members):
            chosen = membership or rule.defmember
            for key in _expand(word, hosts, switches, by_guid):
                if key is None:
                    where = rule.member_fields[index] if rule.member_fields else "members"
                    raise PartitionError(f"unknown member {word!r} (not a host of {fabric.name}, a port "
                                         f"GUID or one of {', '.join(KEYWORDS)})", file=file, line=line,
                                         column=column, field=where)  # fmt: skip
                members[key] = members[key].merged(chosen) if key in members else chosen
    if add_default and DEFAULT_PKEY not in merged:
        limited: dict[_Key, Membership] = {(h, None): Membership.LIMITED for h in hosts}
        merged[DEFAULT_PKEY] = (DEFAULT_NAME, limited, Rule(DEFAULT_NAME, DEFAULT_PKEY, 0))
    partitions = []
    for pkey, (name, members, first) in sorted(merged.items()):
        ordered = sorted(members.items(), key=lambda kv: (kv[0][0] is None, order.get(kv[0][0] or "", 0),
                                                            kv[0][1] or 0))  # fmt: skip
        partitions.append(
            Partition(
                name=name or f"pkey_0x{pkey:04x}",
                pkey=pkey,
                members=tuple(Member(m, host=h, guid=g if h is None else None) for (h, g), m in ordered),
                ipoib=first.ipoib,
                mtu_limit=first.flags.get("mtu"),
                rate_limit=first.flags.get("rate"),
                service_level=first.flags.get("sl"),
                scope=first.flags.get("scope"),
            )
        )
    return Partitions(tuple(partitions), configured=True)


_Key = tuple[str | None, int | None]


def _expand(word: str, hosts: list[str], switches: list[int],
            by_guid: dict[int, tuple[str | None, int]]) -> list[_Key | None]:  # fmt: skip
    if word in ("ALL", "ALL_CAS"):
        found: list[_Key | None] = [(h, None) for h in hosts]
        return found + ([(None, g) for g in switches] if word == "ALL" else [])
    if word == "ALL_SWITCHES":
        return [(None, g) for g in switches]
    if word in ("ALL_ROUTERS", "SELF"):
        return []
    if word in hosts:
        return [(word, None)]
    if re.fullmatch(r"0[xX][0-9a-fA-F]+|[0-9]+", word):
        host, guid = by_guid.get(int(word, 0), (None, -1))
        if guid == -1:
            return [None]
        return [(host, None) if host is not None else (None, guid)]
    return [None]


__all__ = [
    "KEYWORDS",
    "Rule",
    "member_of_dict",
    "parse_conf",
    "resolve",
    "rule_from_dict",
    "tokens",
]
