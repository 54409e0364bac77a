"""Routing-policy options on the command line: bad input is one line naming the option, exit 2, before
anything starts or is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

K4 = str(ROOT / "topologies" / "fat-tree-k4.yaml")
PERMUTATION = str(ROOT / "scenarios" / "permutation-k4.yaml")


def fabriclab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabriclab", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_policies_are_listed_with_what_they_do() -> None:
    done = fabriclab("policies")
    assert done.returncode == 0
    names = [line.split()[0] for line in done.stdout.splitlines()]
    assert names == ["static", "ecmp", "spray", "adaptive"]
    assert "[multipath, per-packet, adaptive]" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["controller", "--topology", K4, "--policy", "wcmp"], "--policy: unknown routing policy 'wcmp'"),
        (["controller", "--topology", K4, "--threshold", "0"], "--threshold: must be in (0, 1]"),
        (["controller", "--topology", K4, "--interval-ms", "9"], "--interval-ms: must be within 10..60000"),
        (["controller", "--topology", K4, "--hysteresis", "0.8"], "--hysteresis: must be in [0, threshold"),
        (["controller", "--topology", K4, "--policy-class", "26"], "--policy-class: expected DSCP=POLICY"),
        (["controller", "--topology", K4, "--policy", "spray", "--policy-class", "26=adaptive"],
         "--policy-class: multipath policies"),
        (["emulate", "up", K4, "--policy", "wcmp", "--no-cli"], "--policy: unknown routing policy 'wcmp'"),
        (["compare", PERMUTATION, "--policies", "static,wcmp"], "--policies: unknown routing policy 'wcmp'"),
        (["compare", PERMUTATION, "--policies", "ecmp,ecmp"], "--policies: policy 'ecmp' listed twice"),
        (["compare", PERMUTATION, "--policies", ""], "--policies: empty policy name"),
    ],
)  # fmt: skip
def test_bad_policy_options_exit_2_naming_the_option(args: list[str], message: str, tmp_path: Path) -> None:
    done = fabriclab(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("fabriclab: error: ") and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing built


def test_a_policy_the_fabric_cannot_support_is_refused_before_starting(tmp_path: Path) -> None:
    """One spine, no parallel links: one path per destination, nothing to spray over."""
    topology = tmp_path / "one-spine.yaml"
    generate = ["topo", "generate", "leaf-spine", "--leaves", "2", "--spines", "1", "--hosts-per-leaf", "2"]
    made = fabriclab(*generate, "-o", str(topology))
    assert made.returncode == 0, made.stderr
    for args in (
        ["controller", "--topology", str(topology), "--policy", "spray"],
        ["emulate", "up", str(topology), "--policy", "adaptive", "--no-cli"],
    ):
        done = fabriclab(*args, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "'" in done.stderr and "needs equal-cost alternatives" in done.stderr, done.stderr
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"fabriclab: 1\nname: s\ntopology: {topology}\nduration_s: 2\n"
        "traffic:\n  - {kind: udp, src: h1, dst: h3, rate_pps: 10}\n"
    )
    done = fabriclab("compare", str(scenario), "--policies", "static,spray", "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and "--policies: 'spray' needs equal-cost alternatives" in done.stderr
    assert not (tmp_path / "out").exists()


def test_capacity_file_is_checked(tmp_path: Path) -> None:
    bad = tmp_path / "capacity.json"
    bad.write_text('{"per_host_pps": 100}')
    done = fabriclab("compare", PERMUTATION, "--policies", "static", "--capacity", str(bad), cwd=tmp_path)
    assert done.returncode == 2 and "--capacity:" in done.stderr and "total_pps" in done.stderr
