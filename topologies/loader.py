"""Topology files: YAML in, `Fabric` out (and back).

Validation runs in layers — YAML syntax, the schema in `topologies.schema`, then the cross-checks in
`topologies.checks` — and every error names the file, the line and the field.  `dump_yaml` writes the
explicit form that `load_topology` reads back into an identical fabric.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from topologies.checks import Locator, check_fabric
from topologies.errors import InputError, TopologyError, read_input_file
from topologies.generators import generate
from topologies.model import Fabric, Link, Node, NodeKind, PortRef, guid_from_name
from topologies.schema import TopologyKeys, TopologySpec
from topologies.yamlio import Document, load_document, validate


class _YamlLocator(Locator):
    def __init__(self, document: Document) -> None:
        self.document = document
        self.file = document.file

    def node(self, name: str) -> tuple[int | None, str]:
        return self.document.key_line(("nodes", name)), f"nodes.{name}"

    def link(self, index: int, end: int | None = None) -> tuple[int | None, str]:
        path: tuple[str | int, ...] = ("links", index)
        if end is not None:
            path += ("endpoints", end)
        line = self.document.line_of(path)
        return line, super().link(index, end)[1]


def load_topology(path: str | Path) -> Fabric:
    """Read and validate a topology file."""
    return parse_topology(read_input_file(path, TopologyError), str(path))


def parse_topology(text: str, file: str = "<topology>") -> Fabric:
    try:
        return _parse(text, file)
    except TopologyError:
        raise
    except InputError as exc:
        raise TopologyError(exc.message, file=exc.file, line=exc.line, field=exc.field) from None


def _parse(text: str, file: str) -> Fabric:
    document = load_document(text, file)
    if not isinstance(document.data, dict):
        raise TopologyError(
            "a topology file is a YAML mapping (name:, nodes:, links: ...)", file=file, line=1
        )
    spec = validate(TopologySpec, document, TopologyKeys(document.data))
    if spec.generator is not None:
        params = spec.generator.model_dump(exclude={"kind"}, exclude_none=True)
        try:
            fabric = generate(spec.generator.kind, **params)
        except TopologyError as exc:
            path = tuple(exc.field.split(".")) if exc.field else ("generator",)
            raise exc.located(file, document.line_of(path)) from None
        fabric = Fabric(
            name=spec.name,
            nodes=fabric.nodes,
            links=fabric.links,
            description=spec.description or fabric.description,
            meta=fabric.meta,
        )
        check_fabric(fabric, Locator())
        return fabric
    return _explicit(spec, document)


def _explicit(spec: TopologySpec, document: Document) -> Fabric:
    assert spec.nodes is not None and spec.links is not None
    locator = _YamlLocator(document)
    links: list[Link] = []
    max_port: Counter[str] = Counter()
    for index, link_spec in enumerate(spec.links):
        (na, pa), (nb, pb) = link_spec.endpoints
        links.append(
            Link(
                PortRef(na, pa),
                PortRef(nb, pb),
                link_spec.bw_gbps if link_spec.bw_gbps is not None else spec.defaults.bw_gbps,
                link_spec.latency_us if link_spec.latency_us is not None else spec.defaults.latency_us,
            )
        )
        for name, port in ((na, pa), (nb, pb)):
            max_port[name] = max(max_port[name], port)
            if name not in spec.nodes:
                line, field = locator.link(index, 0 if name == na else 1)
                raise TopologyError(
                    f"unknown node {name!r}{_suggest(name, spec.nodes)}",
                    file=document.file,
                    line=line,
                    field=field,
                )
    nodes: dict[str, Node] = {}
    for name, node_spec in spec.nodes.items():
        kind = node_spec.kind or spec.defaults.kind
        if kind is None:
            raise document.error(("nodes", name, "kind"), "required field is missing (host or switch)")
        nodes[name] = Node(
            name=name,
            kind=NodeKind(kind),
            guid=node_spec.guid if node_spec.guid is not None else guid_from_name(name),
            ports=node_spec.ports if node_spec.ports is not None else max(max_port[name], 1),
            tier=node_spec.tier,
            pod=node_spec.pod,
            rail=node_spec.rail,
            group=node_spec.group,
            server=node_spec.server,
            description=node_spec.description,
            system_guid=node_spec.system_guid,
            vendor_id=node_spec.vendor_id,
            device_id=node_spec.device_id,
            revision=node_spec.revision,
            port_guids=tuple(sorted(node_spec.port_guids.items())),
        )
    fabric = Fabric(name=spec.name, nodes=nodes, links=tuple(links), description=spec.description)
    check_fabric(fabric, locator)
    return fabric


def _suggest(name: str, known: dict[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- writing ---------------------------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    """A YAML scalar that reads back as the same value (names such as `1` or `on` get quoted)."""
    if isinstance(value, str):
        try:
            plain_ok = yaml.safe_load(value) == value and value.strip() == value and "#" not in value
        except yaml.YAMLError:
            plain_ok = False
        if plain_ok and not any(c in value for c in ",[]{}"):
            return value
        return json.dumps(value)
    if isinstance(value, float):
        return repr(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _hex(value: int) -> str:
    return f"0x{value:016x}"


def dump_yaml(fabric: Fabric, header: str | None = None) -> str:
    """The explicit form of a fabric, one node or link per line, defaults factored out."""
    bw_counts = Counter(link.bw_gbps for link in fabric.links)
    default_bw = bw_counts.most_common(1)[0][0] if bw_counts else 400.0
    # A link without latency cannot be written under a latency default, so factor one out only if all have it.
    lat_counts = Counter(link.latency_us for link in fabric.links)
    default_lat = lat_counts.most_common(1)[0][0] if lat_counts and None not in lat_counts else None
    used_max: Counter[str] = Counter()
    for link in fabric.links:
        for ref in (link.a, link.b):
            used_max[ref.node] = max(used_max[ref.node], ref.port)

    out: list[str] = []
    if header:
        out.extend(f"# {line}".rstrip() for line in header.splitlines())
    out.append("fabriclab: 1")
    out.append(f"name: {_scalar(fabric.name)}")
    if fabric.description:
        out.append(f"description: {json.dumps(fabric.description)}")
    defaults = [f"bw_gbps: {_scalar(default_bw)}"]
    if default_lat is not None:
        defaults.append(f"latency_us: {_scalar(default_lat)}")
    out.append("defaults: {" + ", ".join(defaults) + "}")
    out.append("nodes:")
    for node in fabric.nodes.values():
        fields = [f"kind: {node.kind.value}", f"guid: {_hex(node.guid)}"]
        if node.ports != max(used_max[node.name], 1):
            fields.append(f"ports: {node.ports}")
        for attr in ("tier", "pod", "rail", "group", "server", "description"):
            value = getattr(node, attr)
            if value is not None:
                fields.append(f"{attr}: {_scalar(value)}")
        if node.system_guid is not None:
            fields.append(f"system_guid: {_hex(node.system_guid)}")
        for attr in ("vendor_id", "device_id", "revision"):
            value = getattr(node, attr)
            if value:
                fields.append(f"{attr}: 0x{value:x}")
        if node.port_guids:
            inner = ", ".join(f"{port}: {_hex(guid)}" for port, guid in node.port_guids)
            fields.append(f"port_guids: {{{inner}}}")
        out.append(f"  {_scalar(node.name)}: {{{', '.join(fields)}}}")
    out.append("links:")
    for link in fabric.links:
        fields = [f"endpoints: [{json.dumps(str(link.a))}, {json.dumps(str(link.b))}]"]
        if link.bw_gbps != default_bw:
            fields.append(f"bw_gbps: {_scalar(link.bw_gbps)}")
        if link.latency_us != default_lat and link.latency_us is not None:
            fields.append(f"latency_us: {_scalar(link.latency_us)}")
        out.append(f"  - {{{', '.join(fields)}}}")
    return "\n".join(out) + "\n"


__all__ = ["dump_yaml", "load_topology", "parse_topology"]
