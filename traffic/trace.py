"""Congestion traces: timed messages in a text file, so a workload can be replayed, diffed and shared.

A plan (steps) or a KV-cache workload (timed WRITEs) is turned into a flat list of messages with a posting
time, a queue pair and a traffic class: what a replayer needs to drive real or emulated NICs, and what a
flow simulator needs to reproduce the same congestion.  A file format instead of pickles so traces can be
produced by other tools (e.g. from a production capture) and read by people.

Format, version 1: JSON Lines (UTF-8), one JSON object per line, blank lines ignored::

    {"time_us":0.0,"src":"h1","dst":"h2","bytes":2097152,"qp":1,"tclass":3,"tag":"allreduce-ring/s0/..."}

- ``time_us`` (number >= 0): when `src` posts the message, in microseconds from the start of the trace.
  Records are ordered by ``time_us`` (non-decreasing); records with the same time are posted in file
  order.  A reader refuses time going backwards rather than sorting, because the order of equal times is
  significant and a shuffled file is more likely a bug than an intent.
- ``src``, ``dst`` (non-empty strings, different): host names as in the topology (e.g. "h1").
- ``bytes`` (integer >= 0): payload of one message (one RDMA WRITE); headers not included.  Zero is a
  legal zero-length WRITE.
- ``qp`` (integer >= 0): the sender's queue pair number.  (src, qp) names one connection; messages of one
  connection are delivered in order, different connections may overtake each other (and hash onto
  different ECMP paths).
- ``tclass`` (integer 0..7): the traffic class / 802.1p priority, i.e. the PFC class the message rides
  in; RoCE deployments conventionally use 3.
- ``tag`` (string, may be empty): a free-form label so results can be grouped by what the message was
  (collective/step/chunk, request/layer/page).  Replayers must not interpret it.

Exactly these seven keys: an unknown key is an error, so a typo ("byte") never silently becomes a
default.  Errors are reported as ``FILE:LINE: field: message``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.errors import read_input_file
from traffic.errors import TrafficError
from traffic.kvcache import KvMessage, kv_transfer, model_shape
from traffic.patterns import Plan, ring_allreduce

#: A trace is read whole: 256 MiB is about 2.5 million records (what `fabriclab traffic plan` can write).
MAX_TRACE_BYTES = 256 * 2**20
KEYS = ("time_us", "src", "dst", "bytes", "qp", "tclass", "tag")
#: The traffic class RoCE traffic conventionally uses (DSCP 26 -> priority 3, the lossless PFC class).
ROCE_TCLASS = 3


@dataclass(frozen=True)
class TraceRecord:
    """One line of a trace.  Errors name the file's keys ("bytes"), since that is what users edit."""

    time_us: float
    src: str
    dst: str
    size_bytes: int
    qp: int
    tclass: int
    tag: str = ""

    def __post_init__(self) -> None:
        t = self.time_us
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise TrafficError(f"must be a number >= 0, got {t!r}", field="time_us")
        object.__setattr__(self, "time_us", float(t))
        for key, name in (("src", self.src), ("dst", self.dst)):
            if not isinstance(name, str) or not name:
                raise TrafficError(f"must be a non-empty host name, got {name!r}", field=key)
        if self.src == self.dst:
            raise TrafficError(f"same as src ({self.src!r})", field="dst")
        limits: tuple[tuple[str, int, int | None], ...] = (
            ("bytes", self.size_bytes, None),
            ("qp", self.qp, None),
            ("tclass", self.tclass, 7),
        )
        for key, value, top in limits:
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 0
                or (top is not None and value > top)
            ):
                limit = f"between 0 and {top}" if top else ">= 0"
                raise TrafficError(f"must be an integer {limit}, got {value!r}", field=key)
        if not isinstance(self.tag, str):
            raise TrafficError(f"must be a string, got {self.tag!r}", field="tag")

    def to_json(self) -> str:
        values = (self.time_us, self.src, self.dst, self.size_bytes, self.qp, self.tclass, self.tag)
        return json.dumps(dict(zip(KEYS, values, strict=True)), separators=(",", ":"), allow_nan=False)


def _check_order(records: Iterable[TraceRecord], file: str | None = None) -> list[TraceRecord]:
    checked: list[TraceRecord] = []
    for i, record in enumerate(records, 1):
        if not isinstance(record, TraceRecord):
            raise TrafficError(f"record {i} is a {type(record).__name__}, not a TraceRecord", field="records")
        if checked and record.time_us < checked[-1].time_us:
            raise TrafficError(
                f"record {i} goes back in time ({record.time_us} after {checked[-1].time_us})",
                field="time_us",
                file=file,
            )
        checked.append(record)
    return checked


def write_trace(path: str | Path, records: Iterable[TraceRecord]) -> None:
    """Write records as a trace; refuses (before writing anything) what `read_trace` would refuse."""
    checked = _check_order(records, str(path))
    text = "".join(record.to_json() + "\n" for record in checked)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise TrafficError(f"cannot write: {exc.strerror or exc}", file=str(path)) from None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise TrafficError("key appears twice", field=key)
        out[key] = value
    return out


def _no_constants(name: str) -> float:
    raise TrafficError(f"{name} is not a number", field="json")


