"""Files from users cannot hang, crash or exhaust the process: recursive and runaway YAML aliases, absurd
nesting, devices, pipes and oversized files are refused with one located line, through every command that
reads them; valid YAML still reads exactly as PyYAML reads it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from topologies.errors import MAX_INPUT_BYTES, InputError, read_input_file
from topologies.yamlio import MAX_DEPTH, load_document
from traffic.errors import TrafficError
from traffic.trace import read_trace

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"


def billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


BAD_FILES = {
    "recursive-alias": ("a: &a [*a]\n", "recursive alias *a"),
    "recursive-mapping": ("name: x\nnodes: &n {h1: *n}\n", "recursive alias *n"),
    "billion-laughs": (billion_laughs(), "aliases expand to more than 100,000 nodes"),
    "deep-nesting": ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", f"nested more than {MAX_DEPTH} levels"),
    "huge-generator": (
        "name: x\ngenerator: {kind: fat-tree, k: 254}\n",
        "a k=254 fat-tree has 4,096,766 hosts",
    ),
    "huge-integer": (
        "name: x\nnodes:\n  h1: {kind: host, ports: " + "9" * 5000 + "}\n",
        "an integer of 5,000",
    ),
}


def _bounded() -> None:
    """Before the fix `/dev/zero` was read until memory ran out: cap what a failing run can take."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def python(*args: str) -> subprocess.CompletedProcess[str]:
    """In a process of its own, bounded in time and memory: before the fix these hung at 100% CPU, read
    forever or crashed the interpreter."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False, preexec_fn=_bounded
    )


def fabriclab(*args: str) -> subprocess.CompletedProcess[str]:
    return python("-m", "fabriclab", *args)


def assert_refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for needle in needles:
        assert needle in done.stderr, done.stderr


def scenario_of(topology: Path | str) -> str:
    return (
        f"fabriclab: 1\nname: t\ntopology: {topology}\nduration_s: 5\n"
        "traffic:\n  - {kind: udp, src: h1, dst: h16, rate_pps: 100}\n"
    )


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_yaml_is_refused_with_its_line(tmp_path: Path, kind: str) -> None:
    text, message = BAD_FILES[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    assert_refused(fabriclab("topo", "check", str(path)), f"{path}:", message)


def entry_points(bad: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Every command that reads a topology or scenario file, with `bad` in that place."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(scenario_of(bad))
    return {
        "topo check": ["topo", "check", str(bad)],
        "topo export-ibnet": ["topo", "export-ibnet", str(bad)],
        "route": ["route", str(bad)],
        "scenario check (topology)": ["scenario", "check", str(scenario)],
        "scenario check (file)": ["scenario", "check", str(bad)],
        "controller --topology": [
            "controller",
            "--topology",
            str(bad),
            "--api",
            "127.0.0.1:1",
            "--openflow",
            "127.0.0.1:2",
        ],
        "emulate up": ["emulate", "up", str(bad), "--no-cli"],
        "traffic --topology": [
            "traffic",
            "plan",
            "allreduce",
            "--ranks",
            "h1..h4",
            "--size",
            "1KiB",
            "--topology",
            str(bad),
        ],
    }


@pytest.mark.parametrize(
    "command",
    ["topo check", "topo export-ibnet", "route", "scenario check (topology)", "scenario check (file)",
     "controller --topology", "emulate up", "traffic --topology"],
)  # fmt: skip
def test_every_entry_point_refuses_a_recursive_alias_and_a_device(tmp_path: Path, command: str) -> None:
    alias = tmp_path / "alias.yaml"
    alias.write_text("a: &a [*a]\n")
    assert_refused(fabriclab(*entry_points(alias, tmp_path)[command]), "alias.yaml:1: recursive alias *a")
    # a scenario naming /dev/zero as its topology read forever
    assert_refused(
        fabriclab(*entry_points(Path("/dev/zero"), tmp_path)[command]),
        "/dev/zero: not a regular file (a character device)",
    )


def test_pipes_directories_and_oversized_files_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "topo.yaml"
    os.mkfifo(fifo)  # opening a FIFO with no writer blocks; reading one never ends
    assert_refused(fabriclab("topo", "check", str(fifo)), "not a regular file (a named pipe)")
    assert_refused(fabriclab("route", str(tmp_path)), f"{tmp_path}: is a directory, not a file")
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(MAX_INPUT_BYTES + 1)  # sparse: no disk used
    assert_refused(fabriclab("topo", "check", str(big)), f"too large: {MAX_INPUT_BYTES + 1:,} bytes")
    with pytest.raises(InputError, match="not a text file"):
        (tmp_path / "bin.yaml").write_bytes(b"name: \xff\xfe\n")
        read_input_file(tmp_path / "bin.yaml")


def test_traces_are_read_with_the_same_limits(tmp_path: Path) -> None:
    done = python("-c", "from traffic.trace import read_trace; read_trace('/dev/zero')")
    assert "TrafficError: /dev/zero: not a regular file (a character device)" in done.stderr, done.stderr
    good = '{"time_us":0,"src":"h1","dst":"h2","bytes":1,"qp":1,"tclass":3,"tag":""}'
    for line, message in [
        ('{"time_us":0,"src":"h1","dst":"h2","bytes":' + "9" * 5000 + "}", "json: not a trace record"),
        ("[" * 100_000 + "]" * 100_000, "json: not a trace record"),
    ]:
        path = tmp_path / "t.jsonl"
        path.write_text(good + "\n" + line + "\n")
        with pytest.raises(TrafficError, match=f"t.jsonl:2: {message}"):
            read_trace(path)


SHIPPED = sorted([*(ROOT / "scenarios").glob("*.yaml"), *(ROOT / "topologies").glob("*.yaml")])


@pytest.mark.parametrize(
    "text",
    [
        "defaults: &d {bw_gbps: 400, latency_us: 1}\nnodes:\n  h1: {<<: *d, kind: host}\n  h2: {<<: *d}\n",
        "a: &a {x: [1, 2, &b {y: z}]}\nb: *a\nc: [*a, *b, *b]\nd: !!str 12\n"
        "e: [1.5, .inf, null, true, 0x1f]\n",
        "- &x 1\n- *x\n- {? a : c, ? b }\n- |\n  text\n",
        "just a scalar",
        *(path.read_text() for path in SHIPPED),
    ],
    ids=["merge-keys", "aliases-and-tags", "sequence-root", "scalar-root", *(path.name for path in SHIPPED)],
)
def test_valid_yaml_reads_as_pyyaml_reads_it(text: str) -> None:
    """The composer that replaced PyYAML's gives the same data (the tree itself is compared in
    `test_composed_tree_equals_pyyamls`)."""
    assert load_document(text, "f.yaml").data == yaml.safe_load(text)


def test_composed_tree_equals_pyyamls() -> None:
    text = (ROOT / "topologies" / "fat-tree-k8.yaml").read_text() + "extra: &e [a, {b: c}]\nmore: *e\n"

    def flat(node: yaml.Node | None) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        stack: list[yaml.Node] = [node] if node is not None else []
        seen: set[int] = set()
        while stack:
            n = stack.pop()
            value = n.value if isinstance(n, yaml.ScalarNode) else id(n) in seen
            marks = (n.start_mark.line, n.start_mark.column, n.end_mark.line, n.end_mark.column)
            out.append((type(n).__name__, n.tag, *marks, value))
            seen.add(id(n))
            if isinstance(n, yaml.SequenceNode):
                stack.extend(reversed(n.value))
            elif isinstance(n, yaml.MappingNode):
                for key, item in reversed(n.value):
                    stack += [item, key]
        return out

    mine = flat(load_document(text, "f.yaml").root)
    assert len(mine) > 1000 and mine == flat(yaml.compose(text, Loader=yaml.SafeLoader))


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("a: 1\nb: *nope\n", 2, "undefined alias *nope"),
        ("a: 1\n---\nb: 2\n", 2, "more than one YAML document"),
        ("a: &x {k: 1, k: 2}\nb: *x\n", 1, "duplicate key 'k' (first at line 1)"),
        ("a:\n  b: &b\n    c: [*b]\n", 3, "recursive alias *b"),
    ],
)
def test_structural_errors_are_located(text: str, line: int, message: str) -> None:
    with pytest.raises(InputError) as info:
        load_document(text, "f.yaml")
    assert (info.value.line, info.value.message.startswith(message)) == (line, True), str(info.value)


def test_aliases_used_as_defaults_on_every_entry_are_fine() -> None:
    """The expansion bound scales with the file: `<<: *defaults` on each of 20,000 nodes is not refused."""
    nodes = "".join(f"  n{i}: {{<<: *d, id: {i}}}\n" for i in range(20_000))
    doc = load_document(f"defaults: &d {{a: 1, b: 2, c: [1, 2, 3]}}\nnodes:\n{nodes}", "f.yaml")
    assert doc.data["nodes"]["n19999"] == {"a": 1, "b": 2, "c": [1, 2, 3], "id": 19999}
