"""Partitions files: OpenSM's ``partitions.conf`` syntax, or the YAML form of the same model.

The grammar and the resolution against a topology are pure (`controller.sm.partitions_conf`); this module
only reads the file and, for YAML, keeps where each value was written so errors name the line.
"""

from __future__ import annotations

from pathlib import Path

from controller.sm.partitions import PartitionError, Partitions, default_partitions
from controller.sm.partitions_conf import Rule, parse_conf, resolve, rule_from_dict
from topologies.errors import InputError, read_input_file
from topologies.model import Fabric
from topologies.yamlio import load_document


def parse_yaml(text: str, file: str) -> list[Rule]:
    """``partitions: [{name, pkey, ip_over_ib, mtu_limit, service_level, rate_limit, defmember,
    members: [{host | guid, membership}]}]`` -> rules (errors name the line and the field)."""
    document = load_document(text, file)
    data = document.data
    if not isinstance(data, dict) or set(data) != {"partitions"} or not isinstance(data["partitions"], list):
        raise PartitionError("expected one key 'partitions' holding a list", file=file,
                             line=document.line_of([]), field="partitions")  # fmt: skip
    rules = []
    for index, entry in enumerate(data["partitions"]):
        path: list[str | int] = ["partitions", index]

        def fail(message: str, *sub: str | int, _path: list[str | int] = path) -> PartitionError:
            where = [*_path, *sub]
            return PartitionError(message, file=file, line=document.line_of(where),
                                  field=document.field_name(where))  # fmt: skip

        try:
            rule = rule_from_dict(entry, document.line_of(path) or 0, fail)
            where = [[*path, "members", i] for i in range(len(rule.members))]
            rule.members = [
                (w, m, document.line_of(at) or 0, None)
                for (w, m, _, _), at in zip(rule.members, where, strict=True)
            ]
            rule.member_fields = [document.field_name(at) for at in where]
            rules.append(rule)
        except PartitionError as exc:
            if exc.file is None:
                raise fail(exc.message, *(exc.field.split(".") if exc.field else [])) from None
            raise
    return rules


def load_partitions(path: str | Path | None, fabric: Fabric) -> Partitions:
    """A partitions file (OpenSM syntax, or YAML when it ends in .yaml/.yml) resolved against `fabric`;
    None -> OpenSM's no-file default.  Raises PartitionError (InputError) with file, line and column."""
    if path is None:
        return default_partitions(h.name for h in fabric.hosts)
    file = str(path)
    text = read_input_file(path)
    try:
        rules = parse_yaml(text, file) if file.endswith((".yaml", ".yml")) else parse_conf(text)
        return resolve(rules, fabric, file)
    except PartitionError as exc:
        raise exc.located(file) from None
    except InputError as exc:
        raise PartitionError(exc.message, file=exc.file or file, line=exc.line, field=exc.field) from None


__all__ = ["load_partitions", "parse_yaml"]
