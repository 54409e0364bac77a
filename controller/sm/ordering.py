"""The order in which a rollout's switches get their new entries: downstream before upstream.

A route entry is replaced in place (same match, new output), so on each switch the old path toward a
destination is withdrawn the moment the new one is installed.  If a switch starts sending destination d
to a neighbour whose own entry for d is still the old one, the packet meets the old route there: at best a
detour, at worst an entry into a cable that was down (a restore: the neighbour's old route avoided the
cable) or a loop.  Updating every switch at once, as one make phase, leaves that to chance: a cable restore
under traffic lost packets that way.

So the make phase goes in waves: a switch whose new entry for d leads to a switch whose entry for d also
changes waits until that switch's wave is confirmed.  Each wave is a set of switches updated in parallel,
confirmed by barriers before the next starts.  On a fat-tree that is at most a few waves (the changed
entries of one destination form a tree pointing at it); where dependencies between destinations form a
cycle, the switches in it share the last wave (no order can satisfy both), which is what a single make
phase did before.  Only the chosen port (the table's) is followed: a fast-failover group's other buckets
are used only when the chosen port is down, and then the switch is already rerouting.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from controller.sm.subnet import NO_PORT
from controller.sm.tables import RoutingTables


def make_waves(
    old: RoutingTables | None, new: RoutingTables, switches: Collection[str]
) -> tuple[frozenset[str], ...]:
    """`switches` (the ones with changes to send) in waves, downstream first.  Without `old` (nothing
    known installed), one wave."""
    todo = frozenset(switches)
    if not todo:
        return ()
    if old is None:
        return (todo,)
    subnet = new.subnet
    names = subnet.switch_names
    n = len(names)
    renumbering = subnet.renumbering(old.subnet.switch_index)
    old_row = renumbering.old_of
    old_max = old.subnet.max_lid  # a property that scans every LID: once, not per destination
    before, now = old.subnet.lids.endpoints, subnet.lids.endpoints
    if before == now:  # a cut that strands nobody: every LID is where it was
        lids = subnet.dest_lids.astype(np.intp)
    else:
        lids = np.array(
            [lid for lid in subnet.dest_lids.tolist() if lid <= old_max and before.get(lid) == now[lid]],
            dtype=np.intp,
        )
    if lids.size == 0:
        return (todo,)
    if old.lft.shape == new.lft.shape and renumbering.identity:
        # the same switches: one comparison of the whole tables, then only the moved destinations
        differs = new.lft != old.lft
        lids = lids[differs.any(axis=0)[lids]]
        ports, changed = new.lft[:, lids].astype(np.intp), differs[:, lids]
    else:
        ports = new.lft[:, lids].astype(np.intp)  # (switches, destinations)
        changed = np.ones(ports.shape, dtype=bool)  # a switch new to the fabric: everything is new
        known = old_row >= 0
        changed[known] = ports[known] != old.lft[np.ix_(old_row[known], lids)]
        # only destinations with a changed entry somewhere can make a switch wait (a cut moves a few)
        moved = np.flatnonzero(changed.any(axis=0))
        ports, changed = ports[:, moved], changed[:, moved]
    routed = (ports != NO_PORT) & (ports > 0)
    nxt = np.full(ports.shape, -1, dtype=np.intp)
    nxt[routed] = subnet.nbr[np.nonzero(routed)[0], ports[routed]]
    s, col = np.nonzero(changed & (nxt >= 0))
    t = nxt[s, col]
    waits = changed[t, col]  # s's new entry leads to t, whose entry for the same destination changes too
    pending = np.array([name in todo for name in names], dtype=bool)
    s, t = s[waits], t[waits]
    keep = pending[s] & pending[t] & (s != t)
    pairs = np.unique(s[keep] * n + t[keep])  # one edge per (switch, switch), however many destinations
    after: dict[int, list[int]] = {}  # t -> switches waiting for t
    blocked = np.zeros(n, dtype=np.intp)
    for a, b in zip((pairs // n).tolist(), (pairs % n).tolist(), strict=True):
        after.setdefault(b, []).append(a)
        blocked[a] += 1
    waves: list[frozenset[str]] = []
    ready = [i for i in range(n) if pending[i] and blocked[i] == 0]
    while ready:
        waves.append(frozenset(names[i] for i in ready))
        nxt_ready = []
        for i in ready:
            for waiting in after.get(i, ()):
                blocked[waiting] -= 1
                if blocked[waiting] == 0:
                    nxt_ready.append(waiting)
        ready = nxt_ready
    unplaced = todo - frozenset().union(*waves) if waves else todo
    if unplaced:  # in a dependency cycle, or not in the new tables at all: last, together
        waves.append(frozenset(unplaced))
    return tuple(waves)


__all__ = ["make_waves"]
