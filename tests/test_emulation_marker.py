"""`pytest -m "not emulation"` is the fast suite: tests that need Open vSwitch are marked at collection
(tests/conftest.py), pure ones are not."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def collected(marker: str, *files: str) -> list[str]:
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker]
    args = [*command, *files]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_emulated_tests_are_marked_and_pure_ones_are_not() -> None:
    files = ("tests/test_converge_emulated.py", "tests/test_fluidmodel.py")
    marked, unmarked = collected("emulation", *files), collected("not emulation", *files)
    assert marked and all(t.startswith("tests/test_converge_emulated.py::") for t in marked)
    assert unmarked and all(t.startswith("tests/test_fluidmodel.py::") for t in unmarked)
