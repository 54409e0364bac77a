"""Where a benchmark writes its JSON (`--out FILE`): checked before the benchmark runs (minutes of work must
not end in "is a directory"), written whole at the end (a new file renamed over the old one: an interrupted
run leaves the previous figures, never half a file).  The file is replaced: results files are what the
benchmarks write; a folder, or a file in a folder that cannot be created, is refused with exit 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def out_file(text: str) -> Path:
    """argparse type of `--out`: a file that can be written (its folder may not exist yet)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a regular file")
    parent = next((p for p in Path(os.path.abspath(path)).parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {text}: {parent} is not a folder")
    try:  # can files be made there at all (read-only, /proc)?
        os.rmdir(tempfile.mkdtemp(prefix=".bench-probe.", dir=parent))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {exc.strerror or exc}") from None
    return path


def write_out(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text if text.endswith("\n") else text + "\n")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def percentiles(
    values: Iterable[float], digits: int = 2, p99: bool = False, mean: bool = False
) -> dict[str, float]:
    """n, p50, p95 (and p99, mean if asked), max of `values`, rounded to `digits`; {} for none.  A
    quantile q is the sorted sample at index floor(q * n) (no interpolation: a reported figure was seen)."""
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)

    out: dict[str, float] = {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), digits),
        "p95": at(0.95),
    }
    if p99:
        out["p99"] = at(0.99)
    out["max"] = round(ordered[-1], digits)
    if mean:
        out["mean"] = round(statistics.fmean(ordered), digits)
    return out


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The machine a benchmark ran on and its load before and after (append to the report)."""
    return {
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


def emit(report: dict[str, Any], path: Path | None) -> None:
    """A benchmark's report as indented JSON: into `path` (whole or not at all), or on stdout."""
    text = json.dumps(report, indent=2) + "\n"
    if path:
        write_out(path, text)
    else:
        sys.stdout.write(text)


__all__ = ["emit", "machine", "out_file", "percentiles", "write_out"]
