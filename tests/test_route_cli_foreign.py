"""`fabriclab route` on fabrics fabriclab did not lay out: OpenSM's k=16 file, non-trees, failures, dumps.

What a user of the issue typed, and what must hold now: OpenSM's figures on OpenSM's fabric, a one-line
refusal (exit 2) of ftree on a non-tree with the general engine suggested, a logged fallback on request,
the intact fabric's balance beside the degraded one's, and a dump directory that is complete or untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabriclab.cli import main
from tests.conftest import DATA


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_issue_reproduction_now_gives_opensms_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    topo = tmp_path / "k16.yaml"
    net = DATA / "opensm-ft3-k16" / "fabric.net.gz"
    assert run(capsys, "topo", "import-ibnet", str(net), "-o", str(topo))[0] == 0
    code, out, _ = run(capsys, "route", str(topo), "--engine", "ftree", "--report", "--json")
    assert code == 0
    report = json.loads(out)
    metrics = json.loads((DATA / "opensm-ft3-k16" / "opensm-metrics.json").read_text())
    assert report["all_to_all"]["switch_links"]["max_over_mean"] == metrics["all_to_all"]["max_over_mean"]
    assert all(t["max_over_mean"] == 1.0 for t in report["all_to_all"]["tiers"])
    assert report["shift"]["worst_max_flows"] == metrics["shift"]["worst_max_flows"] == 1
    assert report["shift"]["shifts_with_contention"] == 0


@pytest.fixture
def torus_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "torus.yaml"
    assert run(capsys, "topo", "generate", "torus", "--x", "4", "--y", "4", "-o", str(path))[0] == 0
    return path


def test_ftree_on_a_non_tree_is_one_line_and_exit_2_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], torus_file: Path, tmp_path: Path
) -> None:
    dump = tmp_path / "out"
    code, out, err = run(capsys, "route", str(torus_file), "--engine", "ftree", "--dump-dir", str(dump))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fabriclab: error: engine: ftree cannot route this fabric: not a fat-tree:")
    assert "use --engine sssp or dfsssp (any topology), or --fallback sssp" in lines[0]
    assert not dump.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["torus.yaml"]


def test_fallback_is_logged_and_used(
    capsys: pytest.CaptureFixture[str], torus_file: Path, tmp_path: Path
) -> None:
    dump = tmp_path / "out"
    argv = [
        "route",
        str(torus_file),
        "--engine",
        "ftree",
        "--fallback",
        "dfsssp",
        "--report",
        "--dump-dir",
        str(dump),
    ]
    code, out, err = run(capsys, *argv)
    assert code == 0
    assert (
        "fabriclab: ftree cannot route this fabric (not a fat-tree:" in err
        and "falling back to dfsssp" in err
    )
    assert "engine        dfsssp" in out and "fallback      ftree cannot route" in out
    assert "layers assigned by the engine" in out
    report = json.loads((dump / "report.json").read_text())
    assert report["engine"] == "dfsssp" and report["fallback"]["requested"] == "ftree"
    assert sorted(p.name for p in dump.iterdir()) == [
        ".fabriclab-result.json",
        "opensm-ftree-ca-order.dump",
        "opensm-lfts.dump",
        "opensm-path-sl.dump",  # dfsssp assigns lanes: their SLs and SL-to-VL maps are dumped too
        "opensm-sl2vl.dump",
        "opensm-subnet.lst",
        "report.json",
    ]
    code, _, err = run(capsys, "route", str(torus_file), "--engine", "ftree", "--fallback", "nope")
    assert code == 2 and "unknown routing engine 'nope'" in err


def test_dump_dir_is_replaced_whole_and_has_the_ca_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A folder of the user's is refused untouched (unless --force); an earlier dump is replaced whole."""
    dump = tmp_path / "out"
    dump.mkdir()
    (dump / "opensm-lfts.dump").write_text("stale")
    (dump / "notes.txt").write_text("mine")
    net = DATA / "opensm-ft3-k4" / "fabric.net"
    code, _, err = run(capsys, "route", str(net), "--engine", "ftree", "--dump-dir", str(dump))
    assert code == 2 and "is a folder with other things in it (not a fabriclab result)" in err
    assert (dump / "notes.txt").read_text() == "mine" and (dump / "opensm-lfts.dump").read_text() == "stale"
    code, _, _ = run(capsys, "route", str(net), "--engine", "ftree", "--dump-dir", str(dump), "--force")
    assert code == 0 and not (dump / "notes.txt").exists()
    code, _, _ = run(capsys, "route", str(net), "--engine", "ftree", "--dump-dir", str(dump))  # ours now
    assert code == 0
    assert (dump / "opensm-lfts.dump").read_text().startswith("Unicast lids")
    ours = (dump / "opensm-ftree-ca-order.dump").read_text()
    assert ours == (DATA / "opensm-ft3-k4" / "opensm-ftree-ca-order.dump").read_text()  # OpenSM's own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_degraded_report_shows_the_intact_balance(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    topo = str(Path(__file__).resolve().parents[1] / "topologies" / "fat-tree-k8.yaml")
    code, out, _ = run(
        capsys, "route", topo, "--engine", "ftree", "--report", "--fail-links", "5%", "--seed", "1"
    )
    assert code == 0
    assert "degraded      13 link(s) and 0 switch(es) failed (seed 1)" in out
    assert "(intact 1.051)" in out and "worst shift" in out
    code, out, _ = run(
        capsys, "route", topo, "--engine", "dfsssp", "--fail-switches", "1", "--report", "--json"
    )
    degraded = json.loads(out)["degraded"]
    assert degraded["intact"]["switch_links_max_over_mean"] == pytest.approx(1.0508, abs=1e-4)
    assert degraded["degraded"]["engine"] == "dfsssp"
    for bad in ("-1", "101%", "x%"):
        code, _, err = run(capsys, "route", topo, "--fail-links", bad)
        assert code == 2 and "--fail-links must be a count or a percentage" in err
