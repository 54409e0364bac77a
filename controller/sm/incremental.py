"""Incremental recomputation after failures: only the destinations that used the failed part move.

When links or switches fail, most destinations' routes never touched them: every entry toward such a
destination still points at a live link, so its whole routing tree is intact and stays loop-free.  Only the
destinations whose entries (on any switch) lead over a failed link or into a failed switch need new routes.
`reroute` keeps every other column of the forwarding tables as it was, takes the affected columns from a
full routing of the degraded fabric, and says which destinations changed — so the controller sends flow-mods
for those destinations only and can count them in its event.

Pure: previous tables and the live fabric in, new tables out.  The full routing is returned too; callers
verify the spliced tables (as they verify every table) and use the full one if the splice fails (e.g.
mixing two up*/down* orientations closed a dependency cycle), counting every destination as changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import numpy.typing as npt

from controller.sm.cdg import lanes
from controller.sm.engines.base import RoutingEngine
from controller.sm.lids import LidMap, assign_lids
from controller.sm.subnet import NO_PORT, U8, Renumbering, Subnet
from controller.sm.tables import RoutingTables, new_lft
from topologies.model import Fabric, Link


class NotIncremental(ValueError):
    """The new fabric is not the previous one minus failures (something was added or changed)."""


@dataclass(frozen=True)
class IncrementalRouting:
    #: The previous tables with the affected destinations rerouted.
    tables: RoutingTables
    #: Destination LIDs whose previous routes used a failed link or switch (their columns were recomputed).
    affected_lids: frozenset[int]
    #: Destination LIDs whose entries differ from before on some surviving switch (a subset of affected).
    changed_lids: frozenset[int]
    #: LIDs that are gone (failed switches, hosts cut off).
    removed_lids: frozenset[int]
    failed_links: tuple[str, ...]
    failed_switches: tuple[str, ...]
    engine: RoutingEngine = field(repr=False, compare=False)

    @cached_property
    def full(self) -> RoutingTables:
        """A full routing of the live fabric (`tables` took the affected columns from the same engine's
        routing of them): routed when asked — only when the splice does not verify, or by tests."""
        return self.engine.route(self.tables.subnet)


def _key(link: Link) -> tuple[tuple[str, int], tuple[str, int]]:
    a, b = (link.a.node, link.a.port), (link.b.node, link.b.port)
    return (a, b) if a <= b else (b, a)


def failures(previous: Fabric, live: Fabric) -> tuple[list[Link], list[str]]:
    """(failed links, failed nodes) if `live` is `previous` minus links and nodes, else NotIncremental."""
    # a restore: said without comparing every link
    if len(live.nodes) > len(previous.nodes):
        raise NotIncremental(f"a node is new ({len(live.nodes) - len(previous.nodes)} more than before)")
    if len(live.links) > len(previous.links):
        raise NotIncremental(f"a link is new ({len(live.links) - len(previous.links)} more than before)")
    for name, node in live.nodes.items():
        old = previous.nodes.get(name)
        if old is not node and (old is None or old.guid != node.guid or old.kind != node.kind):
            raise NotIncremental(f"node {name} is new or changed")
    # The controller's live fabrics are all cut from one declared fabric and share its Link objects: then
    # identity says which links are gone (keying 3,072 links twice was 6 % of a k=16 reroute)
    by_id = {id(link) for link in previous.links}
    if all(id(link) in by_id for link in live.links):
        live_ids = {id(link) for link in live.links}
        failed = [link for link in previous.links if id(link) not in live_ids]
        return failed, [name for name in previous.nodes if name not in live.nodes]
    old_links = {_key(link): link for link in previous.links}
    live_keys = set()
    for link in live.links:
        key = _key(link)
        if key not in old_links:
            raise NotIncremental(f"link {link} is new")
        live_keys.add(key)
    failed = [link for key, link in old_links.items() if key not in live_keys]
    gone = [name for name in previous.nodes if name not in live.nodes]
    return failed, gone


def reroute(
    previous: RoutingTables, live: Fabric, engine: RoutingEngine, lids: LidMap | None = None
) -> IncrementalRouting:
    """New tables for `live` (= the previous fabric minus failed links/switches) that change only the
    destinations whose routes used a failed part.  `lids`: the LIDs to use (default: the previous subnet's
    kept, as the subnet manager does)."""
    old = previous.subnet
    failed_links, gone = failures(old.fabric, live)
    subnet = Subnet.build(live, lids or assign_lids(live, previous=old.lids))
    nodes = old.fabric.nodes
    # A destination is affected when a surviving switch forwards it into a failed link (a failed switch's
    # links are all failed, so routes into it count too).
    affected = np.zeros(old.max_lid + 1, dtype=bool)
    for link in failed_links:
        for end in (link.a, link.b):
            if nodes[end.node].is_switch and end.node in live.nodes:
                affected |= previous.lft[old.switch_index[end.node]] == end.port
    # a cable cut that strands nobody keeps every LID's endpoint: one comparison of the two maps
    same_lids = old.lids.endpoints == subnet.lids.endpoints
    removed: set[int] = set()
    if not same_lids:
        removed = {int(lid) for lid in old.dest_lids if int(lid) not in subnet.lids.endpoints}
        removed |= {
            int(lid)
            for lid in old.dest_lids
            if old.lids.endpoints[int(lid)] != subnet.lids.endpoints.get(int(lid))
        }
    affected[sorted(removed)] = False

    # The previous tables in the new subnet's shape: rows by switch name, columns by LID (LIDs are stable).
    rows = subnet.renumbering(old.switch_index)  # every switch was there (`failures`)
    lft = new_lft(subnet)
    common = np.array([lid for lid in subnet.dest_lids.tolist() if lid <= old.max_lid], dtype=np.intp)
    same = (
        np.ones(common.size, dtype=bool)
        if same_lids
        else np.array(
            [old.lids.endpoints.get(int(lid)) == subnet.lids.endpoints[int(lid)] for lid in common],
            dtype=bool,
        )
    )
    kept = common[same & ~affected[common]]
    lft[:, kept] = rows.rows(previous.lft)[:, kept]
    redo = np.setdiff1d(subnet.dest_lids, kept)
    # only the destinations that move are routed (with every alternative): a k=16 cut ~30 ms, not ~45
    full = engine.route_some(subnet, redo)
    lft[:, redo] = full.lft[:, redo]
    both = common[same]
    moved = (lft[:, both] != rows.rows(previous.lft)[:, both]).any(axis=0)
    changed = {int(lid) for lid in both[moved]}
    info = dict(full.info)
    info["incremental"] = {"affected": int(affected.sum()), "changed": len(changed), "removed": len(removed)}
    alt = _with_kept_ports(subnet, full.alt, lft, kept, previous.alt, rows)
    tables = replace(full, lft=lft, alt=alt, info=info, layers=None)
    if full.layers is not None:
        layers, lane_info = lanes(tables, int(getattr(engine, "max_layers", 8)))
        tables = replace(tables, layers=layers, info={**info, **lane_info})
    return IncrementalRouting(
        tables=tables,
        affected_lids=frozenset(int(lid) for lid in np.flatnonzero(affected)),
        changed_lids=frozenset(changed),
        removed_lids=frozenset(removed),
        failed_links=tuple(str(link) for link in failed_links),
        failed_switches=tuple(name for name in gone if nodes[name].is_switch),
        engine=engine,
    )


def _with_kept_ports(
    subnet: Subnet, alt: U8, lft: U8, kept: npt.NDArray[np.intp], before: U8, rows: Renumbering
) -> U8:
    """The new routing's alternatives `alt`, plus the ports kept entries still use (so the chosen port is
    always among the alternatives that multipath and fast-failover groups are built from).

    A kept entry's port was among the previous alternatives `before` (`rows`: each switch's previous
    row): it can only be missing where the new alternatives lost a bit, so only the kept entries of
    (switch, destination switch) pairs that lost one are looked at.  (Looking at every kept entry was a
    sixth of a k=16 reroute.)"""
    if kept.size == 0:
        return alt
    if before.shape[2] != alt.shape[2]:  # another port count: look at them all
        return _with_kept_ports_walk(subnet, alt.copy(), lft, kept)
    lost_rows, lost_targets = np.nonzero((rows.grid(before) & ~alt).any(axis=2))
    if lost_rows.size == 0:
        return alt
    # the kept LIDs of each destination switch, as runs of `by_target`
    kept_target = subnet.dest_switch[np.searchsorted(subnet.dest_lids, kept)]
    order = np.argsort(kept_target, kind="stable")
    by_target, sorted_target = kept[order], kept_target[order]
    first = np.searchsorted(sorted_target, lost_targets, side="left")
    count = np.searchsorted(sorted_target, lost_targets, side="right") - first
    total = int(count.sum())
    if total == 0:
        return alt
    offset = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    lids = by_target[np.repeat(first, count) + offset]
    return _add_entry_ports(subnet, alt.copy(), lft, np.repeat(lost_rows, count), lids)


def _with_kept_ports_walk(subnet: Subnet, alt: U8, lft: U8, kept: npt.NDArray[np.intp]) -> U8:
    """The same over every kept entry, whatever the previous alternatives (the reference; also used when
    the port count changed).  Modifies `alt`."""
    rows, cols = np.nonzero((lft[:, kept] != NO_PORT) & (lft[:, kept] > 0))
    return _add_entry_ports(subnet, alt, lft, rows, kept[cols])


def _add_entry_ports(
    subnet: Subnet, alt: U8, lft: U8, rows: npt.NDArray[np.intp], lids: npt.NDArray[np.intp]
) -> U8:
    """Sets in `alt` the port of each entry (rows[i], lids[i]) toward its destination's switch, where the
    entry leads to another switch (not port 0, not a host on the switch itself, not NO_PORT)."""
    target = subnet.dest_switch[np.searchsorted(subnet.dest_lids, lids)].astype(np.intp)
    ports = lft[rows, lids].astype(np.intp)
    real = (rows != target) & (ports > 0) & (ports != NO_PORT)
    rows, targets, ports = rows[real], target[real], ports[real]
    bits = (1 << (7 - ports % 8)).astype(np.uint8)
    missing = (alt[rows, targets, ports // 8] & bits) == 0
    rows, targets, ports, bits = rows[missing], targets[missing], ports[missing], bits[missing]
    np.bitwise_or.at(alt, (rows, targets, ports // 8), bits)
    return alt


__all__ = ["IncrementalRouting", "NotIncremental", "failures", "reroute"]
