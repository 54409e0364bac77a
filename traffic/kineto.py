"""PyTorch profiler (Kineto) traces of a real job -> a congestion trace scenarios replay.

A Kineto trace (Chrome trace JSON, one file per rank) records every NCCL collective twice: the CPU op
`record_param_comms` when it was enqueued, and the GPU kernel (`ncclDevKernel_...`, category `kernel`)
when it ran — which is when the network carried it.  Recent PyTorch puts the collective's parameters on
both as `args`:

    "Collective name": "allreduce" | "allgather" | "_allgather_base" | "reduce_scatter" | "all_to_all" | ...
    "dtype": "Float" | "BFloat16" | ...,   "In msg nelems": 1048576,   "Out msg nelems": 1048576,
    "Group size": 8,   "Process Group Name": "0",   "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"

and the file says whose it is in `distributedInfo.rank`.  Each collective a rank ran becomes that rank's
sends of the planner's steps (`traffic.patterns`, as `fabriclab traffic plan` expands it) over its process
group's hosts, step k posted at kernel start + k x kernel duration / steps, one connection (QP) per
(src, dst, process group) so collectives of different groups may overtake each other while those of one
group stay in order; each record's `tag` names the collective it came from
(`allreduce#3/pg0/s2`).  Sizes follow nccl-tests: all-reduce, reduce-scatter, all-to-all and broadcast
by their input buffer, all-gather by its output buffer.  Point-to-point `send`/`recv` and barriers are
not collectives of a planner and are counted, not imported.

Ranks map to hosts in order (rank i -> hosts[i]).  Times are µs from the first collective of any rank,
ranks aligned through `baseTimeNanoseconds` when their files carry it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.errors import read_input_file
from traffic.errors import TrafficError
from traffic.patterns import plan
from traffic.trace import ROCE_TCLASS, TraceRecord

#: A Kineto trace is read whole; a day of a big job's profile is far less.
MAX_KINETO_BYTES = 512 * 2**20

#: PyTorch's scalar type names (as `dtype` prints them) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1,
    "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}  # fmt: skip

#: `Collective name` -> (planner, which buffer sizes it as nccl-tests does).
COLLECTIVES: dict[str, tuple[str, str]] = {
    "allreduce": ("allreduce-ring", "In"),
    "all_reduce": ("allreduce-ring", "In"),
    "allreduce_coalesced": ("allreduce-ring", "In"),
    "allgather": ("allgather", "Out"),
    "all_gather": ("allgather", "Out"),
    "_allgather_base": ("allgather", "Out"),
    "allgather_into_tensor_coalesced": ("allgather", "Out"),
    "all_gather_into_tensor": ("allgather", "Out"),
    "reduce_scatter": ("reduce-scatter", "In"),
    "_reduce_scatter_base": ("reduce-scatter", "In"),
    "reduce_scatter_tensor_coalesced": ("reduce-scatter", "In"),
    "reduce_scatter_tensor": ("reduce-scatter", "In"),
    "all_to_all": ("alltoall", "In"),
    "alltoall": ("alltoall", "In"),
    "alltoall_base": ("alltoall", "In"),
    "all_to_allv": ("alltoall", "In"),
    "broadcast": ("broadcast", "In"),
}
#: Communication that is not a planner's collective: counted, not imported.
NOT_COLLECTIVES = ("send", "recv", "recv_anysource", "barrier", "reduce", "gather", "scatter", "wait")


@dataclass(frozen=True)
class KinetoCollective:
    """One collective one rank ran."""

    rank: int
    kind: str  # planner name
    name: str  # `Collective name` as recorded
    size_bytes: int
    group: tuple[int, ...]  # global ranks of the process group
    group_name: str
    start_us: float
    dur_us: float
    seq: int  # index among this rank's collectives of that process group


@dataclass
class Imported:
    records: list[TraceRecord]
    collectives: list[KinetoCollective]
    skipped: dict[str, int]


def _events(doc: Any, file: str) -> list[Mapping[str, Any]]:
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        return [e for e in doc if isinstance(e, dict)]
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TrafficError("not a Kineto/Chrome trace (no traceEvents list)", field="traceEvents", file=file)
    return [e for e in doc["traceEvents"] if isinstance(e, dict)]


def _ranks(text: Any, size: int | None, file: str) -> tuple[int, ...] | None:
    """`Process Group Ranks` ("[0, 1, 2]", truncated "[64, 65, 66, ...]" for big groups) -> ranks."""
    if isinstance(text, list):
        values = text
    elif isinstance(text, str) and text.strip():
        values = [int(v) for v in re.findall(r"-?\d+", text)]
        if "..." in text and size is not None and len(values) >= 2 and len(values) < size:
            stride = values[1] - values[0]
            values = [values[0] + i * stride for i in range(size)]
    else:
        return None
    if not all(isinstance(v, int) and v >= 0 for v in values):
        raise TrafficError(f"bad process group ranks {text!r}", field="Process Group Ranks", file=file)
    return tuple(values)


def read_kineto(path: str | Path) -> tuple[int | None, float, list[Mapping[str, Any]]]:
    """(rank, time base in µs, NCCL events) of one Kineto trace file: GPU kernels that carry the
    collective's parameters, else the CPU ops `record_param_comms`."""
    file = str(path)
    text = read_input_file(path, TrafficError, MAX_KINETO_BYTES)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrafficError(f"not JSON ({exc.msg} at line {exc.lineno})", field="json", file=file) from None
    except RecursionError:
        raise TrafficError("not JSON (nested too deeply)", field="json", file=file) from None
    events = _events(doc, file)
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise TrafficError(f"must be a rank >= 0, got {rank!r}", field="distributedInfo.rank", file=file)
    base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
    base_us = float(base) / 1000.0 if isinstance(base, int | float) and not isinstance(base, bool) else 0.0
    comms = [e for e in events if isinstance(e.get("args"), dict) and "Collective name" in e["args"]]
    kernels = [e for e in comms if e.get("cat") == "kernel"]
    chosen = kernels or [e for e in comms if e.get("name") == "record_param_comms"] or comms
    return rank, base_us, chosen


