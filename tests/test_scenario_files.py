"""Scenario files are validated in layers with located errors; shipped scenarios check clean; permutations
are seeded (same seed, same flows)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labspec.scenario import ScenarioError, load_scenario
from tests.conftest import ROOT
from topologies.errors import InputError

TOPO = (ROOT / "topologies" / "fat-tree-k4.yaml").as_posix()

BASE = f"""fabriclab: 1
name: t
topology: {TOPO}
duration_s: 5
traffic:
  - {{kind: udp, src: h1, dst: h16, rate_pps: 100}}
faults:
  - {{at_s: 1, action: link_down, port: "leaf1:3"}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


#: Scenario files (scenarios/ also holds the QoS policy files they name, checked by tests/test_qos_policy.py).
SCENARIOS = sorted(
    p.name
    for p in (ROOT / "scenarios").glob("*.yaml")
    if re.search(r"^traffic:", p.read_text(encoding="utf-8"), re.M)
)


@pytest.mark.parametrize("name", SCENARIOS)
def test_shipped_scenarios_are_valid(name: str) -> None:
    scenario = load_scenario(ROOT / "scenarios" / name)
    assert scenario.spec.traffic and scenario.spec.duration_s > max(
        (f.at_s for f in scenario.spec.faults), default=0
    )


def test_a_valid_scenario_loads(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, BASE))
    (flow,) = scenario.flows()
    assert (flow.src, flow.dst, flow.duration_s) == ("h1", "h16", 5.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("duration_s: 5", "duraton_s: 5"), "s.yaml:4: duraton_s: unknown key 'duraton_s'"),
        (("rate_pps: 100", "rate_pps: 100, sizee: 3"), "s.yaml:6: traffic[0].sizee: unknown key 'sizee'"),
        (("dst: h16", "dst: h99"), "s.yaml:6: traffic[0].dst: unknown host 'h99'"),
        (('port: "leaf1:3"', 'port: "leaf1:9"'), "faults[0].port: 'leaf1:9' is not a cabled port"),
        (("at_s: 1", "at_s: 7"), "faults[0].at_s: after the run ends"),
        (("kind: udp,", "kind: tcp,"), "traffic[0].kind"),
        (("action: link_down", "action: melt"), "faults[0].action"),
        (("duration_s: 5", "duration_s: 5\nscale: 400G-200M"), "scale: scale '400G-200M'"),
        (
            ("duration_s: 5", "duration_s: 5\ncontroller: {engine: nope}"),
            "controller.engine: unknown routing engine",
        ),
        ((TOPO, "missing.yaml"), "topology: no such file"),
        (("duration_s: 5", "duration_s: 5\nduration_s: 6"), "duplicate key"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(InputError) as err:
        load_scenario(write(tmp_path, BASE.replace(*change)))
    assert message in str(err.value)


def test_a_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="No such file"):
        load_scenario(tmp_path / "nope.yaml")


def test_permutations_are_seeded(tmp_path: Path) -> None:
    text = BASE.replace(
        "  - {kind: udp, src: h1, dst: h16, rate_pps: 100}", "  - {kind: udp-permutation, rate_pps: 10}"
    )
    a = load_scenario(write(tmp_path, text)).flows()
    b = load_scenario(write(tmp_path, text)).flows()
    c = load_scenario(write(tmp_path, text.replace("name: t", "name: t\nseed: 9"))).flows()
    assert a == b and a != c
    assert sorted(f.src for f in a) == sorted(f.dst for f in a) and all(f.src != f.dst for f in a)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            "{kind: roce-collective, collective: alltoall, ranks: h1..h99, size: 1MiB}",
            "traffic[0].ranks: unknown host",
        ),
        (
            "{kind: roce-collective, collective: alltoall, ranks: h1..h4, size: 1XB}",
            "traffic[0].size: cannot parse",
        ),
        (
            "{kind: roce-collective, collective: spin, ranks: h1..h4, size: 1MiB}",
            "traffic[0].collective: unknown",
        ),
        (
            "{kind: roce-collective, collective: alltoall, ranks: h1..h4, size: 1MiB, mtu: 1000}",
            "traffic[0].mtu",
        ),
    ],
)
def test_bad_roce_collectives_name_the_field(tmp_path: Path, item: str, message: str) -> None:
    text = BASE.replace("  - {kind: udp, src: h1, dst: h16, rate_pps: 100}", f"  - {item}")
    with pytest.raises(InputError) as err:
        load_scenario(write(tmp_path, text))
    assert message in str(err.value)
