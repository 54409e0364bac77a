"""Run the real OpenSM on a fabric through ibsim, for side-by-side figures (never needed by the tests).

Debian packages `opensm` (3.3.23), `ibsim-utils` (0.10) and `infiniband-diags` give the exact versions that
produced the references in tests/data.  The fabric is written as an ibsim net file, ibsim simulates it, and
OpenSM runs once against it through ibsim's umad2sim preload library.  Both run in a private network
namespace (`unshare -n`): ibsim's sockets are abstract Unix sockets, global per network namespace, so
concurrent runs (or other people's ibsim) cannot collide.

OpenSM's "routing step" is read from its own log: from `ucast_mgr_route: building routing with '<engine>'`
to `<engine> tables configured on all switches` (the span in which it computes and stores the forwarding
tables; LFT upload to the simulated switches follows).  Peak memory is OpenSM's maximum resident set
(GNU time).  The dumps (`opensm-lfts.dump`, `opensm-ftree-ca-order.dump`, ...) are returned as text so the
caller can put OpenSM's tables through fabriclab's verifier.

    python -m benchmarks.opensm_sim FABRIC.net --engine ftree --out /tmp/osm   # one run, JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from fabriclab.cli import results
from fabriclab.cli.common import CliError

ROOT = Path(__file__).resolve().parents[1]

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
_STAMP = re.compile(r"^(\w{3} \d\d \d\d:\d\d:\d\d) (\d{6}) ")


def available() -> str | None:
    """None if OpenSM can be run here, else why not."""
    for tool in ("opensm", "ibsim", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y opensm ibsim-utils infiniband-diags)"
    if not UMAD2SIM.exists():
        return f"{UMAD2SIM} is missing (ibsim-utils)"
    if not Path("/usr/bin/time").exists():
        return "/usr/bin/time (GNU time) is missing"
    return None


@dataclass
class OpenSmRun:
    engine: str
    ok: bool
    route_s: float | None
    subnet_up_s: float | None
    peak_rss_mb: float | None
    engine_used: str | None
    #: dfsssp: virtual lanes its layering needed (it falls back to minhop beyond those available).
    vls_needed: int | None = None
    dumps: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def _stamp(line: str) -> float | None:
    match = _STAMP.match(line)
    if not match:
        return None
    moment = datetime.strptime(f"2000 {match.group(1)}", "%Y %b %d %H:%M:%S")
    return moment.timestamp() + int(match.group(2)) / 1e6


def _routing_span(log: str) -> tuple[float | None, float | None, str | None]:
    """(routing step seconds, discovery-to-SUBNET-UP seconds, engine that configured the tables)."""
    start = done = first = up = None
    used = None
    for line in log.splitlines():
        t = _stamp(line)
        if t is None:
            continue
        if first is None:
            first = t
        if "ucast_mgr_route: building routing with" in line:
            start = t  # the last attempt counts (a failed engine falls back to minhop)
        elif "tables configured on all switches" in line:
            done = t
            match = re.search(r"-> osm_ucast_mgr_process: (\S+) tables configured", line)
            used = match.group(1) if match else None
        elif line.rstrip().endswith("-> SUBNET UP"):
            up = t
    route = done - start if start is not None and done is not None else None
    total = up - first if up is not None and first is not None else None
    return route, total, used


def run_opensm(net_file: Path, engine: str, workdir: Path | None = None, timeout_s: float = 900) -> OpenSmRun:
    """One OpenSM run (`-o`: configure once and exit) with routing engine `engine` on `net_file`."""
    why = available()
    if why:
        return OpenSmRun(engine, False, None, None, None, None, error=why)
    text = net_file.read_text()
    nodes = sum(1 for line in text.splitlines() if line.startswith(("Switch", "Ca")))
    switches = sum(1 for line in text.splitlines() if line.startswith("Switch"))
    ports = sum(1 for line in text.splitlines() if line.startswith("["))
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="fabriclab-osm-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    dump = work / "dump"
    dump.mkdir(exist_ok=True)
    sim = (
        f"ibsim -s -n -N {nodes + 64} -S {switches + 16} -P {ports + nodes + 1024} "
        f"{shlex.quote(str(net_file))} > ibsim.log 2>&1 & sim=$!; "
        "for i in $(seq 1 6000); do grep -q 'Network simulator ready' ibsim.log && break; "
        "kill -0 $sim 2>/dev/null || exit 97; sleep 0.05; done; "
        f"LD_PRELOAD={UMAD2SIM} OSM_TMP_DIR=. OSM_CACHE_DIR=. /usr/bin/time -f '%M' -o osm.rss "
        f"timeout {int(timeout_s)} opensm -o -R {shlex.quote(engine)} -f osm.log -e -s 0 -D 0x47 "
        "--dump_files_dir dump -F /dev/null > osm.out 2>&1; rc=$?; "
        "kill $sim; wait $sim 2>/dev/null; exit $rc"
    )
    started = time.monotonic()
    try:
        done = subprocess.run(
            ["unshare", "-n", "sh", "-c", sim],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=timeout_s + 120,
            check=False,
        )
        log = (work / "osm.log").read_text(errors="replace") if (work / "osm.log").exists() else ""
        route_s, up_s, used = _routing_span(log)
        rss = None
        if (work / "osm.rss").exists():
            numbers = re.findall(r"^\d+$", (work / "osm.rss").read_text(), re.MULTILINE)
            rss = int(numbers[-1]) / 1024 if numbers else None
        dumps = {
            p.name: p.read_text(errors="replace") for p in dump.iterdir() if p.name.startswith("opensm-")
        }
        ok = done.returncode == 0 and route_s is not None
        error = None if ok else f"exit {done.returncode} after {time.monotonic() - started:.1f} s; see {work}"
        needed = re.findall(r"Virtual Lanes needed: (\d+)", log)
        vls = int(needed[-1]) if needed else None
        return OpenSmRun(engine, ok, route_s, up_s, rss, used, vls, dumps, error)
    finally:
        if own and work.exists():
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("net", type=Path)
    parser.add_argument("--engine", default="ftree")
    parser.add_argument("--out", type=Path, help="keep the work directory (logs and dumps) here: a new or "
                        "empty folder, or an earlier --out of this script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.out is not None:
        try:  # OpenSM's own dumps in a folder of the user's are not ours to overwrite
            results.check(args.out, "opensm_sim", option="--out")
        except CliError as exc:
            parser.error(str(exc))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / results.MARKER).write_text(json.dumps({"command": "opensm_sim"}) + "\n")
    run = run_opensm(args.net, args.engine, args.out)
    summary = {k: v for k, v in run.__dict__.items() if k != "dumps"}
    summary["dumps"] = sorted(run.dumps)
    print(json.dumps(summary, indent=2))
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
