"""What a sharded fabric does not run yet is one rule (`emulation.shards.shard_refusal`), given the same way
by the CLI, the scenario runner and `ShardedFabric`, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation.runner import run_scenario
from emulation.sharded import ShardedFabric
from emulation.shards import shard_refusal
from fabriclab.cli import main
from labspec.scenario import ScenarioError, load_scenario
from tests.conftest import ROOT
from topologies.generators import fat_tree

RULE = "partitions and QoS queues are not supported on a sharded fabric yet"


def test_the_rule() -> None:
    assert shard_refusal(1, partitions=True, qos=True) is None
    assert shard_refusal(2) is None
    assert shard_refusal(2, partitions=True) == RULE
    assert shard_refusal(8, qos=True) == RULE


def test_every_entry_point_refuses_alike_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tenants = ROOT / "scenarios" / "tenants-k4.yaml"
    assert main(["scenario", "run", str(tenants), "--shards", "2", "-o", str(tmp_path / "out")]) == 2
    assert f"--shards: {RULE}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ScenarioError, match=RULE):
        run_scenario(load_scenario(tenants), tmp_path / "run", shards=2)
    assert not (tmp_path / "run").exists()
    with pytest.raises(Exception, match=RULE):
        ShardedFabric(fat_tree(4), {}, shards=2, qos=object(), name_prefix="t")
