"""`--ports`: AF_XDP switch ports only where they keep the fabric's meaning, and said when refused.

An AF_XDP port's frames skip the interface's qdiscs, so on a shaped fabric they would silently run at the
machine's speed instead of the modelled link's: `afxdp` with a scale or QoS is an error naming both ways
out, `auto` keeps packet sockets and says why."""

from __future__ import annotations

import subprocess
import sys

import pytest

from emulation import fastports
from emulation.calibrate import default_path
from emulation.mnfabric import EmulationError, MininetFabric
from tests.conftest import ROOT
from topologies.loader import load_topology
from topologies.scale import Scale

OFFERED = frozenset({"system", "internal", "patch", "afxdp", "afxdp-nonpmd"})


@pytest.mark.parametrize(
    ("ports", "shaped", "qos", "offered", "kind", "why"),
    [
        ("system", False, False, OFFERED, "system", None),
        ("afxdp", False, False, OFFERED, "afxdp", None),
        ("auto", False, False, OFFERED, "afxdp", None),
        ("auto", True, False, OFFERED, "system", "shaped"),
        ("auto", True, True, OFFERED, "system", "shaped"),
        ("auto", False, False, frozenset({"system", "patch"}), "system", "offers no afxdp-nonpmd"),
    ],
)
def test_auto_uses_afxdp_only_on_unshaped_fabrics_where_ovs_offers_it(
    ports: str, shaped: bool, qos: bool, offered: frozenset[str], kind: str, why: str | None
) -> None:
    got, note = fastports.choose(ports, shaped, qos, offered)
    assert got == kind
    assert (note is None) if why is None else (note is not None and why in note), note


@pytest.mark.parametrize(
    ("ports", "shaped", "qos", "offered", "message"),
    [
        ("afxdp", True, False, OFFERED, "bypass the qdiscs"),
        ("afxdp", False, True, OFFERED, "--ports system"),
        ("afxdp", False, False, frozenset({"system"}), "built without AF_XDP"),
        ("dpdk", False, False, OFFERED, "expected one of auto, system, afxdp"),
    ],
)
def test_afxdp_where_it_cannot_serve_is_an_error_not_a_quiet_fallback(
    ports: str, shaped: bool, qos: bool, offered: frozenset[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fastports.choose(ports, shaped, qos, offered)


def test_port_choice_asks_each_ovs_vswitchd_once_and_writes_afxdp_interfaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str | None] = []

    def offered(db: str | None = None) -> frozenset[str]:
        asked.append(db)
        return OFFERED

    monkeypatch.setattr(fastports, "offered_types", offered)
    choice = fastports.PortChoice("auto", shaped=False, qos=False)
    assert choice.describe() == "packet sockets (not built yet)"
    spec = choice.fast_ports(["s0-eth1", "s0-eth2"], "/run/x/db.sock")
    choice.fast_ports(["s1-eth1"], "/run/x/db.sock")
    assert asked == ["/run/x/db.sock"]
    assert spec == {n: ("afxdp-nonpmd", {"xdp-mode": "generic"}) for n in ("s0-eth1", "s0-eth2")}
    assert choice.kind == "afxdp" and choice.describe().startswith("AF_XDP")
    assert fastports.PortChoice("system", shaped=True, qos=False).fast_ports(["a"], None) == {}


def test_a_fabric_refuses_afxdp_on_shaped_links_before_building() -> None:
    k4 = load_topology(ROOT / "topologies" / "fat-tree-k4.yaml")
    with pytest.raises(EmulationError, match="ports: AF_XDP ports bypass"):
        MininetFabric(k4, {}, scale=Scale.parse("400G=200M"), ports="afxdp")
    with pytest.raises(EmulationError, match="no --cli"):
        MininetFabric(k4, {}, shells=True, ports="afxdp")


def test_a_calibration_with_afxdp_ports_is_kept_apart_from_the_one_scenarios_compare_with() -> None:
    assert default_path("ft", 1, "patch", "afxdp").name == "calibration-ft-shards1-patch-afxdp.json"
    assert default_path("ft").name == "calibration-ft.json"


@pytest.mark.parametrize(
    "argv",
    [
        ["emulate", "calibrate", "topologies/fat-tree-k4.yaml", "--scale", "400G=200M", "--ports", "afxdp"],
        ["emulate", "up", "topologies/fat-tree-k4.yaml", "--scale", "400G=200M", "--ports", "afxdp"],
    ],
)
def test_the_cli_refuses_afxdp_on_a_shaped_fabric_with_exit_2(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "fabriclab", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--ports afxdp" in done.stderr and "bypass the qdiscs" in done.stderr, done.stderr
