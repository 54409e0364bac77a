"""The `fabriclab` command line, end to end: what a user types, what they see, what exit code they get."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabriclab.cli import main
from tests.conftest import ROOT
from topologies.loader import load_topology


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_check_route_report_and_dump(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    topo = tmp_path / "ft4.yaml"
    code, _, err = run(capsys, "topo", "generate", "fat-tree", "--k", "4", "-o", str(topo))
    assert code == 0 and "20 switches, 16 hosts" in err
    assert load_topology(topo).name == "fat-tree-k4"

    code, out, _ = run(capsys, "topo", "check", str(topo))
    assert code == 0 and out.startswith(f"ok: {topo}: fat-tree-k4: 20 switches, 16 hosts")

    code, out, _ = run(capsys, "route", str(topo), "--engine", "ftree", "--report")
    assert code == 0
    assert "all 240 host pairs reachable" in out
    assert "deadlock-free with 1 VL(s)" in out
    assert "worst 1 flow(s) on one link" in out
    assert "switch links" in out and "1.077" in out

    dump = tmp_path / "out"
    code, _, _ = run(capsys, "route", str(topo), "--engine", "ftree", "--dump-dir", str(dump))
    assert code == 0
    lfts = (dump / "opensm-lfts.dump").read_text()
    assert lfts.startswith("Unicast lids [0-36] of switch Lid 17 guid 0x")
    assert lfts.count("lids dumped") == 20
    assert len((dump / "opensm-subnet.lst").read_text().splitlines()) == 16 + 20 * 4
    assert json.loads((dump / "report.json").read_text())["verification"]["ok"] is True


def test_json_report_is_machine_readable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "route",
        str(ROOT / "topologies" / "rail-2group.yaml"),
        "--engine",
        "sssp",
        "--report",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    assert report["engine"] == "sssp"
    assert report["fabric"]["hosts"] == 64
    assert report["verification"]["unreachable_pairs"] == 0
    assert report["all_to_all"]["switch_links"]["max_over_mean"] <= 1.1
    assert report["shift"]["shifts_evaluated"] == 63


def test_same_input_gives_byte_identical_dumps(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    topo = str(ROOT / "topologies" / "fat-tree-k8.yaml")
    for name in ("a", "b"):
        assert run(capsys, "route", topo, "--engine", "sssp", "--dump-dir", str(tmp_path / name))[0] == 0
    for file in ("opensm-lfts.dump", "opensm-subnet.lst"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()


def test_degraded_routing_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "route",
        str(ROOT / "topologies" / "fat-tree-k4.yaml"),
        "--engine",
        "updn",
        "--fail-links",
        "3",
        "--fail-switches",
        "1",
        "--seed",
        "4",
        "--report",
    )
    assert code == 0
    assert "degraded      3 link(s) and 1 switch(es) (1 agg: agg4) failed (seed 4)" in out
    assert "host pairs reachable" in out


def test_engines_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "engines")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["minhop", "updn", "ftree", "sssp", "dfsssp"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["route", "nope.yaml"], "nope.yaml: no such file"),
        (["route", "{topo}", "--engine", "lash"], "unknown routing engine 'lash'"),
        (["route", "{topo}", "--vls", "0"], "--vls must be 1..15"),
        (["route", "{topo}", "--fail-links", "999"], "cannot fail 999 links"),
        (["route", "{topo}", "--sm-node", "h99"], "no node 'h99'"),
        (["topo", "generate", "fat-tree", "--k", "5"], "--k: k must be an even integer"),
        (["topo", "check", "{bad}"], "bad.yaml:3: nodes.h1.kind: Input should be 'host' or 'switch'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes:\n  h1: {kind: hots}\nlinks: []\n")
    topo = str(ROOT / "topologies" / "fat-tree-k4.yaml")
    argv = [a.format(topo=topo, bad=bad) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("fabriclab: error: ")
    assert message in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngenerator: {kind: fat-tree, k: 3}\n")
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "--debug", "topo", "check", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode != 0 and "Traceback" in done.stderr and "TopologyError" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "fabriclab", "topo", "check", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_console_script_is_installed() -> None:
    done = subprocess.run(["fabriclab", "engines"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "ftree" in done.stdout


def test_failed_verification_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # a ring routed with minhop is reachable but deadlocks with one VL: the report says so, exit code 1
    ring = tmp_path / "ring.yaml"
    nodes = "".join(f"  h{i}: {{kind: host}}\n  s{i}: {{kind: switch}}\n" for i in range(1, 6))
    links = "".join(
        f'  - endpoints: ["h{i}:1", "s{i}:1"]\n  - endpoints: ["s{i}:2", "s{i % 5 + 1}:3"]\n'
        for i in range(1, 6)
    )
    ring.write_text(f"name: ring5\nnodes:\n{nodes}links:\n{links}")
    code, out, err = run(capsys, "route", str(ring), "--engine", "minhop")
    assert code == 1
    assert "CYCLIC channel dependencies" in out and "cycle" in out
    assert "verification FAILED" in err
    code, out, _ = run(capsys, "route", str(ring), "--engine", "minhop", "--vls", "2")
    assert code == 0 and "deadlock-free with 2 VL(s) using 2 VL(s)" in out


def test_ibnet_export_and_import_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    net = tmp_path / "ft4.net"
    code, _, _ = run(
        capsys, "topo", "export-ibnet", str(ROOT / "topologies" / "fat-tree-k4.yaml"), "-o", str(net)
    )
    assert code == 0 and net.read_text().startswith("# fat-tree-k4: 20 switches")
    back = tmp_path / "back.yaml"
    code, _, err = run(capsys, "topo", "import-ibnet", str(net), "-o", str(back), "--bw-gbps", "400")
    assert code == 0 and "wrote" in err
    original, imported = load_topology(ROOT / "topologies" / "fat-tree-k4.yaml"), load_topology(back)
    assert [(n.name, n.guid, n.ports) for n in original.nodes.values()] == [
        (n.name, n.guid, n.ports) for n in imported.nodes.values()
    ]
    assert {str(link) for link in original.links} == {str(link) for link in imported.links}
    # routing straight from the dump gives the same tables as from the YAML
    code, out_yaml, _ = run(capsys, "route", str(ROOT / "topologies" / "fat-tree-k4.yaml"), "--json")
    code2, out_net, _ = run(capsys, "route", str(net), "--json")
    assert code == code2 == 0
    assert json.loads(out_yaml)["digest"] == json.loads(out_net)["digest"]
