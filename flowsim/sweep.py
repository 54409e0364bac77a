"""Sweeps: a grid of policy x workload x fabric size x seed, each point a simulation, run on local
processes or on a Dask distributed cluster, collected into one table and plot.

```yaml
fabriclab: 1
name: policies-vs-size
policies: [static, ecmp, spray, adaptive]
workloads: [permutation, alltoall]       # the ad hoc workloads of `fabriclab sim --traffic`
fabrics:                                 # generator blocks, as in topology files
  - {kind: fat-tree, k: 8}
  - {kind: leaf-spine, leaves: 32, spines: 32, hosts_per_leaf: 32}
seeds: [1, 2]
size: 64MiB                              # per flow (patterns) or per rank (collectives)
engine: ftree
controller: {interval_ms: 100, threshold: 0.7, hysteresis: 0.1}
max_points: 500                          # refuse grids larger than this
```

The unit of work is one (fabric, workload, seed) with all its policies, so the non-blocking reference is
computed once per unit; every point is a pure function of its parameters, so the rows are identical
whichever executor runs them, and they are sorted the same way before they are written.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Callable, MutableMapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.sm.engines import default_registry
from controller.sm.policies import PolicyError, PolicyParams, default_policies
from flowsim.engine import SimConfig
from flowsim.metrics import FIELDS
from flowsim.network import Network, SimInputError
from flowsim.run import simulate
from flowsim.workload import adhoc
from topologies.errors import InputError, read_input_file
from topologies.generators import generate
from topologies.model import Fabric
from topologies.schema import Seed
from topologies.yamlio import AllowedKeys, PathItem, load_document, validate
from traffic.errors import TrafficError, parse_size

#: Refuse grids with more points than this unless the file or the CLI says otherwise.
DEFAULT_MAX_POINTS = 500
Progress = Callable[[int, int, str], None]


class SweepError(InputError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PolicyKnobs(_Strict):
    interval_ms: int = 100
    threshold: float = 0.7
    hysteresis: float = 0.1


class SweepSpec(_Strict):
    fabriclab: Literal[1]
    name: str
    description: str | None = None
    policies: Annotated[list[str], Field(min_length=1)]
    workloads: Annotated[list[str], Field(min_length=1)]
    fabrics: Annotated[list[dict[str, int | float | str]], Field(min_length=1)]
    seeds: Annotated[list[Seed], Field(min_length=1, max_length=10_000)] = [0]
    size: str | int = "64MiB"
    engine: str = "ftree"
    controller: PolicyKnobs = PolicyKnobs()
    max_points: Annotated[int, Field(ge=1, le=1_000_000)] = DEFAULT_MAX_POINTS


class _Keys(AllowedKeys):
    def for_path(self, path: Sequence[PathItem]) -> Sequence[str]:
        if not path:
            return list(SweepSpec.model_fields)
        if path == ("controller",):
            return list(PolicyKnobs.model_fields)
        return ()


@dataclass(frozen=True)
class Task:
    """One (fabric, workload, seed) with all its policies: what a worker runs."""

    index: int
    fabric: tuple[tuple[str, Any], ...]
    workload: str
    seed: int
    policies: tuple[str, ...]
    size_bytes: int
    engine: str
    params: tuple[int, float, float]


@dataclass(frozen=True)
class Sweep:
    spec: SweepSpec
    file: str
    tasks: tuple[Task, ...]

    @property
    def points(self) -> int:
        return sum(len(t.policies) for t in self.tasks)


def load_sweep(path: str | Path, max_points: int | None = None) -> Sweep:
    """Read, validate (layers, located errors) and expand a sweep file; refuse it over the cap."""
    file = str(path)
    document = load_document(read_input_file(path, SweepError), file)
    if not isinstance(document.data, dict):
        raise SweepError("a sweep file is a YAML mapping (name:, policies:, ...)", file=file, line=1)
    spec = validate(SweepSpec, document, _Keys())
    where = document.error
    cap = max_points if max_points is not None else spec.max_points
    points = len(spec.policies) * len(spec.workloads) * len(spec.fabrics) * len(spec.seeds)
    if points > cap:
        raise SweepError(
            f"the grid has {points} points ({len(spec.policies)} policies x {len(spec.workloads)} "
            f"workloads x {len(spec.fabrics)} fabrics x {len(spec.seeds)} seeds), more than the cap of {cap}",
            file=file,
            line=document.line_of(["max_points"]),
            field="max_points",
        )
    try:
        default_policies().parse_list(",".join(spec.policies))
        PolicyParams(
            spec.controller.interval_ms, spec.controller.threshold, spec.controller.hysteresis
        ).validate()
    except PolicyError as exc:
        section: list[PathItem] = (
            ["policies"] if exc.field == "policies" else ["controller", exc.field or "policy"]
        )
        raise where(section, exc.message) from None
    if spec.engine not in default_registry():
        raise where(
            ["engine"], f"unknown routing engine {spec.engine!r} ({', '.join(default_registry().names())})"
        )
    try:
        size = parse_size(spec.size)
    except TrafficError as exc:
        raise where(["size"], exc.message) from None
    fabrics = []
    for i, block in enumerate(spec.fabrics):
        params = dict(block)
        kind = params.pop("kind", None)
        if not isinstance(kind, str):
            raise where(["fabrics", i], "needs `kind:` (fat-tree, leaf-spine, rail)")
        try:
            fabric = _fabric(kind, tuple(sorted(params.items())))
        except InputError as exc:
            raise where(
                ["fabrics", i, (exc.field or "kind").removeprefix("generator.")], exc.message
            ) from None
        for j, workload in enumerate(spec.workloads):
            try:
                adhoc(workload, _network(kind, tuple(sorted(params.items()))), size, 0)
            except SimInputError as exc:
                raise where(["workloads", j], f"{exc.message} (fabric {fabric.name})") from None
        fabrics.append((("kind", kind), *sorted(params.items())))
    knobs = (spec.controller.interval_ms, spec.controller.threshold, spec.controller.hysteresis)
    combos = [
        (fabric, workload, seed) for fabric in fabrics for workload in spec.workloads for seed in spec.seeds
    ]
    tasks = tuple(
        Task(i, fabric, workload, seed, tuple(spec.policies), size, spec.engine, knobs)
        for i, (fabric, workload, seed) in enumerate(combos)
    )
    return Sweep(spec, file, tasks)


@lru_cache(maxsize=8)
def _fabric(kind: str, params: tuple[tuple[str, Any], ...]) -> Fabric:
    return generate(kind, **dict(params))


@lru_cache(maxsize=4)
def _network(kind: str, params: tuple[tuple[str, Any], ...]) -> Network:
    return Network.build(_fabric(kind, params))


def run_task(task: Task) -> list[dict[str, Any]]:
    """One unit of work (runs in a worker process or on a Dask worker): a row per policy."""
    kind = str(dict(task.fabric)["kind"])
    params = tuple((k, v) for k, v in task.fabric if k != "kind")
    network = _network(kind, params)
    workload = adhoc(task.workload, network, task.size_bytes, task.seed)
    config = SimConfig(params=PolicyParams(*task.params), engine=task.engine, seed=task.seed)
    outcome = simulate(network, workload, list(task.policies), config)
    rows = []
    for policy, run in outcome.runs.items():
        row: dict[str, Any] = {
            "task": task.index,
            "fabric": network.fabric.name,
            "hosts": network.n_hosts,
            "workload": task.workload,
            "seed": task.seed,
            "policy": policy,
        }
        row.update({f: run.summary[f] for f in FIELDS})
        row["events"] = int(run.result.stats["events"])
        rows.append(row)
    return rows


#: Finished units by task index: what a run resumes from and reports into.
Done = MutableMapping[int, list[dict[str, Any]]]


def sweep_digest(sweep: Sweep) -> str:
    """What a finished unit belongs to: rows kept from an interrupted run are reused only by the same grid."""
    text = json.dumps([dataclasses.asdict(t) for t in sweep.tasks], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _rows(sweep: Sweep, done: Done) -> list[dict[str, Any]]:
    return sort_rows([row for task in sweep.tasks for row in done.get(task.index, [])])


def run_local(
    sweep: Sweep, workers: int | None = None, progress: Progress | None = None, done: Done | None = None
) -> list[dict[str, Any]]:
    """The points on a local process pool (default: one process per core).  Units already in `done` are
    not run again; each finished unit is added to it as it finishes (so an interrupted run keeps them)."""
    done = {} if done is None else done
    todo = [task for task in sweep.tasks if task.index not in done]
    n = max(1, min(workers or os.cpu_count() or 1, len(todo) or 1))
    with ProcessPoolExecutor(max_workers=n) as pool:
        futures = {pool.submit(run_task, task): task.index for task in todo}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            if progress is not None:
                progress(len(done), len(sweep.tasks), "local")
    return _rows(sweep, done)


def connect_dask(address: str, timeout_s: float = 10.0) -> Any:
    """A client of the Dask scheduler at `address`, or a SweepError saying it does not answer."""
    try:
        from distributed import Client  # noqa: PLC0415 - only sweeps on a cluster need Dask
    except ImportError:  # pragma: no cover - dask[distributed] is a dependency
        raise SweepError("--dask needs dask[distributed] installed", field="dask") from None
    try:
        return Client(address, timeout=f"{timeout_s}s")  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError, ValueError) as exc:
        raise SweepError(
            f"no Dask scheduler answers at {address} ({type(exc).__name__}: {exc})", field="dask"
        ) from None


def run_dask(
    sweep: Sweep,
    address: str,
    progress: Progress | None = None,
    timeout_s: float = 10.0,
    done: Done | None = None,
) -> list[dict[str, Any]]:
    """The points on a Dask distributed cluster (workers need fabriclab importable).

    Bounded: with no live worker for `timeout_s` (none started, or the last one gone) or the scheduler
    gone, a SweepError says so; the units finished by then are in `done`, which a rerun resumes from."""
    from distributed import wait  # noqa: PLC0415

    done = {} if done is None else done
    client = connect_dask(address, timeout_s)
    quiet = _quiet_client_logs()  # a lost scheduler is one SweepError here, not pages of client tracebacks
    try:
        todo = [task for task in sweep.tasks if task.index not in done]
        futures = {f: t.index for f, t in zip(client.map(run_task, todo, pure=False), todo, strict=True)}
        pending = set(futures)
        without_workers = None
        while pending:
            try:
                finished, pending = wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")  # type: ignore[no-untyped-call]
            except TimeoutError:  # nothing finished in this half second
                finished = set()
            except Exception as exc:  # the scheduler gone: the client cancels everything it had sent
                raise SweepError(
                    f"lost the Dask scheduler at {address} ({type(exc).__name__}); {len(done)} of "
                    f"{len(sweep.tasks)} units finished",
                    field="dask",
                ) from None
            for future in finished:
                try:
                    done[futures[future]] = future.result()
                except Exception as exc:  # a worker that died running it (KilledWorker) or the task's error
                    raise SweepError(
                        f"unit {futures[future]} failed on the cluster ({type(exc).__name__}: {exc})",
                        field="dask",
                    ) from None
                if progress is not None:
                    progress(len(done), len(sweep.tasks), "dask")
            if finished or not pending:
                without_workers = None
                continue
            workers = _live_workers(client, timeout_s)
            now = time.monotonic()
            if workers:
                without_workers = None
            elif without_workers is None:
                without_workers = now
            elif now - without_workers > timeout_s:
                why = "no live worker" if workers == 0 else "the scheduler does not answer"
                raise SweepError(
                    f"{why} at {address} for {timeout_s:g} s; {len(done)} of {len(sweep.tasks)} units "
                    "finished",
                    field="dask",
                )
        return _rows(sweep, done)
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=2)
        quiet.close()


def _quiet_client_logs() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for name in ("distributed.client", "distributed.utils", "distributed.core"):
        log = logging.getLogger(name)
        stack.callback(log.setLevel, log.level)
        log.setLevel(logging.CRITICAL)
    return stack


def _live_workers(client: Any, timeout_s: float) -> int | None:
    """Workers the scheduler knows now, or None if it does not answer within `timeout_s`."""
    if client.status != "running":
        return None
    try:
        info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout_s)
    except Exception:  # the scheduler gone or not answering: the caller's clock decides
        return None
    return len(info.get("workers", {}))


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["task"], r["policy"]))


def table_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def write_sweep(sweep: Sweep, rows: Sequence[dict[str, Any]], out_dir: Path, executor: str) -> None:
    """results.json, results.csv, report.md and throughput/busbw-vs-size plots, into the folder `out_dir`
    (the CLI gives a fresh one that replaces the results folder at the end)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(
        json.dumps(
            {"sweep": sweep.spec.name, "points": sweep.points, "executor": executor, "rows": list(rows)},
            indent=2,
        )
        + "\n"
    )
    (out_dir / "results.csv").write_text(table_csv(rows))
    plots = _plots(rows, out_dir)
    (out_dir / "report.md").write_text(_markdown(sweep, rows, plots, executor))


