"""A policy comparison as files: `summary.json` ({"policies": {NAME: figures}}), `report.md` and `report.html`
(the same blocks, rendered by `emulation.report`), and three plots drawn on one scale for every policy:

* `utilisation.png`: switch-to-switch link directions × time, one panel per policy, colour = share of
  capacity on a common scale (0 to the busiest link of any policy), rows grouped by tier;
* `fct-cdf.png`: the distribution of flow completion times (probe flows and RoCE QPs) per policy;
* `bandwidth.png`: busbw of the collective per policy when the scenario has one, and aggregate goodput.

Each policy's complete run (every flow, event and sample) is kept as `POLICY/summary.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from emulation.report import Block, render_html, render_markdown, tier_groups


def write_comparison(summary: dict[str, Any], runs: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for policy, run in runs.items():
        (out_dir / policy).mkdir(parents=True, exist_ok=True)
        path = out_dir / policy / "summary.json"
        path.write_text(json.dumps(run, indent=2) + "\n")
        written.append(path)
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    plots = _plots(summary, runs, out_dir)
    blocks = _blocks(summary, [p.name for p in plots])
    (out_dir / "report.md").write_text(render_markdown(blocks))
    (out_dir / "report.html").write_text(render_html(blocks, f"Routing policies: {summary['scenario']}"))
    return [*written, path, *plots, out_dir / "report.md", out_dir / "report.html"]


# --- plots -----------------------------------------------------------------------------------------------


def _switch_rows(util: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(label, rows) for label, rows in tier_groups(util) if not label.startswith("host")]


def _plots(summary: dict[str, Any], runs: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib  # noqa: PLC0415 - heavy; only when writing results

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    policies = list(summary["policies"])
    files: list[Path] = []
    utils = {p: runs[p]["repetitions"][0]["utilisation"] for p in policies if runs[p]["repetitions"]}
    utils = {p: u for p, u in utils.items() if u["links"] and u["times_s"] and _switch_rows(u)}
    if utils:
        peak = max(
            0.01,
            *(
                max(u["links"][r])
                for u in utils.values()
                for _, rows in _switch_rows(u)
                for r in rows
                if u["links"][r]
            ),
        )
        first = next(iter(utils.values()))
        groups = _switch_rows(first)
        rows = [r for _, names in groups for r in names]
        fig, axes = plt.subplots(1, len(utils), sharey=True, squeeze=False,
                                 figsize=(3.2 * len(utils) + 1.5, 1.5 + 0.12 * len(rows)))  # fmt: skip
        image = None
        for ax, (policy, util) in zip(axes[0], utils.items(), strict=True):
            width = len(util["times_s"])
            matrix = [(util["links"].get(r, []) + [0.0] * width)[:width] for r in rows]
            image = ax.imshow(
                matrix, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=peak
            )
            step = max(1, width // 4)
            ax.set_xticks(range(0, width, step), [f"{util['times_s'][i]:.0f}" for i in range(0, width, step)])
            ax.set_xlabel("time (s)")
            ax.set_title(policy)
        starts, labels, at = [], [], 0
        for label, names in groups:
            starts.append(at)
            labels.append(label)
            at += len(names)
        axes[0, 0].set_yticks(starts, labels, fontsize=7)
        assert image is not None
        fig.colorbar(image, ax=axes[0, :], fraction=0.02, pad=0.01, label="share of capacity")
        fig.suptitle(
            "switch-to-switch link utilisation per policy (rows: link directions by tier)", fontsize=10
        )
        path = out_dir / "utilisation.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    fcts = {p: f["fct_s"] for p, f in summary["policies"].items() if f["fct_s"]}
    if fcts:
        fig, ax = plt.subplots(figsize=(7, 4))
        for policy, values in fcts.items():
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=policy)
        ax.set_xlabel("flow completion time (s)")
        ax.set_ylabel("fraction of flows")
        ax.set_title("flow completion time CDF")
        ax.grid(alpha=0.3)
        ax.legend()
        files.append(_save(fig, out_dir / "fct-cdf.png"))
    figures = summary["policies"]
    bars: list[tuple[str, str, list[float]]] = []
    if any(f["slowdown"] is not None for f in figures.values()):
        bars.append(
            ("job slowdown (vs non-blocking)", "slowdown", [f["slowdown"] or 0.0 for f in figures.values()])
        )
    if any(f["busbw_GBps"] is not None for f in figures.values()):
        bars.append(
            ("busbw (GB/s, emulated)", "busbw_GBps", [f["busbw_GBps"] or 0.0 for f in figures.values()])
        )
    bars.append(
        ("aggregate goodput (Mb/s)", "goodput", [f["aggregate_goodput_mbps"] for f in figures.values()])
    )
    fig, axes = plt.subplots(1, len(bars), squeeze=False, figsize=(4.5 * len(bars), 3.6))
    for ax, (title, _, values) in zip(axes[0], bars, strict=True):
        ax.bar(policies, values, color=[f"C{i}" for i in range(len(policies))])
        for i, value in enumerate(values):
            ax.annotate(f"{value:.3g}", (i, value), ha="center", va="bottom", fontsize=8)
        ax.set_title(title)
    files.append(_save(fig, out_dir / "bandwidth.png"))
    return files


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- the story -------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 3) -> Any:
    if value is None:
        return "–"
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    return value


def _blocks(summary: dict[str, Any], plots: list[str]) -> list[Block]:
    figures: dict[str, dict[str, Any]] = summary["policies"]
    overloaded = [p for p, f in figures.items() if f["emulator_overloaded"]]
    blocks: list[Block] = [
        ("h1", f"Routing policies on {summary['scenario']}"),
        (
            "p",
            f"Fabric: {summary['fabric']}; engine {summary['engine']}; "
            f"scale {summary['scale'] or 'unshaped'}; {summary['duration_s']} s × {summary['repetitions']}; "
            f"seed {summary['seed']}.  Every policy ran "
            "the same traffic (same flows, same source ports or the same spray sequence) and the same faults "
            "on a fresh controller and fabric.  Slowdown: the slowest job's completion over its completion "
            "on a non-blocking fabric with the same NICs (computed by the simulator for this scenario); "
            "senders are open-loop, so a flow that lost packets counts as if the rest had to come at the "
            "goodput it got.",
        ),
        (
            "p",
            "Emulator headroom: "
            + (
                f"OVERLOADED under {', '.join(overloaded)} — the emulator itself dropped packets; those "
                "figures describe the machine, not the fabric."
                if overloaded
                else "clean under every policy (the emulator dropped at most 0.1 % of the packets offered; "
                "drops, if any, were on the shaped links being modelled)."
            ),
        ),
        (
            "table",
            [
                "policy",
                "slowdown",
                "completion s",
                "goodput Mb/s",
                "FCT slowdown p50",
                "FCT slowdown p99",
                "busbw GB/s",
                "mean-rate ratio",
                "max util",
                "mean util",
                "idle links",
                "reordered",
                "lost",
                "loss %",
                "AR moves",
            ],
            [
                [
                    policy,
                    _fmt(f["slowdown"]),
                    _fmt(f["completion_s"]),
                    _fmt(f["aggregate_goodput_mbps"]),
                    _fmt(f["fct_slowdown_p50"]),
                    _fmt(f["fct_slowdown_p99"]),
                    _fmt(f["busbw_GBps"]),
                    _fmt(f["throughput_ratio"]),
                    _fmt(f["max_link_util"]),
                    _fmt(f["mean_link_util"]),
                    f"{f['idle_links']}/{f['links_measured']}",
                    f["reordered_packets"],
                    f["lost_packets"],
                    _fmt(f["loss_pct"]),
                    f["adaptive_moves"],
                ]
                for policy, f in figures.items()
            ],
        ),
        (
            "table",
            [
                "policy",
                "flows placed",
                "sprayed",
                "busiest link (flows)",
                "links with ≥ 2 flows",
                "emulator drops",
                "shaped-link drops",
                "offered pkt/s",
            ],
            [
                [
                    policy,
                    f["flows_per_link"]["placed_flows"],
                    f["flows_per_link"]["sprayed_flows"],
                    f["flows_per_link"]["max"],
                    f["flows_per_link"]["links_with_2plus_flows"],
                    sum(h["emulator_drops"] for h in f["headroom"]),
                    sum(h["modelled_congestion_drops"] for h in f["headroom"]),
                    _fmt(max((h.get("offered_pps", 0.0) for h in f["headroom"]), default=None)),
                ]
                for policy, f in figures.items()
            ],
        ),
    ]
    blocks += _cc_blocks(figures)
    flows = {p: f["goodput_mbps"]["per_flow"] for p, f in figures.items()}
    names = list(next(iter(flows.values()), {}))
    if names and len(names) <= 48:
        blocks += [
            ("h2", "Goodput per flow (Mb/s)"),
            ("table", ["flow", *flows], [[n, *(_fmt(flows[p].get(n)) for p in flows)] for n in names]),
        ]
    blocks.append(("h2", "Plots"))
    blocks += [("img", name) for name in plots]
    return blocks


def _cc_blocks(figures: dict[str, dict[str, Any]]) -> list[Block]:
    """Congestion control (`cc: dcqcn`): CNPs, cuts, how much was marked, and the deepest marked queue."""
    cc = {p: f.get("cc") or {} for p, f in figures.items()}
    if not any(c.get("cc") == "dcqcn" for c in cc.values()):
        return []
    head = [
        "policy",
        "CNPs sent",
        "CNPs received",
        "rate cuts",
        "marked at receivers",
        "marked at switches",
        "ports that marked",
        "peak marked queue (bytes)",
    ]
    rows = [
        [
            p,
            c.get("cnps_sent"),
            c.get("cnps_received"),
            c.get("rate_cuts"),
            _fmt(c.get("marked_fraction")),
            _fmt(c.get("switch_marked_fraction")),
            f"{c.get('ports_with_marks')}/{c.get('marking_ports')}",
            c.get("peak_queue_bytes"),
        ]
        for p, c in cc.items()
    ]
    text = (
        "ECN marking by a phantom queue at every shaped switch egress (DCQCN's Kmin/Kmax/Pmax profile), "
        "CNPs from the receivers, DCQCN rate control per QP at the senders (docs/congestion.md)."
    )
    return [("h2", "Congestion control: DCQCN"), ("p", text), ("table", head, rows)]


__all__ = ["write_comparison"]
