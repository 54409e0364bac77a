"""Compiling only what changed (`controller.sm.compiler._patch_switch`): after cable cuts and restores, on
fabriclab's and OpenSM's fat-trees and relabelled copies, the programs a reroute patches forward exactly
as programs compiled whole from the same tables — the same entries with the same actions, the same groups
— while most switches are not compiled at all.  (The tables themselves are the reroute's: after a cut
only the destinations that used it move, `test_degraded_and_incremental.py`.)"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from controller.sm import compile as compiler
from controller.sm.intents import ForwardingOptions, SwitchProgram
from controller.sm.manager import Computation, SubnetContext
from tests import faultwalk
from tests.conftest import DATA
from topologies.generators import fat_tree, opensm_fat_tree
from topologies.ibnet import load_ibnet
from topologies.model import Fabric
from topologies.relabel import relabel


def _behaviour(program: SwitchProgram) -> tuple[dict[object, object], Counter[object]]:
    """Entries with their actions, groups named by what they do: a group modified in place keeps the id
    of the one it replaced (`compile._keep_group_ids`), so ids may differ from a whole compile's."""
    content = {gid: (g.kind, g.ports) for gid, g in program.groups.items()}

    def named(actions: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple((kind, content[int(arg)]) if kind == "group" else (kind, arg) for kind, arg in actions)

    return {k: named(f.actions) for k, f in program.flows.items()}, Counter(content.values())


def _walk(fabric: Fabric, options: ForwardingOptions, seed: int, steps: int) -> tuple[int, int]:
    """Cut and restore cables at random; after each, the patched programs equal whole ones.  Returns
    (switches patched, switches compiled whole) over the walk."""
    context = SubnetContext.build(fabric)
    previous: Computation = context.compute("ftree", options, {}, 1)
    calls: list[bool] = []
    original = compiler._patch_switch

    def counting(*args: Any) -> SwitchProgram | None:
        found = original(*args)
        calls.append(found is not None)
        return found

    compiler._patch_switch = counting  # type: ignore[assignment]
    try:
        for step, (what, down) in enumerate(faultwalk.walk(fabric, seed, steps)):
            incremental = context.compute("ftree", options, down, step + 2, previous)
            whole_programs, _, _ = original_compile(incremental.tables, context, options, step + 2)
            assert set(whole_programs) == set(incremental.programs)
            for name, program in whole_programs.items():
                assert _behaviour(incremental.programs[name]) == _behaviour(program), (step, what, name)
            previous = incremental
    finally:
        compiler._patch_switch = original
    return calls.count(True), calls.count(False)


def original_compile(tables: Any, context: SubnetContext, options: ForwardingOptions, generation: int) -> Any:
    """The same tables, every switch compiled whole."""
    return compiler.compile_programs(tables, context.addresses, context.dpids, options, generation)


CASES = [
    pytest.param(fat_tree(8), id="ft8"),
    pytest.param(opensm_fat_tree(8), id="opensm-layout-8"),
    pytest.param(relabel(fat_tree(8), 5).fabric, id="ft8-relabelled"),
]


@pytest.mark.parametrize("fabric", CASES)
@pytest.mark.parametrize("options", [ForwardingOptions(), ForwardingOptions(fast_failover=False)],
                         ids=["failover", "plain"])  # fmt: skip
def test_patched_programs_forward_as_whole_ones_k8(fabric: Fabric, options: ForwardingOptions) -> None:
    patched, _ = _walk(fabric, options, seed=7, steps=12)
    assert patched > 0  # the patch path ran (not a comparison of whole compiles with themselves)


@pytest.mark.slow
def test_patched_programs_forward_as_whole_ones_on_opensms_k16() -> None:
    """OpenSM's own k=16 fabric (1,024 hosts, 320 switches), as ibnetdiscover describes it."""
    patched, whole = _walk(load_ibnet(DATA / "opensm-ft3-k16" / "fabric.net.gz"), ForwardingOptions(), 3, 4)
    assert patched > 3 * whole


def test_a_multipath_policy_compiles_changed_switches_whole() -> None:
    """Slot tables are shared by many destinations: those switches are compiled whole (and still equal)."""
    patched, whole = _walk(fat_tree(4), ForwardingOptions(policy="ecmp"), seed=1, steps=4)
    assert patched == 0 and whole > 0
