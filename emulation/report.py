"""Scenario results as files: summary.json (all figures), report.md and report.html (the story), PNG plots.

Plots are drawn per repetition with matplotlib's Agg backend (no display needed), and only what has data
is drawn — the reports link exactly the files written:

* `utilisation-repN.png`: link directions × time, colour = share of capacity, one panel per tier and
  direction (host → leaf, leaf → aggregation, ...), rows labelled by sending switch, so a k=8 fat-tree
  (640 directions) stays readable;
* `utilisation-tiers-repN.png`: per tier and direction, the median, 95th percentile and busiest link;
* `throughput-repN.png`: received packets per second of every flow, fault times marked;
* `loss-repN.png`: loss window per fault and flow (scenarios with faults).

Both reports are rendered from one list of blocks, so they say the same thing.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

Block = tuple[Any, ...]


def write_outputs(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "summary.json"]
    written[0].write_text(json.dumps(summary, indent=2) + "\n")
    plots: dict[int, list[str]] = {}
    for rep in summary["repetitions"]:
        files = _plots(rep, out_dir)
        plots[rep["repetition"]] = [f.name for f in files]
        written += files
    blocks = _blocks(summary, plots)
    report = out_dir / "report.md"
    report.write_text(render_markdown(blocks))
    page = out_dir / "report.html"
    page.write_text(render_html(blocks, f"Scenario {summary['scenario']}"))
    return [*written, report, page]


# --- plots -------------------------------------------------------------------------------------------------


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def tier_groups(util: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Rows of the utilisation matrix grouped by tier and direction, in the runner's order (bottom up)."""
    labels: dict[str, str] = util.get("groups") or {}
    order: list[str] = util.get("group_order") or sorted(set(labels.values()))
    groups: dict[str, list[str]] = {label: [] for label in order}
    for name in util["links"]:
        groups.setdefault(labels.get(name, "links"), []).append(name)
    return [(label, sorted(rows, key=_natural)) for label, rows in groups.items() if rows]


def _matrix(util: dict[str, Any], rows: list[str]) -> list[list[float]]:
    width = len(util["times_s"])
    return [(util["links"][name] + [0.0] * width)[:width] for name in rows]


