"""QoS policy files: YAML (and a JSON body over REST) -> `controller.sm.qos.QosPolicy`, validated in layers.

Layer 1 is YAML (syntax, duplicate keys: `topologies.yamlio`), layer 2 this pydantic schema (unknown keys,
types, VL:weight lists that do not parse), layer 3 `controller.sm.qos.validate_policy` (DEFAULT present,
groups
and levels that exist, VLs that can send, members of the topology).  Every error is one `QosFileError` naming
the line and the field, so `fabriclab qos check` exits 2 and REST answers 422 with the same text.

The file (every section but `qos_levels` optional)::

    port_groups:
      trainers: {hosts: [h1, h2], guids: [0x02fab10100000000], pkeys: [0x8001], node_types: [CA]}
    qos_levels:
      DEFAULT: {sl: 0}
      training: {sl: 1}
      kvcache: {sl: 2, rate_limit_gbps: 100}
    match_rules:                       # first match wins; no match: DEFAULT
      - {source: trainers, destination: trainers, level: training}
      - {traffic_class: [8], level: kvcache}
    sl2vl: {1: 1, 2: 2}                # or a list of 16; unnamed SLs keep OpenSM's default (SL mod 8)
    vlarb:
      high: "7:255"                    # strict priority VLs
      low: "0:64, 1:192, 2:64"         # VL:weight, OpenSM's spelling (a list of [VL, weight] works too)
      high_limit: 255
    dscp_to_sl: {26: 1}                # overrides of DSCP >> 2
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from controller.sm.qos import (
    DEFAULT_SL2VL,
    MatchRule,
    PortGroup,
    QosError,
    QosLevel,
    QosPolicy,
    VlArbitration,
    validate_policy,
)
from topologies.errors import InputError
from topologies.model import Fabric
from topologies.yamlio import AllowedKeys, Document, PathItem, load_document, validate

MAX_QOS_BYTES = 1 << 20


class QosFileError(InputError):
    pass


def _number(value: Any) -> Any:
    """0x8001, "0x8001", 32769: integers as OpenSM writes them (hex strings included)."""
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)
        except ValueError:
            raise ValueError(f"not a number: {value!r}") from None
    return value


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str | int) and not isinstance(value, bool) else value


def _pairs(value: Any) -> Any:
    """ "0:64,1:192" (OpenSM), [[0, 64], [1, 192]] or {0: 64, 1: 192} -> [(0, 64), (1, 192)]."""
    if isinstance(value, str):
        pairs = []
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            match = re.fullmatch(r"(\d+)\s*:\s*(\d+)", item)
            if match is None:
                raise ValueError(f'{item!r} is not VL:weight (e.g. "0:64, 1:192")')
            pairs.append((int(match[1]), int(match[2])))
        return pairs
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items()]
    return value


Num = Annotated[int, BeforeValidator(_number)]
Nums = Annotated[list[Num], BeforeValidator(_listed)]
Names = Annotated[list[str], BeforeValidator(_listed)]
Pairs = Annotated[list[tuple[int, int]], BeforeValidator(_pairs)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GroupSpec(_Strict):
    hosts: Names = []
    guids: Nums = []
    pkeys: Nums = []
    node_types: Names = []


class LevelSpec(_Strict):
    sl: Annotated[int, Field(ge=0, le=15)]
    rate_limit_gbps: Annotated[float, Field(gt=0)] | None = None
    pkey: Num | None = None
    description: str | None = None


class RuleSpec(_Strict):
    level: str
    source: Names = []
    destination: Names = []
    pkey: Nums = []
    traffic_class: Nums = []
    description: str | None = None


class VlArbSpec(_Strict):
    high: Pairs = []
    low: Pairs = [(0, 255)]
    high_limit: Annotated[int, Field(ge=0, le=255)] = 255


class QosSpec(_Strict):
    port_groups: dict[str, GroupSpec] = {}
    qos_levels: dict[str, LevelSpec]
    match_rules: list[RuleSpec] = []
    sl2vl: (
        list[Annotated[int, Field(ge=0, le=7)]]
        | dict[Annotated[int, Field(ge=0, le=15)], Annotated[int, Field(ge=0, le=7)]]
        | None
    ) = None
    vlarb: VlArbSpec = VlArbSpec()
    dscp_to_sl: dict[Annotated[int, Field(ge=0, le=63)], Annotated[int, Field(ge=0, le=15)]] = {}


class _Keys(AllowedKeys):
    def for_path(self, path: Sequence[PathItem]) -> Sequence[str]:
        if not path:
            return list(QosSpec.model_fields)
        if len(path) == 2 and path[0] == "port_groups":
            return list(GroupSpec.model_fields)
        if len(path) == 2 and path[0] == "qos_levels":
            return list(LevelSpec.model_fields)
        if len(path) == 2 and path[0] == "match_rules":
            return list(RuleSpec.model_fields)
        if path == ("vlarb",):
            return list(VlArbSpec.model_fields)
        return ()


def to_policy(spec: QosSpec) -> QosPolicy:
    sl2vl = list(DEFAULT_SL2VL)
    if isinstance(spec.sl2vl, list):
        sl2vl = list(spec.sl2vl)
    elif isinstance(spec.sl2vl, dict):
        for sl, vl in spec.sl2vl.items():
            sl2vl[sl] = vl
    return QosPolicy(
        levels=tuple(
            QosLevel(name, lv.sl, lv.rate_limit_gbps, lv.pkey) for name, lv in spec.qos_levels.items()
        ),
        port_groups=tuple(
            PortGroup(
                name, tuple(g.hosts), tuple(g.guids), tuple(g.pkeys), tuple(t.upper() for t in g.node_types)
            )
            for name, g in spec.port_groups.items()
        ),
        rules=tuple(
            MatchRule(r.level, tuple(r.source), tuple(r.destination), tuple(r.pkey), tuple(r.traffic_class))
            for r in spec.match_rules
        ),
        sl2vl=tuple(sl2vl),
        vlarb=VlArbitration(tuple(spec.vlarb.high), tuple(spec.vlarb.low), spec.vlarb.high_limit),
        dscp_overrides=tuple(sorted(spec.dscp_to_sl.items())),
    )


def _path(field: str) -> list[PathItem]:
    """`match_rules[0].level` -> ["match_rules", 0, "level"] (to find its line)."""
    path: list[PathItem] = []
    for part in field.split("."):
        name, *indexes = re.split(r"\[(\d+)\]", part)
        if name:
            path.append(name)
        path.extend(int(i) for i in indexes if i)
    return path


def parse_policy(text: str, source: str, fabric: Fabric | None = None) -> QosPolicy:
    """A policy from YAML text (JSON is YAML too), validated whole, or one located `QosFileError`."""
    try:
        document = load_document(text, source)
    except InputError as exc:
        raise QosFileError(exc.message, file=exc.file, line=exc.line, field=exc.field) from None
    return policy_from_document(document, fabric)


def policy_from_document(document: Document, fabric: Fabric | None = None) -> QosPolicy:
    if not isinstance(document.data, dict):
        raise QosFileError(
            "a QoS policy is a mapping (qos_levels:, match_rules:, ...)", file=document.file, line=1
        )
    try:
        spec = validate(QosSpec, document, _Keys())
    except InputError as exc:
        raise QosFileError(exc.message, file=exc.file, line=exc.line, field=exc.field) from None
    try:
        return validate_policy(to_policy(spec), fabric)
    except QosError as exc:
        path = _path(exc.field or "")
        line = document.line_of(path) if path else 1
        raise QosFileError(exc.message, file=document.file, line=line, field=exc.field) from None


def policy_from_data(data: Any, source: str = "body", fabric: Fabric | None = None) -> QosPolicy:
    """A policy from already-parsed data (a REST body): the same layers, fields named without lines (the data
    goes through YAML once so that every layer sees the same node tree as for a file)."""
    try:
        text = yaml.safe_dump(data, sort_keys=False)
    except yaml.YAMLError as exc:
        raise QosFileError(f"cannot be read as a policy: {exc}", file=source) from None
    try:
        return parse_policy(text, source, fabric)
    except QosFileError as exc:
        raise QosFileError(exc.message, file=source, field=exc.field) from None


__all__ = [
    "QosFileError",
    "QosSpec",
    "parse_policy",
    "policy_from_data",
    "to_policy",
]
