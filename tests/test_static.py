"""The code base stays lint-clean, type-clean and layered as designed (import-linter contracts in setup.cfg).

These run the real tools; they are dev dependencies (`pip install -e '.[dev]'`), so a missing tool is a
broken environment and fails rather than skips.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_lint_and_format() -> None:
    lint = _run(sys.executable, "-m", "ruff", "check", "--no-cache", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run(sys.executable, "-m", "ruff", "format", "--no-cache", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts() -> None:
    result = _run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_modules_stay_small() -> None:
    """House style: modules under ~600 lines."""
    too_long = {
        str(path.relative_to(ROOT)): n
        for package in ("controller", "topologies", "traffic", "emulation", "benchmarks")
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not too_long, too_long
