"""Results on disk: summary.json, report.md and plots, written whole or not at all.

Everything goes to a temporary folder beside the target first and is renamed into place at the end, so an
interrupted or failed run never leaves half a results folder (an existing one is replaced only then).
Plots use matplotlib's Agg backend: `fct-cdf.png` (flow completion times, one curve per policy),
`busbw.png` (bus bandwidth and throughput ratio per policy) and `utilisation.png` (the hottest
switch-to-switch links over time, one panel per policy).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flowsim.metrics import FIELDS, compare, comparison_markdown, fct_cdf, hottest_links
from flowsim.run import Outcome


def write_report(
    outcome: Outcome, out_dir: Path, emulation: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Write a simulation's results into the folder `out_dir` (which the caller provides: the CLI gives a
    fresh one that replaces the results folder at the end); with `emulation` (an emulator `compare`
    summary), the comparison too."""
    summary = outcome.summary()
    if emulation is not None:
        summary["emulation_comparison"] = compare(summary, emulation)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(_clean(summary), indent=2) + "\n")
    if emulation is not None:
        comparison = _clean(summary["emulation_comparison"])
        (out_dir / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
    plots = _plots(outcome, out_dir)
    (out_dir / "report.md").write_text(_markdown(summary, plots))
    return summary


def _clean(value: Any) -> Any:
    """JSON without NaN/inf (null instead)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _plt() -> Any:
    import matplotlib  # noqa: PLC0415 - heavy; only when writing results

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path.name


def _plots(outcome: Outcome, out: Path) -> list[str]:
    plt = _plt()
    names = list(outcome.runs)
    files = []
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for name in names:
        x, y = fct_cdf(outcome.runs[name].result)
        if x.size:
            ax.step(x, y, where="post", label=name)
            drawn = True
    if drawn:
        ax.set_xscale("log")
    ax.set_xlabel("flow completion time (s)")
    ax.set_ylabel("fraction of flows")
    ax.set_title("FCT CDF per policy")
    if drawn:
        ax.legend()
    files.append(_save(fig, out / "fct-cdf.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    slowdown = [outcome.runs[n].summary["slowdown"] or 0.0 for n in names]
    busbw = [outcome.runs[n].summary["busbw_GBps"] or 0.0 for n in names]
    left.bar(names, slowdown, color="tab:red")
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_ylabel("job slowdown")
    left.set_title("completion / non-blocking completion")
    right.bar(names, busbw, color="tab:blue")
    right.set_ylabel("busbw (GB/s)")
    right.set_title("bus bandwidth (nccl-tests)")
    files.append(_save(fig, out / "busbw.png"))

    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.2 + 2.0 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        links, matrix, bin_s = hottest_links(outcome.runs[name].result, outcome.network, count=16)
        if matrix.size:
            image = ax.imshow(
                matrix,
                aspect="auto",
                interpolation="nearest",
                cmap="viridis",
                vmin=0.0,
                vmax=1.0,
                extent=(0, matrix.shape[1] * bin_s, len(links) - 0.5, -0.5),
            )
            ax.set_yticks(range(len(links)), links, fontsize=5)
            fig.colorbar(image, ax=ax, fraction=0.03)
        ax.set_title(f"{name}: hottest links, utilisation over time", fontsize=9)
        ax.set_xlabel("time (s)", fontsize=8)
    files.append(_save(fig, out / "utilisation.png"))
    return files


def _markdown(summary: Mapping[str, Any], plots: list[str]) -> str:
    lines = [
        f"# Flow-level simulation: {summary['workload']}",
        "",
        f"Fabric {summary['fabric']}; routing engine {summary['engine']}; seed {summary['seed']}; "
        f"adaptive parameters {summary['policy_params']}; link speeds {summary['link_speeds']}.",
        "",
        "Jobs lead: `slowdown` is the slowest job's completion over its completion on a non-blocking fabric "
        "with the same NICs; `throughput_ratio` is a mean-rate ratio (short flows finishing early lift it), "
        "kept for comparison with older results.  busbw in GB/s as nccl-tests prints it.",
        "",
        "| policy | " + " | ".join(FIELDS) + " |",
        "| --- | " + " | ".join("---:" for _ in FIELDS) + " |",
    ]
    fmt: Callable[[Any], str] = lambda v: f"{v:.4g}" if isinstance(v, int | float) else "-"  # noqa: E731
    for name, row in summary["policies"].items():
        lines.append(f"| {name} | " + " | ".join(fmt(row[f]) for f in FIELDS) + " |")
    if "cc" in summary:
        lines += _cc_table(summary, fmt)
    lines += [
        "",
        "Per policy and job: completion against the non-blocking fabric's, busbw (collectives).",
        "",
    ]
    for name, row in summary["policies"].items():
        details = row["details"]
        wide = details.get("wide_sets")
        note = (
            f"; {wide} sets wider than the controller's 16 slots (modelled as one slot per port)"
            if wide
            else ""
        )
        lines.append(
            f"* **{name}**: engine {details['engine']}; unfinished flows {details['unfinished_flows']}{note}"
        )
        for job in row["jobs"]:
            extra = ""
            if "busbw_GBps" in job:
                extra = (f" — {job['kind']} over {job['ranks']} ranks, {job['size_bytes']} B: algbw "
                         f"{fmt(job['algbw_GBps'])} GB/s, busbw {fmt(job['busbw_GBps'])} GB/s")  # fmt: skip
            ideal = fmt(job["ideal_completion_s"])
            lines.append(f"  * {job['name']}: {fmt(job['completion_s'])} s (non-blocking {ideal} s, slowdown "
                         f"{fmt(job['slowdown'])}){extra}")  # fmt: skip
        buckets = details.get("fct_slowdown_by_size") or {}
        if buckets:
            shown = "; ".join(f"{k}: p50 {fmt(v['p50'])}, p99 {fmt(v['p99'])} ({fmt(v['flows'])} flows)"
                              for k, v in buckets.items())  # fmt: skip
            lines.append(f"  * FCT slowdown by size — {shown}")
        skipped = sum(g.get("skipped_steps", 0) for g in details["groups"])
        if skipped:
            lines.append(f"  * {skipped} lockstep steps extrapolated")
    if "emulation_comparison" in summary:
        lines += ["", comparison_markdown(summary["emulation_comparison"])]
    lines.append("")
    lines += [f"![{p}]({p})\n" for p in plots]
    return "\n".join(lines) + "\n"


def _cc_table(summary: Mapping[str, Any], fmt: Callable[[Any], str]) -> list[str]:
    """Under `cc: dcqcn`: what the controllers and the switch queues did, per policy."""
    context = summary["cc"]
    lines = [
        "",
        f"Congestion control: **{context['cc']}** ({context['model']}; time step {fmt(context['dt_s'])} s). "
        "Loss is what switch buffers dropped of what was sent; the bottleneck is the link with the highest "
        "queue, its utilisation counts bytes on the wire.",
        "",
        "| policy | CNPs | rate cuts | marked fraction | loss % | peak queue (bytes) | buffer (bytes) "
        "| bottleneck | utilisation | Jain (incast senders) |",
        "| --- | " + " | ".join(["---:"] * 9) + " |",
    ]
    for name, row in summary["policies"].items():
        block = row.get("cc") or {}
        neck = block.get("bottleneck") or {}
        lines.append(
            f"| {name} | {block.get('cnps_sent', '-')} | {block.get('rate_cuts', '-')} "
            f"| {fmt(block.get('marked_fraction'))} | {fmt(block.get('loss_pct'))} "
            f"| {fmt(block.get('peak_queue_bytes'))} | {fmt(block.get('buffer_bytes'))} "
            f"| {neck.get('link', '-')} | {fmt(neck.get('utilisation'))} | {fmt(block.get('jain_senders'))} |"
        )
    return lines


__all__ = ["write_report"]
