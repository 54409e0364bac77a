"""OpenSM's own `qos-policy.conf` syntax (doc/QoS_management_in_OpenSM.txt), read into the same policy.

    port-groups
        port-group
            name: Storage
            port-guid: 0x02fab10100000000, 0x02fab10100000100
            port-name: h3, h4            # host names (OpenSM: node description/port)
            pkey: 0x8001
            node-type: CA
        end-port-group
    end-port-groups
    qos-setup
        vlarb-tables
            vlarb-scope
                vlarb-high: 7:255
                vlarb-low: 0:32,1:192,2:64
                vl-high-limit: 255
            end-vlarb-scope
        end-vlarb-tables
        sl2vl-tables
            sl2vl-scope
                sl2vl-table: 0,1,2,3,4,5,6,7,0,1,2,3,4,5,6,7
            end-sl2vl-scope
        end-sl2vl-tables
    end-qos-setup
    qos-levels
        qos-level
            name: DEFAULT
            sl: 0
        end-qos-level
    end-qos-levels
    qos-match-rules
        qos-match-rule
            qos-class: 4-7, 12
            source: Storage
            destination: Storage
            pkey: 0x8001
            qos-level-name: DEFAULT
        end-qos-match-rule
    end-qos-match-rules

One fabric-wide scope: `group:`/`across:` of the vlarb and sl2vl scopes (per-port tables) are refused, as
are `qos-ulps` (application-level rules); `use:` is a comment.  `rate-limit` takes OpenSM's rate codes (IB
PathRecord rates: 3 = 10 Gb/s, 16 = 100 Gb/s, ...) or a number with `G` (`100G`).  `qos-class` ranges are
traffic classes (DSCP values here).  Errors name the line of the statement at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.formats.qosfile import QosFileError, policy_from_data
from controller.sm.qos import QosPolicy
from topologies.model import Fabric

#: IB PathRecord rate codes -> Gb/s (IBA 1.3, table 224 and its extensions).
RATE_CODES = {2: 2.5, 3: 10, 4: 30, 5: 5, 6: 20, 7: 40, 8: 60, 9: 80, 10: 120, 11: 14, 12: 56, 13: 112,
              14: 168, 15: 25, 16: 100, 17: 200, 18: 300, 19: 28, 20: 50, 21: 400, 22: 600}  # fmt: skip
SECTIONS = ("port-groups", "qos-setup", "qos-levels", "qos-match-rules", "qos-ulps")
_BLOCKS = {
    "port-groups": "port-group",
    "qos-levels": "qos-level",
    "qos-match-rules": "qos-match-rule",
    "vlarb-tables": "vlarb-scope",
    "sl2vl-tables": "sl2vl-scope",
}


def looks_like_opensm(text: str) -> bool:
    for line in text.splitlines():
        word = line.split("#", 1)[0].strip()
        if word:
            return word in SECTIONS
    return False


def _numbers(value: str) -> list[int]:
    """ "4-7, 12" -> [4, 5, 6, 7, 12]; hex allowed."""
    result: list[int] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low, 0), int(high or low, 0)
        if last < first or last - first > 4096:
            raise ValueError(f"bad range {part!r}")
        result.extend(range(first, last + 1))
    return result


def _int(value: str) -> int:
    return int(value.strip(), 0)


def _names(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def _rate(value: str) -> float:
    text = value.strip().upper()
    if text.endswith("G"):
        return float(text[:-1])
    code = int(text, 0)
    if code not in RATE_CODES:
        raise ValueError(f"unknown rate code {code} (known: {sorted(RATE_CODES)})")
    return float(RATE_CODES[code])


def parse_opensm(text: str, source: str, fabric: Fabric | None = None) -> QosPolicy:
    """The policy of a `qos-policy.conf`, validated like a YAML one (`QosFileError` with line and field)."""
    data: dict[str, Any] = {"port_groups": {}, "qos_levels": {}, "match_rules": [], "vlarb": {}}
    lines: dict[str, int] = {}  # field -> line, to place errors of the later layers
    stack: list[str] = []
    item: dict[str, Any] = {}
    item_line = 0

    def fail(message: str, line: int, field: str | None = None) -> QosFileError:
        return QosFileError(message, file=source, line=line, field=field)

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, colon, value = line.partition(":")
        key = key.strip().lower()
        if not colon:
            if key in SECTIONS and not stack:
                if key == "qos-ulps":
                    raise fail("qos-ulps (application rules) are not supported; use qos-match-rules", number)
                stack.append(key)
            elif key in ("vlarb-tables", "sl2vl-tables") and stack == ["qos-setup"]:
                stack.append(key)
            elif stack and _BLOCKS.get(stack[-1]) == key:
                stack.append(key)
                item, item_line = {}, number
            elif stack and key == f"end-{stack[-1]}":
                done = stack.pop()
                if done in _BLOCKS.values():
                    _store(done, item, item_line, data, lines, fail)
            else:
                where = " > ".join(stack) or "top level"
                raise fail(f"unexpected {key!r} in {where}", number)
            continue
        if not stack or stack[-1] not in _BLOCKS.values():
            raise fail(f"{key!r} outside a port-group, qos-level, qos-match-rule or scope", number)
        if key in item:
            raise fail(f"{key!r} given twice", number)
        item[key] = (value.strip(), number)
    if stack:
        raise fail(f"{stack[-1]!r} is not closed (end-{stack[-1]})", len(text.splitlines()) or 1)
    try:
        return policy_from_data(data, source, fabric)
    except QosFileError as exc:
        field = exc.field or ""
        at = next(
            (ln for f, ln in sorted(lines.items(), key=lambda kv: -len(kv[0])) if field.startswith(f)), 1
        )
        raise QosFileError(exc.message, file=source, line=at, field=exc.field) from None


def _store(
    kind: str, item: dict[str, Any], at: int, data: dict[str, Any], lines: dict[str, int], fail: Any
) -> None:
    def take(key: str, convert: Any, field: str) -> Any:
        value, line = item.pop(key)
        lines[field] = line
        try:
            return convert(value)
        except ValueError as exc:
            raise fail(f"{key}: {exc}", line, field) from None

    name = item.get("name", ("", at))[0]
    item.pop("use", None)
    if kind == "port-group":
        item.pop("name", None)
        if not name:
            raise fail("a port-group needs a name", at)
        group: dict[str, Any] = {}
        field = f"port_groups.{name}"
        lines[field] = at
        table: list[tuple[str, str, Callable[[str], Any]]] = [
            ("port-guid", "guids", _numbers),
            ("port-name", "hosts", _names),
            ("pkey", "pkeys", _numbers),
            ("node-type", "node_types", _names),
        ]
        for key, target, convert in table:
            if key in item:
                group[target] = take(key, convert, f"{field}.{target}")
        data["port_groups"][name] = group
    elif kind == "qos-level":
        item.pop("name", None)
        if not name:
            raise fail("a qos-level needs a name", at)
        field = f"qos_levels.{name}"
        lines[field] = at
        level: dict[str, Any] = {}
        table = [("sl", "sl", _int), ("rate-limit", "rate_limit_gbps", _rate), ("pkey", "pkey", _int)]
        for key, target, convert in table:
            if key in item:
                level[target] = take(key, convert, f"{field}.{target}")
        for key in ("mtu-limit", "packet-life"):
            item.pop(key, None)  # path properties the Ethernet fabric does not have
        data["qos_levels"][name] = level
    elif kind == "qos-match-rule":
        field = f"match_rules[{len(data['match_rules'])}]"
        lines[field] = at
        rule: dict[str, Any] = {}
        table = [
            ("qos-level-name", "level", str),
            ("source", "source", _names),
            ("destination", "destination", _names),
            ("pkey", "pkey", _numbers),
            ("qos-class", "traffic_class", _numbers),
        ]
        for key, target, convert in table:
            if key in item:
                rule[target] = take(key, convert, f"{field}.{target}")
        item.pop("service-id", None)
        data["match_rules"].append(rule)
    elif kind == "vlarb-scope":
        for key in ("group", "across", "across-to", "across-from"):
            if key in item:
                raise fail(
                    f"{key}: per-port arbitration tables are not supported (one fabric-wide scope)",
                    item[key][1],
                )
        lines["vlarb"] = at
        table = [
            ("vlarb-high", "high", str),
            ("vlarb-low", "low", str),
            ("vl-high-limit", "high_limit", _int),
        ]
        for key, target, convert in table:
            if key in item:
                data["vlarb"][target] = take(key, convert, f"vlarb.{target}")
    elif kind == "sl2vl-scope":
        for key in ("group", "across", "across-to", "across-from"):
            if key in item:
                raise fail(
                    f"{key}: per-port SL2VL tables are not supported (one fabric-wide scope)", item[key][1]
                )
        if "sl2vl-table" in item:
            data["sl2vl"] = take("sl2vl-table", lambda v: [int(x, 0) for x in _names(v)], "sl2vl")
    for key, (_, line) in item.items():
        raise fail(f"unknown statement {key!r} in {kind}", line)


__all__ = ["RATE_CODES", "looks_like_opensm", "parse_opensm"]
