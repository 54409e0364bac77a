"""sssp's balancing loop in plain Python, for small fabrics.

The loop over destinations is sequential (each sees the loads of those before), and on a fabric of a few
dozen switches every distance level holds a handful of switches with one or two shortest-path ports: the
vector form then spends its time in the fixed cost of ~25 array operations per level, not in arithmetic
(a 6x6 torus: 36 switches, 108 destinations, 3 rounds, ~70 us per destination).  Here the same choices
are made with Python lists over precomputed per-destination-switch candidate lists.

Same inputs, same tables: costs are computed with the same float operations in the same order (load x
weight + path cost), ties go to the first port in preference order as `argmin` does, and flows are whole
numbers, so sums do not depend on the order of addition.  `tests/test_sssp_kernels.py` holds both forms to
equal tables on many fabrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

#: (port, channel, weight, next switch) of one shortest-path candidate of one switch.
Candidate = tuple[int, int, float, int]


class Candidates:
    """Per destination switch: (switch, first candidate, the others in preference order) nearest first,
    and the switches farthest first.  Built for every destination switch at once (small fabrics only: the
    lists hold every (switch, destination switch, candidate) triple)."""

    def __init__(
        self,
        n: int,
        levels: Callable[[int], list[npt.NDArray[np.intp]]],
        masks: npt.NDArray[np.bool_],
        preference: npt.NDArray[np.intp],
        channel: npt.NDArray[np.intp],
        weight: npt.NDArray[np.float64],
        next_switch: npt.NDArray[np.intp],
    ) -> None:
        """`levels(t)`: the switches by distance to switch t, farthest group first (sssp's `_Levels`);
        `masks[s, t, p]`: port p of switch s is a shortest-path candidate towards switch t."""
        pref_mask = np.take_along_axis(masks, preference[:, None, :], axis=2)
        s_idx, t_idx, j_idx = np.nonzero(pref_mask)  # row-major: by switch, target, preference
        ports = preference[s_idx, j_idx]
        per: list[list[list[Candidate]]] = [[[] for _ in range(n)] for _ in range(n)]
        for s, t, port, chan, w, nxt in zip(
            s_idx.tolist(),
            t_idx.tolist(),
            ports.tolist(),
            channel[s_idx, ports].tolist(),
            weight[s_idx, ports].tolist(),
            next_switch[s_idx, ports].tolist(),
            strict=True,
        ):
            per[t][s].append((port, chan, w, nxt))
        self.near: list[list[tuple[int, Candidate, tuple[Candidate, ...]]]] = []
        self.far: list[list[int]] = []
        for t in range(n):
            far = [s for group in levels(t) for s in group.tolist()]
            near = [s for group in reversed(levels(t)) for s in group.tolist()]
            self.near.append([(s, per[t][s][0], tuple(per[t][s][1:])) for s in near])
            self.far.append(far)


def balance(
    candidates: Candidates,
    order: Sequence[int],
    dest_lids: Sequence[int],
    dest_switch: Sequence[int],
    dest_is_host: Sequence[bool],
    host_sources: Sequence[float],
    n_switches: int,
    n_channels: int,
    rounds: int,
    imbalance: Callable[[npt.NDArray[np.float64]], float],
    balanced: float,
    lft: npt.NDArray[np.uint8],
) -> None:
    """sssp's rounds (see `SsspEngine`) writing each destination's chosen ports into `lft`."""
    load = [0.0] * (n_channels + 1)
    host_load = [0.0] * (n_channels + 1)
    path_cost = [0.0] * (n_switches + 1)
    chosen: dict[int, list[Candidate]] = {}
    ones = [1.0] * n_switches
    unset: Candidate = (0, n_channels, 0.0, n_switches)

    #: Per destination, the flow through every switch of its tree, to take its charges off again.
    through: dict[int, list[float]] = {}

    def charge(far: list[int], picks: list[Candidate], sources: Sequence[float], host: bool) -> list[float]:
        """Farthest first: carry the flows along the chosen tree and charge the links they use.  A
        switch's flow is complete when it is reached and never changes after (flows only move nearer)."""
        flows = list(sources)
        flows.append(0.0)
        for s in far:
            _, chan, _, nxt = picks[s]
            flow = flows[s]
            load[chan] += flow
            flows[nxt] += flow
        if host:
            for s in far:
                host_load[picks[s][1]] += flows[s]
        return flows

    def discharge(far: list[int], picks: list[Candidate], flows: list[float], host: bool) -> None:
        for s in far:
            load[picks[s][1]] += -1.0 * flows[s]
        if host:
            for s in far:
                host_load[picks[s][1]] += -1.0 * flows[s]

    previous = np.inf
    for _ in range(rounds):
        for i in order:
            target = dest_switch[i]
            far = candidates.far[target]
            host = dest_is_host[i]
            sources = host_sources if host else ones
            picks = chosen.get(i)
            if picks is None:
                picks = chosen[i] = [unset] * n_switches
            else:  # rip up, reroute against all the others
                discharge(far, picks, through[i], host)
            path_cost[target] = 0.0
            for s, first, rest in candidates.near[target]:
                best = first
                best_cost = load[best[1]] * best[2] + path_cost[best[3]]
                for cand in rest:
                    cost = load[cand[1]] * cand[2] + path_cost[cand[3]]
                    if cost < best_cost:  # strictly: ties stay with the earlier port, as argmin's do
                        best_cost, best = cost, cand
                path_cost[s] = best_cost
                picks[s] = best
            through[i] = charge(far, picks, sources, host)
        worst = imbalance(np.array(host_load[:n_channels], dtype=np.float64))
        if worst <= balanced or worst >= previous - 1e-9:
            break
        previous = worst
    for i, picks in chosen.items():
        rows = [s for s, pick in enumerate(picks) if pick is not unset]
        if rows:
            lft[rows, dest_lids[i]] = [picks[s][0] for s in rows]


__all__ = ["Candidates", "balance"]
