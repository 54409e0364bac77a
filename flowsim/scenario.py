"""Scenario files for the simulator: the emulator's own parser and model, turned into a workload.

`fabriclab sim` reads exactly what `fabriclab scenario run` reads (`emulation.scenario.load_scenario`:
layered validation, file:line:field errors).  What the simulator does with each part:

* `controller`: engine, policy and its parameters (the emulator's `scale` is ignored: real link speeds).
* `udp` / `udp-permutation`: timed flows at their packet rate x size, for their duration (the emulator's
  seeded permutation, same seed, same pairs).
* `roce-collective`: the planner's steps, rank by rank (`schedule: one-phase`: every pair at once);
  `rate_pps` and `mtu` are emulator pacing knobs and are ignored.
* `kv-transfer`: `traffic.kvcache` messages at their posting times; the pages of one layer posted at one
  instant form one flow, and a prefill->decode pair's messages are delivered in order (one QP).
* `trace`: a congestion trace's records at `start_s + time_us`; messages of one (src, qp) in order.
* `faults`: applied at their times; the controller's tables are recomputed for the degraded fabric.
"""

from __future__ import annotations

import numpy as np

from emulation.scenario import (
    KvTransfer,
    RoceCollective,
    Scenario,
    TraceReplay,
    collective_ranks,
    trace_path,
)
from flowsim.network import Network
from flowsim.workload import Collective, FlowBatch, Workload, collective
from traffic.errors import parse_size
from traffic.kvcache import kv_transfer, model_shape
from traffic.trace import read_trace


def workload_of(scenario: Scenario, network: Network) -> Workload:
    spec = scenario.spec
    hosts = sorted(network.host_index)
    batches: list[FlowBatch] = []
    collectives: list[Collective] = []
    udp = scenario.flows(0)
    if udp:
        gbps = np.array([f.rate_pps * f.size_bytes * 8 / 1e9 for f in udp])
        batches.append(
            FlowBatch(
                "udp",
                network.hosts([f.src for f in udp], "src"),
                network.hosts([f.dst for f in udp], "dst"),
                np.full(len(udp), np.inf),
                np.array([f.start_s for f in udp]),
                gbps,
                np.array([f.duration_s for f in udp]),
                np.arange(len(udp), dtype=np.int32) & 0x3FFF,
            )
        )
    for i, item in enumerate(spec.traffic):
        name = f"traffic[{i}] {item.kind}"
        if isinstance(item, RoceCollective):
            ranks = network.hosts(collective_ranks(item, hosts), "ranks")
            made = collective(
                f"{name} {item.collective}",
                item.collective,
                ranks,
                parse_size(item.size),
                network,
                one_phase=item.schedule == "one-phase",
            )
            (batches if isinstance(made, FlowBatch) else collectives).append(made)  # type: ignore[arg-type]
        elif isinstance(item, KvTransfer):
            batches.append(_kv_batch(name, item, network, spec.seed))
        elif isinstance(item, TraceReplay):
            batches.append(_trace_batch(name, item, scenario, network))
    faults = tuple((f.at_s, f.action, f.port or f.switch or "") for f in spec.faults)
    return Workload(tuple(batches), tuple(collectives), faults, label=f"scenario {spec.name}")


def _chained(name: str, network: Network, rows: list[tuple[float, str, str, int, int]]) -> FlowBatch:
    """Flows (start_s, src, dst, bytes, connection) where each waits for the previous one of its
    (src, connection): messages of one queue pair are delivered in order."""
    after = np.full(len(rows), -1, dtype=np.int32)
    last: dict[tuple[str, int], int] = {}
    for i, (_, src, _, _, conn) in enumerate(rows):
        prev = last.get((src, conn))
        if prev is not None:
            after[i] = prev
        last[(src, conn)] = i
    n = len(rows)
    return FlowBatch(
        name,
        network.hosts([r[1] for r in rows], "src"),
        network.hosts([r[2] for r in rows], "dst"),
        np.array([float(r[3]) for r in rows]),
        np.array([r[0] for r in rows]),
        np.full(n, np.inf),
        np.full(n, np.nan),
        np.array([r[4] & 0x3FFF for r in rows], dtype=np.int32),
        after=after,
    )


def _kv_batch(name: str, item: KvTransfer, network: Network, seed: int) -> FlowBatch:
    prefill = item.prefill if isinstance(item.prefill, list) else [h.strip() for h in item.prefill.split(",")]
    messages = kv_transfer(
        model_shape(item.model),
        item.prompt_tokens,
        prefill,
        item.decode,
        item.page_tokens,
        item.requests,
        item.arrival_rate_per_s,
        item.layer_time_us,
        seed,
    )
    merged: dict[tuple[float, str, str], int] = {}
    for m in messages:
        key = (m.time_us, m.src, m.dst)
        merged[key] = merged.get(key, 0) + m.size_bytes
    conn = {pair: i for i, pair in enumerate(sorted({(s, d) for _, s, d in merged}))}
    rows = [(item.start_s + t / 1e6, s, d, size, conn[(s, d)]) for (t, s, d), size in merged.items()]
    return _chained(name, network, rows)


def _trace_batch(name: str, item: TraceReplay, scenario: Scenario, network: Network) -> FlowBatch:
    records = read_trace(trace_path(item, scenario.file))
    rows = [(item.start_s + r.time_us / 1e6, r.src, r.dst, r.size_bytes, r.qp) for r in records]
    return _chained(name, network, rows)


__all__ = ["workload_of"]
