"""Partitions: OpenSM's partitions.conf grammar (doc/partition-config.txt), its defaults, the YAML form, the
permission rule, and every kind of bad input rejected whole with line and column (exit 2 on the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.formats.partitions_file import load_partitions
from controller.sm.partitions import FULL_BIT, Membership, PartitionError, Partitions, parse_pkey
from controller.sm.partitions_conf import parse_conf, resolve, tokens
from emulation.rocerun import pair_pkey
from fabriclab.cli import main
from tests.conftest import ROOT
from topologies.generators import fat_tree
from topologies.model import Fabric

K4 = ROOT / "topologies" / "fat-tree-k4.yaml"


@pytest.fixture(scope="module")
def k4() -> Fabric:
    return fat_tree(4)


def _resolve(text: str, fabric: Fabric) -> Partitions:
    return resolve(parse_conf(text), fabric)


def _members(parts: Partitions, pkey: int) -> dict[str, str]:
    found = parts.get(pkey)
    assert found is not None
    return {(m.host or f"0x{m.guid:016x}"): m.membership.value for m in found.members}


def test_opensm_examples_parse(k4: Fabric) -> None:
    """The examples of OpenSM's doc/partition-config.txt, with our hosts and GUIDs in place of theirs."""
    g1, g2 = hex(k4.nodes["h1"].port_guid(1)), hex(k4.nodes["h2"].port_guid(1))
    text = f"""
Default=0x7fff : ALL, SELF=full ;
NewPartition , ipoib : {g1}=full, {g2}, h3 ;
YetAnotherOne = 0x300 : SELF=full ;
YetAnotherOne = 0x300 : ALL=limited ;
ShareIO = 0x80 , defmember=full : h4, h5; # h6, h7 will be limited
ShareIO = 0x80 : h6, h7, h8=full; # comment
ShareIO = 0x80 , defmember=full : h9, h10=limited;
"""
    parts = _resolve(text, k4)
    default = _members(parts, 0x7FFF)
    assert default["h1"] == "limited" and len([h for h in default if h.startswith("h")]) == 16
    assert sum(1 for k in default if k.startswith("0x")) == 20  # ALL includes the switches' port 0
    new = parts.partitions[0]
    assert new.name == "NewPartition" and new.ipoib and new.pkey == 1  # no P_Key given: lowest unused
    assert _members(parts, 1) == {"h1": "full", "h2": "limited", "h3": "limited"}
    assert _members(parts, 0x300)["h16"] == "limited"
    assert _members(parts, 0x80) == {"h4": "full", "h5": "full", "h6": "limited", "h7": "limited",
                                     "h8": "full", "h9": "full", "h10": "limited"}  # fmt: skip


def test_low_15_bits_repeated_keys_merge_first_name_wins(k4: Fabric) -> None:
    parts = _resolve("a=0x8010 : h1 ; b=0x0010 : h1=full, h2 ; a=0x10, ipoib : h3=both ;", k4)
    p = parts.get(0x10)
    assert p is not None and p.name == "a" and p.ipoib
    assert _members(parts, 0x10) == {"h1": "full", "h2": "limited", "h3": "both"}
    assert parse_pkey("0x8001") == parse_pkey(1) == parse_pkey("1") == 1


def test_defaults_without_a_file_and_without_a_default_rule(k4: Fabric) -> None:
    none = load_partitions(None, k4)
    assert not none.configured and _members(none, 0x7FFF)["h7"] == "full"
    assert none.permitted("h1", "h16")
    parts = _resolve("a=1 : h1=full, h2 ;", k4)
    assert _members(parts, 0x7FFF) == {f"h{i}": "limited" for i in range(1, 17)}  # ALL=limited, SELF=full
    assert parts.permitted("h1", "h2") and not parts.permitted("h2", "h3") and not parts.permitted("h3", "h4")


def test_permission_rule(k4: Fabric) -> None:
    parts = _resolve("t=1 : h1=full, h2, h3 ; u=2 : h2=full, h4 ; v=3 : h5=both, h6 ;", k4)
    assert parts.permitted("h1", "h2") and parts.permitted("h3", "h1")  # full-limited both ways
    assert not parts.permitted("h2", "h3")  # limited-limited
    assert parts.permitted("h2", "h4")  # through u, where h2 is full
    assert not parts.permitted("h1", "h4")  # nothing shared
    assert parts.permitted("h5", "h6")  # both counts as full
    assert parts.shared("h2", "h4") == (2,)
    assert parts.pkey_for("h1", "h2") == 1 | FULL_BIT and parts.pkey_for("h2", "h1") == 1
    assert parts.pkey_for("h1", "h4") is None
    assert pair_pkey(parts, "h4", "h2") == 2 and pair_pkey(None, "h1", "h2") == 0xFFFF
    hosts = [h.name for h in k4.hosts]
    for conf in (parts, _resolve(ROOT.joinpath("scenarios/partitions-k4.conf").read_text(), k4)):
        for a in hosts:  # the precomputed relation the flows are compiled from is the rule, pair by pair
            for b in hosts:
                if a != b:
                    assert (b in conf.peers.get(a, ())) == conf.permitted(a, b), (a, b)