def _plots(rows: Sequence[dict[str, Any]], out: Path) -> list[str]:
    from flowsim.report import _plt, _save  # noqa: PLC0415

    plt = _plt()
    workloads = sorted({r["workload"] for r in rows})
    files = []
    for field, label, name in (
        ("slowdown", "job slowdown (vs non-blocking)", "slowdown-vs-size.png"),
        ("throughput_ratio", "mean-rate ratio", "throughput-vs-size.png"),
        ("busbw_GBps", "busbw (GB/s)", "busbw-vs-size.png"),
    ):
        fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
        for ax, workload in zip(axes[0], workloads, strict=True):
            for policy in sorted({r["policy"] for r in rows}):
                pts: dict[int, list[float]] = {}
                for r in rows:
                    if r["workload"] == workload and r["policy"] == policy and r[field] is not None:
                        pts.setdefault(r["hosts"], []).append(float(r[field]))
                xs = sorted(pts)
                ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], marker="o", label=policy)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("hosts")
            ax.set_ylabel(label)
            ax.set_title(workload, fontsize=9)
        axes[0][0].legend(fontsize=7)
        files.append(_save(fig, out / name))
    return files


def _markdown(sweep: Sweep, rows: Sequence[dict[str, Any]], plots: list[str], executor: str) -> str:
    head = ["fabric", "hosts", "workload", "seed", "policy", *FIELDS]

    def fmt(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = [
        f"# Sweep `{sweep.spec.name}`",
        "",
        f"{sweep.points} points on {executor}.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    lines += ["| " + " | ".join(fmt(r[h]) for h in head) + " |" for r in rows]
    lines += [""] + [f"![{p}]({p})\n" for p in plots]
    return "\n".join(lines) + "\n"


__all__ = [
    "DEFAULT_MAX_POINTS",
    "Sweep",
    "SweepError",
    "SweepSpec",
    "Task",
    "connect_dask",
    "load_sweep",
    "run_dask",
    "run_local",
    "run_task",
    "sort_rows",
    "write_sweep",
]
