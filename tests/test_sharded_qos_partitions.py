"""QoS queues and partitions on a sharded fabric: the same scenario on one OVS and on two shards over VXLAN.

Both were refused on shards ("not supported on a sharded fabric yet"): their queues (HTB under an IFB per
switch port) and their counters (`tc`, `ovs-ofctl dump-flows`) were set up and read in the root namespace
and on the system OVS, where a shard's ports and bridges are not.  Now the queues are built beside each port
in its shard's namespace, the IFBs' drops count as modelled congestion there, and the isolation counters
are read from each shard's own ovs-vswitchd.  Two tenants (scenarios/tenants-k4.yaml: a training ring and
KV-cache streams sharing h3 and h4's downlinks 3:1) in partitions (partitions-tenants.conf), plus RoCE
writes between two tenants that the partitions must drop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emulation.mnfabric import mininet_available
from emulation.runner import run_scenario
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from tests.emulation_support import (  # noqa: F401 - the ovs_daemon fixture
    overloaded_runs,
    ovs_daemon_fixture,
    require_emulation,
    scale_rates,
    until_clean,
)

DENIED = "  - {kind: roce-incast, senders: h1, receiver: h5, size: 64KiB, rate_pps: 40}\n"


def _scenario(folder: Path, factor: float) -> Path:
    text = (ROOT / "scenarios" / "tenants-k4.yaml").read_text()
    text = text.replace(
        "qos: qos-tenants.yaml\n", "qos: qos-tenants.yaml\npartitions: partitions-tenants.conf\n"
    )
    text = text.replace("faults: []", DENIED.rstrip("\n") + "\nfaults: []")
    for name in ("qos-tenants.yaml", "partitions-tenants.conf"):
        (folder / name).write_text((ROOT / "scenarios" / name).read_text())
    path = folder / f"tenants-{factor:g}.yaml"
    path.write_text(scale_rates(text.replace("../topologies/", f"{ROOT / 'topologies'}/"), factor))
    return path


def test_qos_queues_and_partitions_hold_on_two_shards_as_on_one(ovs_daemon: Any, tmp_path: Path) -> None:
    require_emulation(mininet_available())
    runs = 0

    def run_pair(factor: float) -> tuple[dict[str, Any], dict[str, Any]]:
        nonlocal runs
        runs += 1
        scenario = load_scenario(_scenario(tmp_path, factor))
        plain = run_scenario(scenario, tmp_path / f"plain{runs}")
        return plain, run_scenario(scenario, tmp_path / f"sharded{runs}", shards=2, crossing="vxlan")

    (plain, sharded), why = until_clean(run_pair, overloaded_runs)
    assert sharded["shards"] == {"count": 2, "crossing": "vxlan"} and plain["shards"] is None
    a, b = plain["repetitions"][0], sharded["repetitions"][0]
    # partitions: the same pairs denied, none delivered that should not be, none lost that should not be
    iso_a, iso_b = a["isolation"], b["isolation"]
    assert iso_b["denied_pairs"] == iso_a["denied_pairs"] > 0
    assert iso_b["denied_but_delivered"] == [] and iso_b["permitted_but_undelivered"] == []
    assert a["all_pairs"]["reachable"] == b["all_pairs"]["reachable"] < a["all_pairs"]["pairs"]
    # h1's RoCE writes to h5 (another tenant) were dropped by the partition layer, counted on each shard's
    # own switches, and not taken for the emulator's drops
    writes = [m for m in b["roce_messages"] if m["src"] == "h1" and m["dst"] == "h5"]
    sent = sum(m["sent"] for m in writes)
    assert sent > 0 and sum(m["received"] for m in writes) == 0, writes
    for iso, rep in ((iso_a, a), (iso_b, b)):
        assert iso["dropped_packets"]["denied"] >= sent, (iso, sent)
        assert rep["headroom"]["partition_drops"] >= sent
        assert rep["headroom"]["emulator_drops_by_cause"]["unaccounted"] < sent, rep["headroom"]
    # QoS: both classes present, the same shares of the shared downlinks, drops in the modelled queues
    shares = [{c["class"]: c["share"] for c in r["qos_classes"]} for r in (a, b)]
    assert set(shares[0]) == set(shares[1]) == {"training", "kvcache"}, shares
    if why is not None:  # the machine was too busy twice: the runs said so; delivery and shares not judged
        assert plain["emulator_overloaded"] or sharded["emulator_overloaded"]
        return
    for name in shares[0]:
        assert abs(shares[0][name] - shares[1][name]) <= 0.05, shares
    assert shares[1]["training"] > 2 * shares[1]["kvcache"], shares  # 192:64 weights, training's 3x
    drops = [r["headroom"]["modelled_congestion_drops"] for r in (a, b)]
    assert drops[1] > 0 and abs(drops[0] - drops[1]) <= max(20, 0.1 * drops[0]), drops
