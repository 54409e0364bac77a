"""`--fail-links`, `--fail-switches` and `--seed`: one degraded copy of a fabric, the same way for
`fabriclab route` and `fabriclab topo degrade` (which writes it, so OpenSM can route the same file)."""

from __future__ import annotations

import argparse
from typing import Any

from fabriclab.cli.common import SEED, CliError
from topologies.faults import Degradation, SwitchFailures, degrade
from topologies.model import Fabric

SWITCHES_HELP = (
    "fail switches first: a count of random switches without hosts (3), counts per tier (core:1,agg:2; "
    "tiers leaf, agg/spine, core, tierN: hops from the nearest switch with hosts), or names (agg1,core3)"
)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-links",
        default="0",
        help="fail this many random switch links first, or a share of them (e.g. 5%%)",
    )
    parser.add_argument("--fail-switches", default="0", help=SWITCHES_HELP)
    parser.add_argument("--seed", type=SEED, default=0, help="seed for --fail-* (default 0)")


def link_failures(text: str, fabric: Fabric) -> int:
    """--fail-links: a count, or a percentage of the switch-to-switch links."""
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 <= share <= 100:
                raise ValueError
            switch_links = sum(
                1
                for link in fabric.links
                if fabric.nodes[link.a.node].is_switch and fabric.nodes[link.b.node].is_switch
            )
            return round(switch_links * share / 100)
        count = int(text)
        if count < 0:
            raise ValueError
        return count
    except ValueError:
        raise CliError(f"--fail-links must be a count or a percentage (0..100%), got {text!r}") from None


def degraded(fabric: Fabric, args: argparse.Namespace) -> Degradation | None:
    """The degraded copy the options ask for (None when they ask for none); CliError naming the option."""
    fail_links = link_failures(args.fail_links, fabric)
    try:
        switches = SwitchFailures.parse(args.fail_switches)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not fail_links and switches.empty:
        return None
    try:
        return degrade(fabric, fail_links, switches, args.seed)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def describe(result: Degradation, seed: int) -> dict[str, Any]:
    """What the report and the JSON say was failed."""
    return {
        "failed_links": list(result.failed_links),
        "failed_switches": list(result.failed_switches),
        "failed_switch_tiers": dict(result.failed_switch_tiers),
        "lost_hosts": list(result.lost_hosts),
        "seed": seed,
    }