def test_tokens_know_line_and_column() -> None:
    toks = list(tokens("a = 0x1 :\n  h1=full ; # x\n b : ;"))
    assert [(t.text, t.line, t.column) for t in toks[:5]] == [("a", 1, 1), ("=", 1, 3), ("0x1", 1, 5),
                                                               (":", 1, 9), ("h1", 2, 3)]  # fmt: skip
    assert (toks[-3].text, toks[-3].line, toks[-3].column) == ("b", 3, 2)


BAD = [
    ("a=1 : h1=full", 1, 10, "not terminated by ';'"),  # syntax: no ';'
    ("a=1 : h1 ;\nb=2 h2 ;", 2, 8, "expected ':'"),
    ("a=1 : h1\nb=2 : h2 ;", 2, 5, "the ';' ending the rule before it missing"),
    ("a=1 : h1=,h2 ;", 1, 9, "expected 'member' or 'member=full|limited|both'"),
    ("a=1 : h1=fool ;", 1, 10, "membership 'fool'"),
    ("a=1,colour=red : h1 ;", 1, 5, "unknown flag 'colour'"),
    ("a=1,sl=99 : h1 ;", 1, 8, "sl=99 is outside 0..15"),
    ("a=1,mtu=x : h1 ;", 1, 9, "mtu must be an integer"),
    ("a=1 : h1, h99 ;", 1, 11, "unknown member 'h99'"),  # unknown members
    ("a=1 : 0x1234 ;", 1, 7, "unknown member '0x1234'"),
    ("a=0x8000 : h1 ;", 1, 3, "outside 0x0001-0x7fff"),  # P_Key out of range
    ("a=0 : h1 ;", 1, 3, "outside 0x0001-0x7fff"),
    ("a=0x10000 : h1 ;", 1, 3, "outside 0x0001-0x7fff"),
    ("a=banana : h1 ;", 1, 3, "is not a number"),
    ("a=1 : h1 ;\n  a=2 : h2 ;", 2, 3, "'a' is defined with P_Key 0x0001 on line 1 and 0x0002"),  # dup names
]


@pytest.mark.parametrize(("text", "line", "column", "message"), BAD, ids=[b[3][:30] for b in BAD])
def test_bad_files_name_line_and_column(
    k4: Fabric,
    tmp_path: Path,
    text: str,
    line: int,
    column: int,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "p.conf"
    path.write_text(text)
    with pytest.raises(PartitionError) as err:
        load_partitions(path, k4)
    assert (err.value.line, err.value.column) == (line, column), str(err.value)
    assert message in str(err.value) and str(err.value).startswith(f"{path}:{line}:{column}: ")
    assert main(["partitions", "check", str(path), "--topology", str(K4)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and f"{path}:{line}:{column}: " in out.err


def test_check_prints_the_resolved_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["partitions", "check", str(ROOT / "scenarios" / "partitions-k4.conf"), "--topology", str(K4)])
        == 0
    )
    model = json.loads(capsys.readouterr().out)
    names = [(p["name"], p["pkey"]) for p in model["partitions"]]
    assert names == [("train", "0x0001"), ("infer", "0x0002"), ("Default", "0x7fff")]
    assert model["partitions"][1]["members"][:2] == [{"host": "h9", "membership": "full"},
                                                     {"host": "h10", "membership": "limited"}]  # fmt: skip


def test_yaml_form_is_the_same_model(k4: Fabric, tmp_path: Path) -> None:
    conf = load_partitions(ROOT / "scenarios" / "partitions-k4.conf", k4)
    yaml_file = tmp_path / "p.yaml"
    body = {"partitions": [p.as_dict() for p in conf.partitions]}
    yaml_file.write_text(json.dumps(body))  # JSON is YAML
    assert load_partitions(yaml_file, k4) == conf
    yaml_file.write_text("partitions:\n  - name: t\n    pkey: 0x8001\n    members:\n      - {host: h1}\n"
                         "      - {host: h77, membership: full}\n")  # fmt: skip
    with pytest.raises(PartitionError, match=r"p.yaml:6: partitions\[0\].members\[1\]: unknown member 'h77'"):
        load_partitions(yaml_file, k4)
    yaml_file.write_text("partitions:\n  - name: t\n    pkey: 0x8000\n")
    with pytest.raises(PartitionError, match=r"p.yaml:3: partitions\[0\].pkey: P_Key 32768 is outside"):
        load_partitions(yaml_file, k4)
    yaml_file.write_text("partitions:\n  - {name: t, pkey: 1, members: [{host: h1, membership: most}]}\n")
    with pytest.raises(PartitionError, match="membership must be full, limited or both"):
        load_partitions(yaml_file, k4)


def test_membership_order() -> None:
    assert Membership.LIMITED.merged(Membership.FULL) is Membership.FULL
    assert Membership.BOTH.merged(Membership.FULL) is Membership.BOTH and Membership.BOTH.full
