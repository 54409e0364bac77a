"""Every command in the README and docs/ is run — here, by another named test, or by CI.

Commands are the lines of fenced code blocks that start with `fabriclab` (optionally after `$ `).  Quick
ones run here, in a scratch folder that sees the repository's `topologies/`, `scenarios/` and `sweeps/`,
and must exit 0.  Long ones (a controller, an emulated fabric, a scenario run) are listed in `COVERED` with
the test or CI step that runs them; a command that is neither quick nor covered fails this test, so the
docs cannot quietly drift from what the tool does.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)

#: Command prefixes run elsewhere -> where: "test_file.py::test_name" (a test in tests/), or
#: ".ci/file::text" (CI runs a command containing that text).
COVERED: dict[str, str] = {
    "fabriclab controller": "test_controller_cli.py::test_sigterm_and_sigint_stop_the_controller_cleanly",
    "fabriclab emulate up": "test_emulation_mininet.py::test_emulate_up_runs_headless_and_stops_cleanly",
    "fabriclab emulate clean": (
        "test_emulation_teardown.py::test_emulate_clean_removes_what_a_sigkilled_run_left_and_nothing_else"
    ),
    "fabriclab scenario run": ".ci/compose_smoke.py::fabriclab scenario run",
    "fabriclab sim scenarios/moe-alltoall-4096gpu.yaml": (
        "test_flowsim_cli.py::test_moe_scenario_simulates_under_spray"
    ),
    "fabriclab sweep sweeps/policies-vs-size.yaml -o results/sweep --dask": (
        "test_flowsim_cli.py::test_sweep_rows_identical_on_processes_localcluster_and_a_real_dask_cluster"
    ),
    "fabriclab sweep sweeps/policies-vs-size.yaml": (
        "test_flowsim_cli.py::test_shipped_sweep_file_expands_and_runs"
    ),
    "fabriclab compare scenarios/permutation-k4.yaml --policies static,ecmp,spray,adaptive": (
        "test_policies_emulated.py::test_permutation_ecmp_collides_spray_spreads_and_the_report_is_complete"
    ),
    "fabriclab trace import kineto scenarios/traces/kineto/rank*.json": (
        "test_kineto_import.py::test_the_cli_round_trip_and_a_scenario_replays_it"
    ),
    "fabriclab sim scenarios/permutation-k4.yaml --policies static,ecmp,spray,adaptive --compare": (
        "test_policies_emulated.py::test_the_simulator_gives_the_emulators_answer_on_the_same_scenario"
    ),
}
PREFIXES = ("fabriclab ", "docker compose exec fabric fabriclab ")


class Command(NamedTuple):
    line: str
    #: The error a documented failing command shows ("fabriclab: error: ..." on the next line), if any.
    error: str | None


def code_lines(page: Path) -> list[tuple[str, str]]:
    """Every line of the page's fenced code blocks (continuations joined, `$ ` dropped), with the line after
    it in its block ("" at the end): the output a command is shown giving."""
    lines: list[tuple[str, str]] = []
    for block in FENCE.findall(page.read_text(encoding="utf-8")):
        rows = [r.strip() for r in re.sub(r"\\\n\s*", " ", block).splitlines()]
        lines += [
            (row.removeprefix("$ "), rows[i + 1] if i + 1 < len(rows) else "") for i, row in enumerate(rows)
        ]
    return lines


def page_commands(page: Path) -> list[Command]:
    found: list[Command] = []
    for line, following in code_lines(page):
        if not line.startswith(PREFIXES):
            continue
        text = line.removeprefix("docker compose exec fabric ").split("  #")[0].strip()
        error = (
            following.removeprefix("fabriclab: error: ")
            if following.startswith("fabriclab: error:")
            else None
        )
        found.append(Command(text, error))
    return found


def _covered(command: str) -> str | None:
    return next((where for prefix, where in COVERED.items() if command.startswith(prefix)), None)


def test_covered_commands_name_tests_that_exist() -> None:
    for where in set(COVERED.values()):
        file, _, name = where.partition("::")
        if file.startswith(".ci/"):
            words = " ".join(re.sub(r"[\"',()]", " ", (ROOT / file).read_text(encoding="utf-8")).split())
            assert name in words, f"{where}: CI runs no such command"
        else:
            text = (ROOT / "tests" / file).read_text(encoding="utf-8")
            assert f"def {name}(" in text, f"{where} does not exist"


def _runs_the_emulator(page: Path) -> bool:
    """A page whose quick commands build an emulated fabric (`emulate calibrate`): its test needs Open
    vSwitch and the machine's cores to itself, so it is marked `emulation` (run with those, one at a time)."""
    return any(
        c.line.startswith("fabriclab emulate") and _covered(c.line) is None for c in page_commands(page)
    )


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=[pytest.mark.emulation] if _runs_the_emulator(p) else []) for p in PAGES],
    ids=lambda p: p.name,
)
def test_documented_commands_run_as_shown(page: Path, tmp_path: Path) -> None:
    """In order, in one scratch folder per page (later commands use what earlier ones wrote)."""
    for folder in ("topologies", "scenarios", "sweeps", "tests", "docs"):
        if (ROOT / folder).exists():
            (tmp_path / folder).symlink_to(ROOT / folder)
    for command in page_commands(page):
        if _covered(command.line) is not None:
            continue
        argv = [sys.executable, "-m", "fabriclab", *shlex.split(command.line)[1:]]
        result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
        where = f"{page.relative_to(ROOT)}: `{command.line}`"
        if command.error is None:
            assert result.returncode == 0, f"{where} exited {result.returncode}: {result.stderr[-800:]}"
        else:
            assert result.returncode == 2, f"{where} exited {result.returncode}, the docs show an error"
            assert command.error in result.stderr, (
                f"{where}: docs show {command.error!r}, got {result.stderr!r}"
            )
