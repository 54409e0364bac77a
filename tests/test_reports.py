"""Scenario reports without an emulator: utilisation grouped by tier (readable at k=8), report.md and
report.html linking exactly the plots that exist, and progress shown as a bar on a terminal and as plain
lines in a log."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from emulation.report import tier_groups, write_outputs
from emulation.runner import _utilisation
from fabriclab.cli.progress import console_progress
from topologies.generators import fat_tree
from topologies.scale import Scale


def _samples(k: int, polls: int) -> list[tuple[float, list[dict[str, Any]]]]:
    """What `GET /links?counters=true` returns, polled `polls` times 0.5 s apart, with random traffic."""
    fabric = fat_tree(k)
    rng = random.Random(7)
    tx: dict[str, int] = {}
    samples = []
    for i in range(polls):
        links = []
        for link in fabric.links:
            entry: dict[str, Any] = {"a": str(link.a), "b": str(link.b), "bw_gbps": link.bw_gbps}
            for side in ("a", "b"):
                ref = str(getattr(link, side))
                if fabric.nodes[ref.split(":", maxsplit=1)[0]].is_switch:
                    tx[ref] = tx.get(ref, 0) + rng.randrange(0, 6_000_000)
                    entry[f"{side}_counters"] = {"tx_bytes": tx[ref], "rx_bytes": 0}
                else:
                    entry[f"{side}_counters"] = None
            links.append(entry)
        samples.append((100.0 + 0.5 * i, links))
    return samples


def _summary(k: int, faults: bool) -> dict[str, Any]:
    scenario = SimpleNamespace(fabric=fat_tree(k), scale=Scale.parse("400G=200M"))
    util = _utilisation(scenario, _samples(k, 12))  # type: ignore[arg-type]
    flow = {"name": "f1", "src": "h1", "dst": "h9", "path": "h1>1 1>leaf1>3", "sent": 10, "received": 9,
            "lost": 1, "loss_pct": 10.0, "out_of_order": 0, "goodput_mbps": 1.0,
            "throughput": {"bucket_s": 0.1, "packets": [[10, 5], [11, 4]]}, "gaps": []}  # fmt: skip
    rep = {"repetition": 1, "timings_s": {}, "all_pairs": {"pairs": 2, "reachable": 2}, "flows": [flow],
           "collectives": [], "faults": [{"at_s": 1, "action": "link_down", "target": "leaf1:3", "wall": 1.0}]
           if faults else [], "loss_windows": [], "events": [], "utilisation": util}  # fmt: skip
    return {"scenario": "synthetic", "fabric": f"k={k}", "controller": {}, "scale": "400G=200M",
            "duration_s": 6, "seed": 1, "repetitions": [rep]}  # fmt: skip


def test_utilisation_rows_are_grouped_by_tier_and_direction() -> None:
    summary = _summary(8, faults=False)
    groups = tier_groups(summary["repetitions"][0]["utilisation"])
    assert [label for label, _ in groups] == [
        "leaf → aggregation",
        "aggregation → leaf",
        "aggregation → core",
        "core → aggregation",
    ]
    assert [len(rows) for _, rows in groups] == [128] * 4  # k=8: every direction between switches


def test_reports_link_only_plots_that_exist_and_stay_readable_at_k8(tmp_path: Path) -> None:
    import matplotlib.image

    write_outputs(_summary(8, faults=False), tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "loss-rep1.png" not in files  # no faults: no loss plot ...
    markdown = (tmp_path / "report.md").read_text()
    linked = set(re.findall(r"!\[[^]]*\]\(([^)]+)\)", markdown))
    assert linked == {"utilisation-rep1.png", "utilisation-tiers-rep1.png", "throughput-rep1.png"}
    assert linked <= files  # ... and nothing links one
    page = (tmp_path / "report.html").read_text()
    assert set(re.findall(r'<img src="([^"]+)"', page)) == linked
    assert "<script" not in page and "http" not in page  # self-contained
    assert "<td><code>h1&gt;1 1&gt;leaf1&gt;3</code></td>" in page  # escaped, same table as the markdown
    height, width = matplotlib.image.imread(tmp_path / "utilisation-rep1.png").shape[:2]
    assert width >= 1000 and height <= 1900  # 512 directions in four panels, not 640 labelled rows

    write_outputs(_summary(4, faults=True), tmp_path / "faults")
    assert "![loss-rep1.png](loss-rep1.png)" in (tmp_path / "faults" / "report.md").read_text()
    assert (tmp_path / "faults" / "loss-rep1.png").is_file()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log() -> None:
    log = io.StringIO()
    with console_progress(log) as progress:
        for i in range(101):
            progress(i / 100, f"t={i}")
    lines = log.getvalue().splitlines()
    assert len(lines) == 11 and lines[0].strip() == "0.0%  t=0" and lines[-1].strip() == "100.0%  t=100"
    terminal = _Terminal()
    with console_progress(terminal) as progress:
        progress(0.5, "halfway")
    shown = terminal.getvalue()
    assert "halfway" in shown and "50.0%" in shown and "━" in shown  # rich's bar
