"""Scenario results as files: summary.json (all figures), report.md (the story) and PNG plots.

Plots are drawn per repetition with matplotlib's Agg backend (no display needed): `utilisation-repN.png`
(link directions × time, colour = share of capacity), `throughput-repN.png` (received packets per second
of every flow, fault times marked) and `loss-repN.png` (loss window per fault and flow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_outputs(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "summary.json"]
    written[0].write_text(json.dumps(summary, indent=2) + "\n")
    for rep in summary["repetitions"]:
        written += _plots(rep, out_dir)
    report = out_dir / "report.md"
    report.write_text(_markdown(summary))
    written.append(report)
    return written


def _plots(rep: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib  # noqa: PLC0415 - heavy; only when writing results

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    n = rep["repetition"]
    files = []
    util = rep["utilisation"]
    if util["links"] and util["times_s"]:
        names = list(util["links"])
        width = len(util["times_s"])
        matrix = [(util["links"][name] + [0.0] * width)[:width] for name in names]
        peak = max(0.01, *(max(row) for row in matrix))
        fig, ax = plt.subplots(figsize=(10, max(3.0, 0.16 * len(names) + 1.5)))
        image = ax.imshow(matrix, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=peak)
        ax.set_yticks(range(len(names)), names, fontsize=6)
        step = max(1, width // 10)
        ax.set_xticks(range(0, width, step), [f"{util['times_s'][i]:.1f}" for i in range(0, width, step)])
        ax.set_xlabel("time (s)")
        ax.set_title("link utilisation (share of capacity), switch-to-switch directions")
        fig.colorbar(image, ax=ax)
        files.append(_save(fig, out_dir / f"utilisation-rep{n}.png"))
    if rep["flows"]:
        fig, ax = plt.subplots(figsize=(10, 4))
        t0 = min(
            (f["throughput"]["packets"][0][0] for f in rep["flows"] if f["throughput"]["packets"]), default=0
        )
        for flow in rep["flows"]:
            bucket = flow["throughput"]["bucket_s"]
            points = flow["throughput"]["packets"]
            ax.plot(
                [(b - t0) * bucket for b, _ in points], [c / bucket for _, c in points], label=flow["name"]
            )
        for fault in rep["faults"]:
            ax.axvline(
                fault["wall"] - t0 * flow["throughput"]["bucket_s"], color="red", linestyle="--", linewidth=1
            )
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


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)
    return path


def _overload_line(summary: dict[str, Any]) -> str:
    if summary.get("emulator_overloaded"):
        reps = ", ".join(str(r) for r in summary.get("overloaded_repetitions", []))
        return (
            f"**The emulator was overloaded** (repetition {reps}): it dropped or delayed packets itself, so "
            "loss and delay below are not the modelled fabric's alone (see Headroom)."
        )
    return "The emulator kept up: no drops or delays of its own beyond 0.1 % (see Headroom)."


def _markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Scenario `{summary['scenario']}`",
        "",
        f"Fabric: {summary['fabric']}; controller {summary['controller']}; "
        f"scale {summary['scale'] or 'unshaped'}; {summary['duration_s']} s; seed {summary['seed']}.",
        "",
        _overload_line(summary),
        "",
        *(f"> warning: {w}" for w in summary.get("warnings", [])),
    ]
    for rep in summary["repetitions"]:
        n = rep["repetition"]
        pairs = rep["all_pairs"]
        t = rep["timings_s"]
        lines += [
            f"## Repetition {n}",
            "",
            f"Bring-up: Mininet built {t.get('mininet_build_s', 0):.1f} s, "
            f"started {t.get('mininet_start_s', 0):.1f} s, "
            f"tables installed {t.get('tables_installed_s', 0):.1f} s, all pairs verified "
            f"{t.get('all_pairs_verified_s', 0):.1f} s ({pairs['reachable']}/{pairs['pairs']} reachable).",
            "",
            "| flow | path | sent | received | lost | loss % | out of order | goodput Mb/s |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for f in rep["flows"]:
            lines.append(
                f"| {f['name']} {f['src']}→{f['dst']} | `{f['path']}` | {f['sent']} | {f['received']} "
                f"| {f['lost']} "
                f"| {f['loss_pct']} | {f['out_of_order']} | {f['goodput_mbps']} |"
            )
        if rep.get("collectives"):
            lines += [
                "",
                "| RoCE collective | ranks | size | QPs | packets | lost | out of order | bad ICRC | s "
                "| algbw GB/s | busbw GB/s |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            lines += [
                f"| {c['collective']} | {c['ranks']} | {c['size_bytes']} | {c['qps']} | "
                f"{c['packets_received']}/{c['packets_expected']} | {c['lost']} | {c['out_of_order']} | "
                f"{c['bad_icrc']} | {c['seconds']} | {c['algbw_gbps']} | {c['busbw_gbps']} |"
                for c in rep["collectives"]
            ]
        if rep["faults"]:
            lines += ["", "| fault | flow | lost packets | loss window ms |", "| --- | --- | ---: | ---: |"]
            lines += [
                f"| {w['fault']} | {w['flow']} | {w['lost_packets']} | {w['loss_window_ms']} |"
                for w in rep["loss_windows"]
                if w["lost_packets"] or len(rep["flows"]) <= 4
            ]
        h = rep.get("headroom")
        if h:
            by_cause = h["emulator_drops_by_cause"].items()
            causes = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in by_cause if v)
            ratio = h.get("offered_vs_capacity")
            lines += [
                "",
                f"Headroom: emulator overloaded **{'yes' if h['emulator_overloaded'] else 'no'}**"
                + (f" ({h['why']})" if h["why"] else "")
                + f"; emulator drops {h['emulator_drops']} of {h['offered_packets']} packets "
                f"({h['emulator_drop_pct']} %{'; ' + causes if causes else ''}), modelled congestion drops "
                f"{h['modelled_congestion_drops']}, drops on cut links {h['fault_drops']}, probe delay p99 "
                f"{h['probe_latency_p99_ms']} ms"
                + (f"; offered {ratio}× the calibrated capacity" if ratio is not None else ""),
            ]  # fmt: skip
        reroutes = [e for e in rep["events"] if e["kind"] in ("port_down", "port_up", "routing_change")]
        if reroutes:
            lines += [
                "",
                "| controller event | ports | computed ms | installed ms | flow-mods |",
                "| --- | --- | ---: | ---: | ---: |",
            ]
            lines += [
                f"| {e['kind']} | {', '.join(e.get('ports', []))} | {e.get('computed_ms')} "
                f"| {e.get('installed_ms')} "
                f"| {e.get('flow_mods')} |"
                for e in reroutes
            ]
        for name in (f"utilisation-rep{n}.png", f"throughput-rep{n}.png", f"loss-rep{n}.png"):
            lines += ["", f"![{name}]({name})"]
        lines.append("")
    return "\n".join(lines) + "\n"


__all__ = ["write_outputs"]
