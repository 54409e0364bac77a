"""The policy registry: names, parameters and their validation (shared by controller and simulator)."""

from __future__ import annotations

import math

import pytest

from controller.sm.policies import PolicyError, PolicyParams, default_policies


def test_registry_lists_the_four_policies_in_order() -> None:
    assert default_policies().names() == ["static", "ecmp", "spray", "adaptive"]


def test_semantics_flags() -> None:
    reg = default_policies()
    made = {n: reg.create(n) for n in reg.names()}
    flags = {n: (p.multipath, p.per_packet, p.adaptive) for n, p in made.items()}
    assert flags == {
        "static": (False, False, False),
        "ecmp": (True, False, False),
        "spray": (True, True, False),
        "adaptive": (True, True, True),
    }


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (PolicyParams(interval_ms=9), "interval_ms"),
        (PolicyParams(interval_ms=10.5), "interval_ms"),  # type: ignore[arg-type]
        (PolicyParams(threshold=0.0), "threshold"),
        (PolicyParams(threshold=1.01), "threshold"),
        (PolicyParams(threshold=math.nan), "threshold"),
        (PolicyParams(threshold=True), "threshold"),
        (PolicyParams(hysteresis=0.7), "hysteresis"),
        (PolicyParams(hysteresis=-0.1), "hysteresis"),
    ],
)
def test_bad_parameters_name_the_field(params: PolicyParams, field: str) -> None:
    with pytest.raises(PolicyError) as info:
        default_policies().create("adaptive", params)
    assert info.value.field == field


def test_unknown_and_duplicate_names() -> None:
    reg = default_policies()
    with pytest.raises(PolicyError, match="unknown routing policy 'wcmp'") as info:
        reg.create("wcmp")
    assert info.value.field == "policy"
    assert reg.parse_list("static, spray") == ["static", "spray"]
    for bad in ("static,,ecmp", "ecmp,ecmp", "ecmp,foo"):
        with pytest.raises(PolicyError):
            reg.parse_list(bad)


def test_threshold_one_and_edges_are_accepted() -> None:
    params = PolicyParams(interval_ms=10, threshold=1.0, hysteresis=0.0)
    policy = default_policies().create("adaptive", params)
    assert policy.describe()["threshold"] == 1.0
