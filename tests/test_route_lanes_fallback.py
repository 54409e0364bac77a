"""`fabriclab route` on fabrics that need virtual lanes: dfsssp honours `--vls` up to InfiniBand's 15,
`--fallback` engages whenever the engine's tables fail verification (not only when it refuses the fabric),
and nothing is dumped from tables that failed verification."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.sm.engines import default_registry
from controller.sm.engines.sssp import MAX_VLS, DfssspEngine
from controller.sm.subnet import Subnet
from controller.sm.verify import verify
from fabriclab.cli import main
from topologies.direct import torus
from topologies.loader import dump_yaml


@pytest.fixture(scope="module")
def torus8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8x8 torus, 2 hosts per switch: dfsssp needs 9 lanes there (8 are not enough)."""
    path = tmp_path_factory.mktemp("t8") / "t8.yaml"
    path.write_text(dump_yaml(torus(8, 8, 2)))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dfsssp_uses_up_to_the_lanes_it_is_given(torus8: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "route", str(torus8), "--engine", "dfsssp", "--json")
    report = json.loads(out)
    assert code == 1 and not report["verification"]["ok"] and "verification FAILED" in err
    assert report["engine_info"]["note"] == "still cyclic with 8 VL(s)"
    code, out, _ = _run(capsys, "route", str(torus8), "--engine", "dfsssp", "--vls", "15", "--json")
    report = json.loads(out)
    assert code == 0 and report["verification"]["ok"] and report["engine_info"]["layers"] == 9


def test_the_lanes_are_checked_independently() -> None:
    """The lanes dfsssp assigns, checked layer by layer by the verifier (not the engine's word)."""
    subnet = Subnet.build(torus(8, 8, 2))
    tables = DfssspEngine(MAX_VLS).route(subnet)
    assert tables.layers is not None and int(tables.layers.max()) == 8  # lanes 0..8
    assert verify(tables).ok
    with pytest.raises(ValueError, match=r"1\.\.15"):
        DfssspEngine(16)
    assert default_registry().create("minhop").with_lanes(4).name == "minhop"  # one-lane engines: as they are


def test_fallback_engages_when_the_tables_fail_verification_and_nothing_is_dumped(
    torus8: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = tmp_path / "dump"
    code, out, err = _run(
        capsys, "route", str(torus8), "--engine", "dfsssp", "--fallback", "minhop", "--dump-dir", str(dump),
        "--json",
    )  # fmt: skip
    report = json.loads(out)
    assert "dfsssp's tables failed verification (still cyclic with 8 VL(s)); falling back to minhop" in err
    assert report["engine"] == "minhop" and report["fallback"]["used"] == "minhop"
    assert code == 1 and not report["verification"]["ok"]  # minhop deadlocks on a torus too: said, exit 1
    assert f"nothing written to {dump}" in err and not dump.exists()


def test_a_fallback_that_verifies_is_used_and_dumped(
    torus8: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = tmp_path / "dump"
    code, out, err = _run(
        capsys, "route", str(torus8), "--engine", "minhop", "--fallback", "dfsssp", "--vls", "12",
        "--dump-dir", str(dump), "--json",
    )  # fmt: skip
    report = json.loads(out)
    assert code == 0, err
    assert "minhop's tables failed verification" in err and report["engine"] == "dfsssp"
    assert report["verification"]["ok"] and (dump / "opensm-lfts.dump").exists()