def collectives_of(
    path: str | Path, default_rank: int | None = None
) -> tuple[list[KinetoCollective], dict[str, int]]:
    """The collectives one rank's trace file recorded, and what was skipped (by name)."""
    file = str(path)
    rank, base_us, events = read_kineto(path)
    out: list[KinetoCollective] = []
    skipped: dict[str, int] = {}
    seq: dict[str, int] = {}
    for e in sorted(events, key=lambda e: _number(e.get("ts", 0.0), "ts", file)):
        args = e["args"]
        name = str(args.get("Collective name", ""))
        if name not in COLLECTIVES:
            skipped[name] = skipped.get(name, 0) + 1
            continue
        kind, buffer = COLLECTIVES[name]
        dtype = str(args.get("dtype"))
        if dtype not in DTYPE_BYTES:
            raise TrafficError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})", field="dtype",
                               file=file)  # fmt: skip
        field = f"{buffer} msg nelems"
        nelems = args.get(field)
        if isinstance(nelems, bool) or not isinstance(nelems, int) or nelems < 0:
            raise TrafficError(f"must be an element count, got {nelems!r}", field=field, file=file)
        who = rank if rank is not None else args.get("Rank", default_rank)
        if not isinstance(who, int) or isinstance(who, bool):
            raise TrafficError("which rank is this? (no distributedInfo.rank nor args.Rank)", field="rank",
                               file=file)  # fmt: skip
        group = _group(args, file)
        if len(group) < 2:  # a group of one sends nothing over the fabric
            skipped[f"{name} (1 rank)"] = skipped.get(f"{name} (1 rank)", 0) + 1
            continue
        if who not in group:
            raise TrafficError(f"rank {who} is not in its process group {list(group)}",
                               field="Process Group Ranks", file=file)  # fmt: skip
        pg = str(args.get("Process Group Name", "0"))
        n = seq.get(pg, 0)
        seq[pg] = n + 1
        start_us = _number(e.get("ts"), "ts", file) + base_us
        out.append(KinetoCollective(who, kind, name, nelems * DTYPE_BYTES[dtype], group, pg, start_us,
                                    _number(e.get("dur", 0.0), "dur", file), n))  # fmt: skip
    return out, skipped


def _number(value: Any, field: str, file: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TrafficError(f"must be a number, got {value!r}", field=field, file=file)
    return float(value)


def _group(args: Mapping[str, Any], file: str) -> tuple[int, ...]:
    """The process group's global ranks: its list, or start/stride/size when the list is missing."""
    size = args.get("Group size")
    size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    group = _ranks(args.get("Process Group Ranks"), size, file)
    if group is not None:
        return group
    if size is None:
        raise TrafficError("no Process Group Ranks nor Group size", field="Process Group Ranks", file=file)
    start, stride = args.get("Global rank start", 0), args.get("Global rank stride", 1)
    return tuple(int(start) + i * int(stride) for i in range(size))


def import_kineto(paths: Sequence[str | Path], hosts: Sequence[str], tclass: int = ROCE_TCLASS) -> Imported:
    """Every rank's collectives as trace records over `hosts` (rank i -> hosts[i])."""
    collectives: list[KinetoCollective] = []
    skipped: dict[str, int] = {}
    for i, path in enumerate(paths):
        found, skip = collectives_of(path, default_rank=i if len(paths) > 1 else None)
        collectives += found
        for k, v in skip.items():
            skipped[k] = skipped.get(k, 0) + v
    if not collectives:
        names = ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items())) or "none at all"
        raise TrafficError(f"no NCCL collectives in {', '.join(str(p) for p in paths)} (communication found: "
                           f"{names}); profile with record_shapes or a PyTorch that records them",
                           field="traceEvents")  # fmt: skip
    top = max(r for c in collectives for r in c.group)
    if top >= len(hosts):
        raise TrafficError(
            f"rank {top} has no host: {len(hosts)} hosts given for ranks 0..{top}", field="hosts"
        )
    t0 = min(c.start_us for c in collectives)
    qps: dict[tuple[str, str, str], int] = {}
    used: dict[str, int] = {}
    rows: list[tuple[float, int, TraceRecord]] = []
    order = 0
    for c in sorted(collectives, key=lambda c: (c.start_us, c.rank, c.group_name, c.seq)):
        members = [hosts[r] for r in c.group]
        me = hosts[c.rank]
        steps = plan(c.kind, members, c.size_bytes).steps
        for step in steps:
            for t in step:
                if t.src != me:
                    continue
                key = (t.src, t.dst, c.group_name)
                if key not in qps:
                    qps[key] = 1 + used.get(t.src, 0)
                    used[t.src] = qps[key]
                at = c.start_us - t0 + t.step * c.dur_us / max(1, len(steps))
                tag = f"{c.name}#{c.seq}/pg{c.group_name}/s{t.step}"
                record = TraceRecord(round(at, 3), t.src, t.dst, t.size_bytes, qps[key], tclass, tag)
                rows.append((record.time_us, order, record))
                order += 1
    rows.sort(key=lambda r: (r[0], r[1]))
    return Imported([r[2] for r in rows], collectives, skipped)


__all__ = ["COLLECTIVES", "DTYPE_BYTES", "Imported", "KinetoCollective", "collectives_of", "import_kineto",
           "read_kineto"]  # fmt: skip
