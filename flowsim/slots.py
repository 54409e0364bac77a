"""The controller's slot tables as the simulator sees them: which port a packet of a multipath policy takes.

Under every multipath policy the controller compiles, per switch and set of equal-cost ports, a table of
`SLOTS` (16) slots, each naming one port (`controller.sm.policies`): a packet's UDP source port, a 4-bit
window of it chosen by the switch's level (`slot_shift`), picks the slot.  So:

* a flow that keeps one source port (ecmp, or `entropy: fixed`) sits in one slot at every switch — the one
  its port picks, exactly as on the emulated switches: the same flows collide on the same links;
* a sprayed flow (spray, adaptive) runs through every slot, so it splits over the set's ports in
  proportion to the slots each port holds (16 slots over 3 ports: 6/5/5);
* `adaptive` moves slots between ports (`controller.sm.adaptive.rebalance`), changing both.

A set of more than 16 ports cannot be spread by the controller's tables (even weights give the first 16
ports a slot each and the rest none).  The simulator then models what the *policy* means, not that limit:
a table with one slot per port, a seeded hash choosing the slot of a pinned flow — and says so in its
summary (`wide_sets`).

Sets are found lazily, for the (switch, target switch) rows routes actually cross, and numbered locally
per routing; `keys` names them (switch, ports) so weights carry over when a fault changes the tables.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from controller.sm.compile import switch_levels
from controller.sm.policies import SLOTS, even_assignment, slot_shift
from flowsim.network import F64, I32, I64, Routing

SetKey = tuple[str, tuple[int, ...]]
U64 = npt.NDArray[np.uint64]


def mix64(x: U64) -> U64:
    """splitmix64 finaliser: a well-mixed 64-bit hash, vectorised (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class SlotTables:
    """Sets of one routing: ports, slot widths, source-port windows and slot -> port assignments."""

    def __init__(self, routing: Routing, weights: dict[SetKey, tuple[int, ...]] | None = None) -> None:
        subnet = routing.subnet
        self.routing = routing
        self.n = subnet.n_switches
        self.max_ports = subnet.n_ports
        self.width_max = max(SLOTS, self.max_ports)
        self.shift_of_switch = np.array([slot_shift(int(x)) for x in switch_levels(subnet)], dtype=np.int64)
        #: Shared with the caller: assignments that differ from even (adaptive moves), by set key.
        self.weights: dict[SetKey, tuple[int, ...]] = weights if weights is not None else {}
        self._lookup: I32 | None = None
        self._of_row: dict[tuple[int, bytes], int] = {}
        self.keys: list[SetKey] = []
        self.switch = np.zeros(0, dtype=np.int32)
        self.ports = np.zeros((0, self.max_ports), dtype=np.int32)
        self.nports = np.zeros(0, dtype=np.int32)
        self.width = np.zeros(0, dtype=np.int32)
        self.shift = np.zeros(0, dtype=np.int64)
        self.assign = np.zeros((0, self.width_max), dtype=np.int32)  # slot -> index into ports[set]
        self.frac = np.zeros((0, self.max_ports))  # share of a sprayed flow per port index

    @property
    def n_sets(self) -> int:
        return len(self.keys)

    @property
    def wide(self) -> int:
        """Sets wider than the controller's 16 slots (modelled as one slot per port)."""
        return int((self.nports > SLOTS).sum())

    def set_ids(self, s: I32, t: I32) -> I32:
        """Set of each (switch, target switch) row; -1 where there are fewer than two equal-cost ports."""
        pair = s.astype(np.int64) * self.n + t
        if self._lookup is None:
            self._lookup = np.full(self.n * self.n, -2, dtype=np.int32)
        found = self._lookup[pair]
        unknown = np.unique(pair[found == -2])
        if unknown.size:
            self._lookup[unknown] = self._find(unknown // self.n, unknown % self.n)
            found = self._lookup[pair]
        out: I32 = found.astype(np.int32)
        return out

    def _find(self, s: I64, t: I64) -> I32:
        """Set ids for new (switch, target) rows: rows with equal alternatives at one switch share a set."""
        rows = self.routing.tables.alt[s, t]  # (m, bytes)
        counts = np.unpackbits(rows, axis=1, count=self.max_ports).sum(axis=1)
        out = np.full(s.size, -1, dtype=np.int32)
        multi = np.flatnonzero((counts >= 2) & (s != t))
        if multi.size == 0:
            return out
        keyed = np.concatenate([s[multi, None].astype(np.int64).view(np.uint8).reshape(-1, 8), rows[multi]],
                               axis=1)  # fmt: skip
        uniq, inverse = np.unique(keyed, axis=0, return_inverse=True)
        ids = np.empty(uniq.shape[0], dtype=np.int32)
        for i, key in enumerate(uniq):
            switch = int(key[:8].view(np.int64)[0])
            ids[i] = self._new(switch, key[8:].tobytes())
        out[multi] = ids[inverse.ravel()]
        return out

    def _new(self, s: int, row_bytes: bytes) -> int:
        key = (s, row_bytes)
        found = self._of_row.get(key)
        if found is not None:
            return found
        row = np.frombuffer(row_bytes, dtype=np.uint8)
        bits = np.unpackbits(row, count=self.max_ports).astype(bool)
        ports = tuple(int(p) for p in np.flatnonzero(bits))
        sid = len(self.keys)
        self._of_row[key] = sid
        name = self.routing.subnet.switch_names[s]
        self.keys.append((name, ports))
        width = SLOTS if len(ports) <= SLOTS else len(ports)
        padded = np.full((1, self.max_ports), -1, dtype=np.int32)
        padded[0, : len(ports)] = ports
        self.switch = np.append(self.switch, np.int32(s))
        self.ports = np.vstack([self.ports, padded])
        self.nports = np.append(self.nports, np.int32(len(ports)))
        self.width = np.append(self.width, np.int32(width))
        self.shift = np.append(self.shift, self.shift_of_switch[s])
        self.assign = np.vstack([self.assign, np.zeros((1, self.width_max), dtype=np.int32)])
        self.frac = np.vstack([self.frac, np.zeros((1, self.max_ports))])
        self._apply(sid, self.weights.get((name, ports)))
        return sid

    def _apply(self, sid: int, assignment: tuple[int, ...] | None) -> None:
        """Slots of set `sid` from an assignment (ports per slot); even (the controller's) when None."""
        _, ports = self.keys[sid]
        width = int(self.width[sid])
        if width > SLOTS:
            assignment = assignment if assignment and len(assignment) == width else ports
        elif assignment is None or len(assignment) != SLOTS or not set(assignment) <= set(ports):
            assignment = even_assignment(ports)
        index = {p: j for j, p in enumerate(ports)}
        slots = np.array([index[p] for p in assignment], dtype=np.int32)
        self.assign[sid, :width] = slots
        self.frac[sid] = np.bincount(slots, minlength=self.max_ports)[: self.max_ports] / width

    def assignment(self, sid: int) -> tuple[int, ...]:
        _, ports = self.keys[sid]
        return tuple(ports[j] for j in self.assign[sid, : int(self.width[sid])].tolist())

    def set_assignment(self, sid: int, assignment: tuple[int, ...]) -> None:
        self.weights[self.keys[sid]] = assignment
        self._apply(sid, assignment)

    def pinned_slot(self, sid: I32, sport: I32, flow_hash: U64, switch_guid: U64) -> I64:
        """The slot a packet with UDP source port `sport` takes in each set (the controller's window for
        16-slot tables; a seeded hash for wide ones)."""
        width = self.width[sid].astype(np.int64)
        slot = (sport.astype(np.int64) >> self.shift[sid]) & (SLOTS - 1)
        wide = width > SLOTS
        if wide.any():
            salted = mix64(flow_hash[wide] ^ switch_guid[wide])
            slot[wide] = (salted % width[wide].astype(np.uint64)).astype(np.int64)
        return slot

    def pinned_port(self, sid: I32, slot: I64) -> I32:
        j = self.assign[sid, slot]
        return self.ports[sid, j].astype(np.int32)

    def split(self, sid: I32, frac: F64 | None = None) -> tuple[I32, I32, F64]:
        """Ports and shares of sprayed traffic for rows of sets: (row index, port, share) for every port with
        a share (`frac` overrides the slot counts: local adaptive routing's weights)."""
        table = self.frac if frac is None else frac
        if table.shape[0] < self.n_sets:  # sets found since `frac` was made: their slot shares
            table = np.vstack([table, self.frac[table.shape[0] :]])
        shares = table[sid]  # (rows, max_ports)
        rows, j = np.nonzero(shares > 0)
        return rows.astype(np.int32), self.ports[sid[rows], j].astype(np.int32), shares[rows, j]


__all__ = ["SetKey", "SlotTables", "mix64"]
