"""Topology files: shipped examples load, round trips are exact, every kind of bad input is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from topologies.errors import TopologyError
from topologies.generators import fat_tree, leaf_spine, rail
from topologies.loader import dump_yaml, load_topology, parse_topology
from topologies.model import Fabric, Link, Node, NodeKind, PortRef

EXAMPLES = sorted((ROOT / "topologies").glob("*.yaml"))

TINY = """fabriclab: 1
name: tiny
defaults: {bw_gbps: 100}
nodes:
  h1: {kind: host}
  h2: {kind: host}
  leaf1: {kind: switch, tier: 0}
links:
  - endpoints: ["h1:1", "leaf1:1"]
  - endpoints: ["h2:1", "leaf1:2"]
"""


def test_examples_are_shipped_and_valid() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"fat-tree-k4.yaml", "fat-tree-k8.yaml", "leaf-spine.yaml", "rail-2group.yaml"} <= names
    sizes = {p.name: load_topology(p) for p in EXAMPLES}
    assert len(sizes["fat-tree-k8.yaml"].hosts) == 128
    assert len(sizes["rail-2group.yaml"].hosts) == 64


def test_fat_tree_example_equals_generator() -> None:
    loaded = load_topology(ROOT / "topologies" / "fat-tree-k4.yaml")
    generated = fat_tree(4)
    assert loaded.nodes == generated.nodes and loaded.links == generated.links


@pytest.mark.parametrize(
    "fabric",
    [fat_tree(4), leaf_spine(3, 2, 4, parallel=2, uplink_bw_gbps=200), rail(2, 4, 2)],
    ids=lambda f: f.name,
)
def test_yaml_round_trip_is_exact(fabric: Fabric) -> None:
    text = dump_yaml(fabric)
    again = parse_topology(text)
    assert again.nodes == fabric.nodes
    assert again.links == fabric.links
    assert dump_yaml(again) == text


def test_round_trip_keeps_odd_names_latency_and_port_guids() -> None:
    nodes = {
        "1": Node("1", NodeKind.HOST, 0x10, 1, port_guids=((1, 0x99),)),
        "yes": Node("yes", NodeKind.HOST, 0x20, 1, description="a host # with a hash"),
        "sw:a": Node("sw:a", NodeKind.SWITCH, 0x30, 8, vendor_id=0x2C9, revision=0xA1),
    }
    links = (
        Link(PortRef("1", 1), PortRef("sw:a", 1), 100.0, 0.5),
        Link(PortRef("yes", 1), PortRef("sw:a", 2), 200.0, None),
    )
    fabric = Fabric("odd", nodes, links)
    again = parse_topology(dump_yaml(fabric))
    assert again.nodes == fabric.nodes and again.links == fabric.links


def test_explicit_file_defaults_and_derived_values() -> None:
    fabric = parse_topology(TINY)
    assert fabric.nodes["leaf1"].ports == 2  # highest port used
    assert all(link.bw_gbps == 100 for link in fabric.links)
    # GUIDs of hand-written nodes come from their names: stable whatever else is in the file
    other = parse_topology(
        TINY.replace("  h1: {kind: host}\n", "  h0: {kind: host}\n  h1: {kind: host}\n").replace(
            "links:\n", 'links:\n  - endpoints: ["h0:1", "leaf1:3"]\n'
        )
    )
    assert other.nodes["h1"].guid == fabric.nodes["h1"].guid


def test_generator_block_expands_to_the_model() -> None:
    fabric = parse_topology("name: big\ndescription: mine\ngenerator: {kind: fat-tree, k: 6, bw_gbps: 200}\n")
    assert fabric.name == "big" and fabric.description == "mine"
    assert len(fabric.hosts) == 54 and all(link.bw_gbps == 200 for link in fabric.links)


def _variant(old: str, new: str) -> str:
    assert old in TINY, old
    return TINY.replace(old, new)


BAD = [
    ("unknown top-level key", TINY + "colour: red\n", 11, "colour", "unknown key 'colour'"),
    (
        "typo in node key",
        _variant("h2: {kind: host}", "h2: {kind: host, tierr: 1}"),
        6,
        "nodes.h2.tierr",
        "did you mean 'tier'?",
    ),
    ("wrong type", _variant("tier: 0", "tier: zero"), 7, "nodes.leaf1.tier", "valid integer (got 'zero')"),
    ("bool for int", _variant("tier: 0", "tier: true"), 7, "nodes.leaf1.tier", "valid integer"),
    (
        "bad kind",
        _variant("h2: {kind: host}", "h2: {kind: router}"),
        6,
        "nodes.h2.kind",
        "'host' or 'switch'",
    ),
    ("missing kind", _variant("h2: {kind: host}", "h2: {pod: 1}"), 6, "nodes.h2.kind", "required"),
    (
        "dangling endpoint",
        _variant('"h2:1", "leaf1:2"', '"h3:1", "leaf1:2"'),
        10,
        "links[1].endpoints[0]",
        "unknown node 'h3'",
    ),
    (
        "port used twice",
        _variant('"h2:1", "leaf1:2"', '"h2:1", "leaf1:1"'),
        10,
        "links[1].endpoints[1]",
        "port leaf1:1 is already used by links[0] (line 9)",
    ),
    (
        "host with no link",
        _variant("  h2: {kind: host}\n", "  h2: {kind: host}\n  h3: {kind: host}\n"),
        7,
        "nodes.h3",
        "host h3 has no link",
    ),
    ("endpoint without port", _variant('"h2:1"', '"h2"'), 10, "links[1].endpoints[0]", '"node:port"'),
    ("port zero", _variant('"h2:1"', '"h2:0"'), 10, "links[1].endpoints[0]", "must be 1..254"),
    (
        "port beyond the node",
        _variant("tier: 0}", "tier: 0, ports: 1}"),
        10,
        "links[1].endpoints[1]",
        "port 2 does not exist on leaf1",
    ),
    (
        "two hosts linked",
        _variant('"h2:1", "leaf1:2"', '"h2:1", "h1:2"'),
        10,
        "links[1]",
        "connects two hosts",
    ),
    ("self link", _variant('"h2:1", "leaf1:2"', '"leaf1:3", "leaf1:2"'), 10, "links[1]", "to itself"),
    (
        "duplicate node",
        _variant("  h2: {kind: host}\n", "  h2: {kind: host}\n  h2: {kind: host}\n"),
        7,
        None,
        "duplicate key 'h2' (first at line 6)",
    ),
    (
        "duplicate GUID",
        TINY.replace("h1: {kind: host}", "h1: {kind: host, guid: 0x10}").replace(
            "h2: {kind: host}", "h2: {kind: host, guid: 0x10}"
        ),
        6,
        "nodes.h2",
        "already used by h1",
    ),
    (
        "bad GUID",
        _variant("h1: {kind: host}", "h1: {kind: host, guid: zz}"),
        5,
        "nodes.h1.guid",
        "not a GUID",
    ),
    ("numeric node name", _variant("h1: {kind: host}", "1: {kind: host}"), 5, "nodes.1", "quote 1"),
    ("negative bandwidth", _variant("bw_gbps: 100", "bw_gbps: -1"), 3, "defaults.bw_gbps", "greater than 0"),
    (
        "netem delay",
        _variant('- endpoints: ["h2:1", "leaf1:2"]', '- {endpoints: ["h2:1", "leaf1:2"], delay: 5}'),
        10,
        "links[1]",
        "no netem",
    ),
    (
        "disconnected",
        _variant("  leaf1:", "  h3: {kind: host}\n  leaf2: {kind: switch}\n  leaf1:")
        + '  - endpoints: ["h3:1", "leaf2:1"]\n',
        7,
        "nodes.h3",
        "not connected: 2 separate parts",
    ),
    ("missing name", _variant("name: tiny\n", ""), 1, "name", "required"),
    ("future format", _variant("fabriclab: 1", "fabriclab: 2"), 1, "fabriclab", "should be 1"),
    ("both forms", TINY + "generator: {kind: fat-tree, k: 4}\n", 1, None, "not both"),
    ("invalid YAML", _variant("links:", "links: [\n"), 10, None, "invalid YAML"),
    ("not a mapping", "- a\n- b\n", 1, None, "YAML mapping"),
    ("empty file", "", 1, None, "empty"),
    ("odd k", "name: x\ngenerator: {kind: fat-tree, k: 3}\n", 2, "generator.k", "even integer"),
    ("string k", "name: x\ngenerator:\n  kind: fat-tree\n  k: '4'\n", 4, "generator.k", "valid integer"),
    (
        "unknown generator",
        "name: x\ngenerator: {kind: hypercube}\n",
        2,
        "generator.kind",
        "unknown value 'hypercube'",
    ),
    (
        "generator typo",
        "name: x\ngenerator:\n  kind: rail\n  servers: 4\n  gpu: 8\n",
        5,
        "generator.gpu",
        "did you mean 'gpus'?",
    ),
    (
        "zero spines",
        "name: x\ngenerator: {kind: leaf-spine, leaves: 2, spines: 0, hosts_per_leaf: 4}\n",
        2,
        "generator.spines",
        "spines must be >= 1",
    ),
]


@pytest.mark.parametrize(("case", "text", "line", "field", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_files_name_file_line_and_field(
    case: str, text: str, line: int, field: str | None, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    error = info.value
    assert error.file == str(path)
    assert error.line == line, str(error)
    assert error.field == field, str(error)
    assert message in str(error)
    assert "\n" not in str(error)
    assert str(error).startswith(f"{path}:{line}: ")


def test_unreadable_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")
    binary = tmp_path / "x.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TopologyError, match="UTF-8"):
        load_topology(binary)