def _parse_line(text: str) -> TraceRecord:
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise TrafficError(f"not JSON ({exc.msg} at column {exc.colno})", field="json") from None
    except RecursionError:
        raise TrafficError("not a trace record (nested too deeply)", field="json") from None
    except TrafficError:
        raise
    except ValueError as exc:  # e.g. an integer of thousands of digits (Python's conversion limit)
        raise TrafficError(f"not a trace record ({exc})", field="json") from None
    if not isinstance(obj, dict):
        raise TrafficError(f"expected a JSON object, got {type(obj).__name__}", field="json")
    for key in obj:
        if key not in KEYS:
            raise TrafficError(f"unknown key (expected {', '.join(KEYS)})", field=key)
    for key in KEYS:
        if key not in obj:
            raise TrafficError("missing", field=key)
    return TraceRecord(
        obj["time_us"], obj["src"], obj["dst"], obj["bytes"], obj["qp"], obj["tclass"], obj["tag"]
    )


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Every record of a trace file, each line validated; the first problem is raised as FILE:LINE: field."""
    file = str(path)
    text = read_input_file(path, TrafficError, MAX_TRACE_BYTES)
    records: list[TraceRecord] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = _parse_line(line)
        except TrafficError as exc:
            raise exc.located(file, number) from None
        if records and record.time_us < records[-1].time_us:
            raise TrafficError(
                f"goes back in time ({record.time_us} after {records[-1].time_us}); records must be sorted",
                field="time_us",
                file=file,
                line=number,
            )
        records.append(record)
    return records


def _qp_numbers(pairs: Iterable[tuple[str, str]], qp_base: int) -> dict[tuple[str, str], int]:
    """One QP per (src, dst), numbered per sender in order of first use, as a NIC would allocate them."""
    if isinstance(qp_base, bool) or not isinstance(qp_base, int) or qp_base < 0:
        raise TrafficError(f"must be an integer >= 0, got {qp_base!r}", field="qp_base")
    numbers: dict[tuple[str, str], int] = {}
    used: dict[str, int] = {}
    for src, dst in pairs:
        if (src, dst) not in numbers:
            numbers[src, dst] = qp_base + used.get(src, 0)
            used[src] = used.get(src, 0) + 1
    return numbers


def from_plan(
    plan: Plan, step_time_us: float = 1000.0, qp_base: int = 1, tclass: int = ROCE_TCLASS
) -> list[TraceRecord]:
    """A plan as a trace: step k posted at k x step_time_us (a fixed step budget, not a barrier).

    Replaying with a fixed step time shows whether the fabric keeps up: if a step takes longer than its
    budget the next one piles on top, which is the congestion the trace is meant to provoke.
    """
    if isinstance(step_time_us, bool) or not isinstance(step_time_us, int | float) or not step_time_us >= 0:
        raise TrafficError(f"must be a number >= 0, got {step_time_us!r}", field="step_time_us")
    transfers = plan.transfers
    qps = _qp_numbers(((t.src, t.dst) for t in transfers), qp_base)
    return [
        TraceRecord(
            t.step * step_time_us,
            t.src,
            t.dst,
            t.size_bytes,
            qps[t.src, t.dst],
            tclass,
            f"{plan.kind}/s{t.step}/{t.tag}" if t.tag else f"{plan.kind}/s{t.step}",
        )
        for t in sorted(transfers, key=lambda t: t.step)
    ]


def from_kv(messages: Sequence[KvMessage], qp_base: int = 1, tclass: int = ROCE_TCLASS) -> list[TraceRecord]:
    """KV-cache WRITEs as a trace; the tag keeps request/layer/page so time-to-first-token can be rebuilt."""
    ordered = sorted(messages, key=lambda m: m.time_us)
    qps = _qp_numbers(((m.src, m.dst) for m in ordered), qp_base)
    return [
        TraceRecord(
            m.time_us,
            m.src,
            m.dst,
            m.size_bytes,
            qps[m.src, m.dst],
            tclass,
            f"kv/r{m.request}/L{m.layer}/p{m.page}",
        )
        for m in ordered
    ]


#: Page size of the shipped KV example (vLLM's default block size).
EXAMPLE_KV_PAGE_TOKENS = 16


def example_traces() -> dict[str, list[TraceRecord]]:
    """The traces shipped in scenarios/traces, rebuilt from their recipe (tests check they still match).

    Regenerate after a format change with
    ``python -c "from traffic.trace import write_example_traces as w; w('scenarios/traces')"``.
    The KV example (20,480 WRITEs, ~2.0 MB) is the largest that stays under 2 MB with 16-token pages.
    """
    ring = ring_allreduce([f"h{i}" for i in range(1, 17)], 64 * 2**20)
    kv = kv_transfer(
        model_shape("llama3-70b"),
        prompt_tokens=1024,
        prefill=["h1", "h2"],
        decode="h9",
        page_tokens=EXAMPLE_KV_PAGE_TOKENS,
        requests=4,
        arrival_rate_per_s=20.0,
        layer_time_us=200.0,
        seed=1,
    )
    return {"allreduce-ring-16.jsonl": from_plan(ring), "kv-llama3-70b.jsonl": from_kv(kv)}


def write_example_traces(directory: str | Path) -> list[Path]:
    """Write the shipped example traces into `directory` (created if missing)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, records in example_traces().items():
        write_trace(out / name, records)
        paths.append(out / name)
    return paths
