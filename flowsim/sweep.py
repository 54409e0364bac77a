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

import csv
import io
import json
import os
from collections.abc import Callable, Sequence
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
    seeds: Annotated[list[int], Field(min_length=1)] = [0]
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


def run_local(
    sweep: Sweep, workers: int | None = None, progress: Progress | None = None
) -> list[dict[str, Any]]:
    """The points on a local process pool (default: one process per core)."""
    n = max(1, min(workers or os.cpu_count() or 1, len(sweep.tasks)))
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(run_task, task) for task in sweep.tasks]
        for done, future in enumerate(as_completed(futures), 1):
            rows += future.result()
            if progress is not None:
                progress(done, len(futures), "local")
    return sort_rows(rows)


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
    sweep: Sweep, address: str, progress: Progress | None = None, timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """The points on a Dask distributed cluster (workers need fabriclab importable)."""
    from distributed import as_completed as dask_completed  # noqa: PLC0415

    client = connect_dask(address, timeout_s)
    try:
        futures = client.map(run_task, list(sweep.tasks), pure=False)
        rows: list[dict[str, Any]] = []
        for done, future in enumerate(dask_completed(futures), 1):  # type: ignore[no-untyped-call]
            rows += future.result()
            if progress is not None:
                progress(done, len(futures), "dask")
        return sort_rows(rows)
    finally:
        client.close()


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
    """results.json, results.csv, report.md and throughput/busbw-vs-size plots, written atomically."""
    from flowsim.report import atomic_dir  # noqa: PLC0415

    with atomic_dir(out_dir) as tmp:
        (tmp / "results.json").write_text(
            json.dumps(
                {"sweep": sweep.spec.name, "points": sweep.points, "executor": executor, "rows": list(rows)},
                indent=2,
            )
            + "\n"
        )
        (tmp / "results.csv").write_text(table_csv(rows))
        plots = _plots(rows, tmp)
        (tmp / "report.md").write_text(_markdown(sweep, rows, plots, executor))


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
