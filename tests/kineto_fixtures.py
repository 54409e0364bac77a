"""PyTorch profiler (Kineto) traces built to the published schema, for the importer's tests and the shipped
example (`scenarios/traces/kineto/`): what `torch.profiler` writes per rank with `export_chrome_trace`.

Each rank's file is a Chrome trace: `distributedInfo` (backend, rank, world size), `baseTimeNanoseconds`,
and `traceEvents` with, per NCCL collective, the CPU op `record_param_comms` (cat `cpu_op`) and the GPU
kernel (`ncclDevKernel_...`, cat `kernel`, on its CUDA stream) — both carrying the collective's `args`
("Collective name", "dtype", "In/Out msg nelems", "Group size", "Process Group Name/Description/Ranks") —
plus compute kernels and runtime events around them, as real traces have.

The modelled job (16 ranks, 4 per tensor-parallel group, 4 data-parallel groups, 8-rank expert groups)
runs one training step: tensor-parallel all-gathers on one stream overlapping with the previous layer's
data-parallel all-reduce on another, an expert-parallel all-to-all, then reduce-scatters; kernel times as
a 400 Gb/s fabric would give them.  Ranks' clocks differ (base times differ), as on separate machines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: (start µs, duration µs, stream, collective name, dtype, in nelems, out nelems, group of rank r, pg name)
Step = tuple[float, float, int, str, str, int, int, str]


def groups(rank: int) -> dict[str, list[int]]:
    tp = rank // 4
    return {
        f"tp{tp}": [4 * tp + i for i in range(4)],
        f"dp{rank % 4}": [rank % 4 + 4 * i for i in range(4)],
        f"ep{rank // 8}": [8 * (rank // 8) + i for i in range(8)],
    }


def schedule(rank: int) -> list[tuple[float, float, int, str, str, int, int, str]]:
    """One training step of one rank: (start µs, dur µs, stream, name, dtype, in nelems, out nelems, pg)."""
    g = groups(rank)
    tp, dp, ep = (next(k for k in g if k.startswith(p)) for p in ("tp", "dp", "ep"))
    skew = 3.0 * (rank % 5)  # kernels of one collective do not start at one instant on every rank
    mib = 1 << 20
    return [
        (100.0 + skew, 420.0, 20, "_allgather_base", "BFloat16", 2 * mib, 8 * mib, tp),
        (180.0 + skew, 1900.0, 7, "allreduce", "Float", 8 * mib, 8 * mib, dp),
        (700.0 + skew, 420.0, 20, "_allgather_base", "BFloat16", 2 * mib, 8 * mib, tp),
        (1400.0 + skew, 650.0, 20, "all_to_all", "BFloat16", 4 * mib, 4 * mib, ep),
        (2300.0 + skew, 430.0, 20, "_reduce_scatter_base", "BFloat16", 8 * mib, 2 * mib, tp),
        (2800.0 + skew, 1900.0, 7, "allreduce", "Float", 8 * mib, 8 * mib, dp),
    ]


def rank_trace(rank: int, world: int = 16, base_ns: int = 1_733_300_000_000_000_000) -> dict[str, Any]:
    g = groups(rank)
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "pid": 0,
         "tid": 7, "ts": 20.0, "dur": 80.0, "args": {"device": 0, "stream": 7, "correlation": 11}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": 12.0,
         "dur": 4.0, "args": {"correlation": 11}},
        {"ph": "X", "cat": "cpu_op", "name": "nccl:send", "pid": 100, "tid": 100, "ts": 5.0, "dur": 2.0,
         "args": {"Collective name": "send", "dtype": "Float", "In msg nelems": 16, "Out msg nelems": 16,
                  "Group size": 2, "Process Group Name": "p2p", "Process Group Ranks": "[0, 1]"}},
    ]  # fmt: skip
    for i, (start, dur, stream, name, dtype, n_in, n_out, pg) in enumerate(schedule(rank)):
        ranks = g[pg]
        args = {
            "Collective name": name,
            "dtype": dtype,
            "In msg nelems": n_in,
            "Out msg nelems": n_out,
            "Group size": len(ranks),
            "Process Group Name": pg,
            "Process Group Description": f"{pg[:2]} group",
            "Process Group Ranks": json.dumps(ranks).replace(",", ", "),
            "In split size": "[]",
            "Out split size": "[]",
        }
        correlation = 1000 + i
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "pid": 100,
                "tid": 100,
                "ts": start - 30.0,
                "dur": 6.0,
                "args": {**args, "Rank": rank, "External id": i},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": 100,
                "ts": start - 20.0,
                "dur": 5.0,
                "args": {"correlation": correlation},
            }
        )
        kind = {
            "_allgather_base": "AllGather",
            "allreduce": "AllReduce_Sum_f32",
            "all_to_all": "SendRecv",
            "_reduce_scatter_base": "ReduceScatter_Sum_bf16",
        }[name]
        kernel = f"ncclDevKernel_{kind}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        gpu = {**args, "device": 0, "stream": stream, "correlation": correlation}
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": start,
                       "dur": dur, "args": gpu})  # fmt: skip
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 10},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "baseTimeNanoseconds": base_ns + 7_000 * rank,  # each machine's clock
        "traceEvents": events,
        "displayTimeUnit": "ms",
    }


def write_ranks(directory: Path, world: int = 16) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(world):
        path = directory / f"rank{rank}.json"
        path.write_text(json.dumps(rank_trace(rank, world), indent=1) + "\n")
        paths.append(path)
    return paths


__all__ = ["groups", "rank_trace", "schedule", "write_ranks"]