def _plots(rep: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib  # noqa: PLC0415 - heavy; only when writing results

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    n = rep["repetition"]
    files = []
    util = rep["utilisation"]
    if util["links"] and util["times_s"]:
        files.append(_tier_heatmap(util, out_dir / f"utilisation-rep{n}.png"))
        files.append(_tier_lines(util, out_dir / f"utilisation-tiers-rep{n}.png"))
    if rep["flows"]:
        fig, ax = plt.subplots(figsize=(10, 4))
        t0 = min(
            (f["throughput"]["packets"][0][0] for f in rep["flows"] if f["throughput"]["packets"]), default=0
        )
        bucket = rep["flows"][0]["throughput"]["bucket_s"]
        for flow in rep["flows"]:
            points = flow["throughput"]["packets"]
            ax.plot(
                [(b - t0) * bucket for b, _ in points], [c / bucket for _, c in points], label=flow["name"]
            )
        for fault in rep["faults"]:
            ax.axvline(fault["wall"] - t0 * bucket, color="red", linestyle="--", linewidth=1)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("received packets/s")
        ax.set_title("per-flow throughput (red: faults)")
        if len(rep["flows"]) <= 12:
            ax.legend(fontsize=7)
        files.append(_save(fig, out_dir / f"throughput-rep{n}.png"))
    windows = [w for w in rep["loss_windows"] if w["lost_packets"] > 0]
    if rep["faults"]:
        fig, ax = plt.subplots(figsize=(10, 3.5))
        labels = [f"{w['flow']}\n{w['fault']}" for w in windows] or ["no loss"]
        ax.bar(range(len(labels)), [w["loss_window_ms"] for w in windows] or [0.0])
        ax.set_xticks(range(len(labels)), labels, fontsize=6)
        ax.set_ylabel("loss window (ms)")
        ax.set_title("packets lost around each fault, as time at the flow's rate")
        files.append(_save(fig, out_dir / f"loss-rep{n}.png"))
    return files


def _tier_heatmap(util: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = tier_groups(util)
    times = util["times_s"]
    peak = max(0.01, *(max(v) for v in util["links"].values() if v))
    heights = [0.6 + 0.014 * len(rows) for _, rows in groups]
    fig, axes = plt.subplots(
        len(groups),
        1,
        sharex=True,
        squeeze=False,
        figsize=(11, 1.2 + sum(heights)),
        gridspec_kw={"height_ratios": heights},
    )
    image = None
    for ax, (label, rows) in zip(axes[:, 0], groups, strict=True):
        image = ax.imshow(
            _matrix(util, rows), aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=peak
        )
        senders = [row.split(":", 1)[0] for row in rows]
        starts = [i for i, s in enumerate(senders) if i == 0 or s != senders[i - 1]]
        step = -(-len(starts) // 16)  # at most 16 labels a panel
        shown = starts[::step]
        ax.set_yticks(shown, [senders[i] for i in shown], fontsize=6)
        ax.set_ylabel(f"{label}\n({len(rows)})", rotation=0, ha="right", va="center", fontsize=8)
    step = max(1, len(times) // 10)
    axes[-1, 0].set_xticks(
        range(0, len(times), step), [f"{times[i]:.1f}" for i in range(0, len(times), step)]
    )
    axes[-1, 0].set_xlabel("time (s)")
    axes[0, 0].set_title("link utilisation by tier and direction (share of capacity; rows by sending switch)")
    assert image is not None
    fig.colorbar(image, ax=axes[:, 0], fraction=0.025, pad=0.01)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _tier_lines(util: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    groups = tier_groups(util)
    times = util["times_s"]
    fig, axes = plt.subplots(
        1, len(groups), sharey=True, squeeze=False, figsize=(min(16, 3.2 * len(groups)), 3)
    )
    for ax, (label, rows) in zip(axes[0], groups, strict=True):
        matrix = np.array(_matrix(util, rows))
        ax.fill_between(
            times,
            np.percentile(matrix, 50, axis=0),
            matrix.max(axis=0),
            alpha=0.25,
            label="median to busiest",
        )
        ax.plot(times, np.percentile(matrix, 95, axis=0), label="95th percentile")
        ax.plot(times, matrix.max(axis=0), linewidth=0.8, label="busiest")
        ax.set_title(f"{label} ({len(rows)})", fontsize=9)
        ax.set_xlabel("time (s)")
    axes[0, 0].set_ylabel("share of capacity")
    axes[0, -1].legend(fontsize=7)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)
    return path


def _isolation_line(iso: dict[str, Any]) -> str:
    """One sentence: the partitions' drops (per partition protected) and the reachability check."""
    per = (
        ", ".join(f"{k} {v['name']} {v['packets']}" for k, v in iso["dropped_by_partition"].items()) or "none"
    )
    wrong = iso["denied_but_delivered"] + iso["permitted_but_undelivered"]
    check = (
        "all as the partitions say" if not wrong else f"CONTRADICTING the partitions: {', '.join(wrong[:10])}"
    )
    return (
        f"Isolation: {iso['denied_pairs']} host pairs denied by the partitions; all-pairs check {check}; "
        f"packets dropped at the ingress edge during traffic: {iso['dropped_packets']['denied']} denied "
        f"(by partition protected: {per}), {iso['dropped_packets']['forged_or_unknown']} forged or unknown."
    )


def _overload_line(summary: dict[str, Any]) -> str:
    if summary.get("emulator_overloaded"):
        reps = ", ".join(str(r) for r in summary.get("overloaded_repetitions", []))
        return (
            f"The emulator was overloaded (repetition {reps}): it dropped or delayed packets itself, so "
            "loss and delay below are not the modelled fabric's alone (see Headroom)."
        )
    return "The emulator kept up: no drops or delays of its own beyond 0.1 % (see Headroom)."


def _headroom_line(h: dict[str, Any]) -> str:
    by_cause = h["emulator_drops_by_cause"].items()
    causes = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in by_cause if v)
    ratio = h.get("offered_vs_capacity")
    return (
        f"Headroom: emulator overloaded {'yes' if h['emulator_overloaded'] else 'no'}"
        + (f" ({h['why']})" if h["why"] else "")
        + f"; emulator drops {h['emulator_drops']} of {h['offered_packets']} packets "
        f"({h['emulator_drop_pct']} %{'; ' + causes if causes else ''}), modelled congestion drops "
        f"{h['modelled_congestion_drops']}, drops on cut links {h['fault_drops']}, probe delay p99 "
        f"{h['probe_latency_p99_ms']} ms"
        + (f"; offered {ratio}× the calibrated capacity" if ratio is not None else "")
    )


# --- the story, once ---------------------------------------------------------------------------------------


def _blocks(summary: dict[str, Any], plots: dict[int, list[str]]) -> list[Block]:
    blocks: list[Block] = [
        ("h1", f"Scenario {summary['scenario']}"),
        (
            "p",
            f"Fabric: {summary['fabric']}; controller {summary['controller']}; "
            f"scale {summary['scale'] or 'unshaped'}; {summary['duration_s']} s; seed {summary['seed']}.",
        ),
        ("p", _overload_line(summary)),
        *(("p", f"warning: {w}") for w in summary.get("warnings", [])),
    ]
    for rep in summary["repetitions"]:
        n = rep["repetition"]
        pairs = rep["all_pairs"]
        t = rep["timings_s"]
        blocks += [
            ("h2", f"Repetition {n}"),
            (
                "p",
                f"Bring-up: Mininet built {t.get('mininet_build_s', 0):.1f} s, "
                f"started {t.get('mininet_start_s', 0):.1f} s, "
                f"tables installed {t.get('tables_installed_s', 0):.1f} s, all pairs verified "
                f"{t.get('all_pairs_verified_s', 0):.1f} s "
                f"({pairs['reachable']}/{pairs['pairs']} reachable).",
            ),
        ]
        if rep.get("isolation"):
            blocks.append(("p", _isolation_line(rep["isolation"])))
        if rep["flows"]:
            blocks.append(
                (
                    "table",
                    ["flow", "path", "sent", "received", "lost", "loss %", "out of order", "goodput Mb/s"],
                    [
                        [
                            f"{f['name']} {f['src']}→{f['dst']}",
                            ("code", f["path"]),
                            f["sent"],
                            f["received"],
                            f["lost"],
                            f["loss_pct"],
                            f["out_of_order"],
                            f["goodput_mbps"],
                        ]
                        for f in rep["flows"]
                    ],
                )
            )
        if rep.get("qos_classes"):
            from emulation.qosreport import class_block  # noqa: PLC0415

            blocks.append(("p", "QoS classes (what each traffic class got; docs/qos.md):"))
            blocks.append(class_block(rep["qos_classes"]))
        if rep.get("collectives"):
            blocks.append(
                (
                    "table",
                    [
                        "RoCE collective",
                        "ranks",
                        "size",
                        "QPs",
                        "packets",
                        "lost",
                        "out of order",
                        "bad ICRC",
                        "s",
                        "algbw GB/s",
                        "busbw GB/s",
                    ],
                    [
                        [
                            c["collective"],
                            c["ranks"],
                            c["size_bytes"],
                            c["qps"],
                            f"{c['packets_received']}/{c['packets_expected']}",
                            c["lost"],
                            c["out_of_order"],
                            c["bad_icrc"],
                            c["seconds"],
                            c["algbw_GBps"],
                            c["busbw_GBps"],
                        ]
                        for c in rep["collectives"]
                    ],
                )
            )
        if rep.get("replays"):
            blocks.append(
                (
                    "table",
                    ["RoCE replay", "messages", "complete", "packets", "s"],
                    [
                        [r["name"], r["messages"], r["complete"],
                         f"{r['packets_received']}/{r['packets_expected']}", r["seconds"]]
                        for r in rep["replays"]
                    ],
                )
            )  # fmt: skip
        if rep["faults"]:
            blocks.append(
                (
                    "table",
                    ["fault", "flow", "lost packets", "loss window ms"],
                    [
                        [w["fault"], w["flow"], w["lost_packets"], w["loss_window_ms"]]
                        for w in rep["loss_windows"]
                        if w["lost_packets"] or len(rep["flows"]) <= 4
                    ],
                )
            )
        if rep.get("headroom"):
            blocks.append(("p", _headroom_line(rep["headroom"])))
        reroutes = [e for e in rep["events"] if e["kind"] in ("port_down", "port_up", "routing_change")]
        if reroutes:
            blocks.append(
                (
                    "table",
                    ["controller event", "ports", "computed ms", "installed ms", "flow-mods"],
                    [
                        [
                            e["kind"],
                            ", ".join(e.get("ports", [])),
                            e.get("computed_ms"),
                            e.get("installed_ms"),
                            e.get("flow_mods"),
                        ]
                        for e in reroutes
                    ],
                )
            )
        for name in plots.get(n, []):
            blocks.append(("img", name))
    return blocks


def _cell_md(value: Any) -> str:
    if isinstance(value, tuple) and value[0] == "code":
        return f"`{value[1]}`"
    return str(value).replace("|", "\\|")


def render_markdown(blocks: list[Block]) -> str:
    lines: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind == "h1":
            lines += [f"# {block[1]}", ""]
        elif kind == "h2":
            lines += [f"## {block[1]}", ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "table":
            headers, rows = block[1], block[2]
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("| " + " | ".join(["---"] * 2 + ["---:"] * (len(headers) - 2)) + " |")
            lines += ["| " + " | ".join(_cell_md(v) for v in row) + " |" for row in rows]
            lines.append("")
        elif kind == "img":
            lines += [f"![{block[1]}]({block[1]})", ""]
    return "\n".join(lines).rstrip() + "\n"


_STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1200px;margin:24px auto;padding:0 16px;
color:#1d2630}table{border-collapse:collapse;margin:10px 0;font-size:13px}th,td{padding:3px 8px;
border-bottom:1px solid #d9dee4;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}
img{max-width:100%;display:block;margin:12px 0;border:1px solid #e4e8ec}h2{margin-top:32px}"""


def _cell_html(value: Any) -> str:
    if isinstance(value, tuple) and value[0] == "code":
        return f"<td><code>{html.escape(str(value[1]))}</code></td>"
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return f"<td{' class=n' if numeric else ''}>{html.escape(str(value))}</td>"


def render_html(blocks: list[Block], title: str) -> str:
    """A self-contained page (images are the PNGs beside it; no script, no external asset)."""
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
    ]
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{html.escape(block[1])}</{kind}>")
        elif kind == "table":
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{html.escape(h)}</th>" for h in block[1])
                + "</tr></thead><tbody>"
            )
            out += ["<tr>" + "".join(_cell_html(v) for v in row) + "</tr>" for row in block[2]]
            out.append("</tbody></table>")
        elif kind == "img":
            name = html.escape(block[1])
            out.append(f'<figure><img src="{name}" alt="{name}"><figcaption>{name}</figcaption></figure>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


__all__ = ["render_html", "render_markdown", "tier_groups", "write_outputs"]
