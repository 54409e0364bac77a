"""Routing-policy options shared by `controller`, `emulate up` and `compare`, and `fabriclab policies`.

Every option is checked with the same validator the controller and REST use (`PolicyChoice.validate`) before
anything starts; a bad value is one line naming the option, exit 2.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from controller.sm.policies import (
    PolicyChoice,
    PolicyError,
    PolicyParams,
    class_map,
    default_policies,
)
from fabriclab.cli.common import CliError

if TYPE_CHECKING:
    from controller.core.state import Config

_OPTION = {"policy": "--policy", "interval_ms": "--interval-ms", "threshold": "--threshold",
           "hysteresis": "--hysteresis", "classes": "--policy-class", "policies": "--policies"}  # fmt: skip


def add_policy_options(parser: argparse.ArgumentParser, with_policy: bool = True) -> None:
    if with_policy:
        parser.add_argument(
            "--policy",
            help=f"routing policy: {', '.join(default_policies().names())} (default: saved, else static)",
        )
    parser.add_argument("--interval-ms", type=int, help="adaptive: counter polling interval (>= 10 ms)")
    parser.add_argument("--threshold", type=float, help="adaptive: utilisation that moves traffic, (0, 1]")
    parser.add_argument("--hysteresis", type=float, help="adaptive: below threshold minus this, stop moving")
    parser.add_argument(
        "--policy-class",
        action="append",
        default=[],
        metavar="DSCP=POLICY",
        help="per traffic class: packets with this DSCP use POLICY (static or the fabric's multipath policy)",
    )


def option_error(exc: PolicyError) -> CliError:
    """A PolicyError as a CLI error naming the command-line option."""
    return CliError(f"{_OPTION.get(exc.field or '', exc.field or 'policy')}: {exc.message}")


def policy_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The policy options given, validated against defaults for the rest (CliError naming the option)."""
    overrides: dict[str, Any] = {}
    for name in ("policy", "interval_ms", "threshold", "hysteresis"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    classes: dict[str, str] = {}
    for item in getattr(args, "policy_class", []) or []:
        dscp, sep, policy = item.partition("=")
        if not sep or not policy:
            raise CliError(f"--policy-class: expected DSCP=POLICY, got {item!r}")
        if dscp.strip() in classes:
            raise CliError(f"--policy-class: DSCP {dscp.strip()} given twice")
        classes[dscp.strip()] = policy.strip()
    try:
        if classes:
            overrides["classes"] = class_map(classes)
        choose(PolicyChoice(), overrides)
    except PolicyError as exc:
        raise option_error(exc) from None
    return overrides


def choose(base: PolicyChoice, overrides: dict[str, Any]) -> PolicyChoice:
    """`base` with `overrides` applied, validated (raises PolicyError)."""
    params = PolicyParams(
        overrides.get("interval_ms", base.params.interval_ms),
        overrides.get("threshold", base.params.threshold),
        overrides.get("hysteresis", base.params.hysteresis),
    )
    choice = PolicyChoice(overrides.get("policy", base.name), params, overrides.get("classes", base.classes))
    return choice.validate(default_policies())


def apply_policy_overrides(config: Config, overrides: dict[str, Any]) -> Config:
    """A controller `Config` with the command line's policy choices (validated: CliError on a conflict
    with the saved ones, e.g. a saved hysteresis above a new threshold)."""
    if not overrides:
        return config
    try:
        choice = choose(config.policy, overrides)
    except PolicyError as exc:
        raise option_error(exc) from None
    options = replace(config.options, policy=choice.name, multipath=False, classes=choice.classes)
    return replace(config, options=options, policy_params=choice.params)


def policy_argv(args: argparse.Namespace) -> list[str]:
    """The policy options given on this command line, for the controller it starts."""
    argv: list[str] = []
    for name in ("policy", "interval_ms", "threshold", "hysteresis"):
        value = getattr(args, name, None)
        if value is not None:
            argv += [_OPTION[name], str(value)]
    for item in getattr(args, "policy_class", []) or []:
        argv += ["--policy-class", item]
    return argv


def list_policies(args: argparse.Namespace) -> int:
    for cls in default_policies():
        flags = [f for f, on in (("multipath", cls.multipath), ("per-packet", cls.per_packet),
                                 ("adaptive", cls.adaptive)) if on]  # fmt: skip
        print(f"{cls.name:9} {cls.summary}" + (f"  [{', '.join(flags)}]" if flags else ""))
    return 0


__all__ = [
    "add_policy_options",
    "apply_policy_overrides",
    "choose",
    "list_policies",
    "option_error",
    "policy_argv",
    "policy_overrides",
]
