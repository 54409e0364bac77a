"""Every option of every command, given what a user could mistype (nan, inf, negative, zero, huge numbers;
paths that are directories, devices or unwritable; ports in use twice): exit 2, one line on stderr that
names the option, no traceback, nothing left behind, nothing started."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from emulation.controlproc import free_port
from emulation.mnfabric import MininetFabric, Scale
from fabriclab.cli import main
from labspec.scenario import load_scenario
from tests.conftest import ROOT
from topologies.errors import InputError
from topologies.loader import load_topology

TOPO = str(ROOT / "topologies" / "fat-tree-k4.yaml")
IBNET = str(ROOT / "tests" / "data" / "opensm-ft3-k4" / "fabric.net")
SCENARIO = str(ROOT / "scenarios" / "link-failure.yaml")
KV = ["plan", "kv-transfer", "--model", "llama3-70b", "--prefill", "h1", "--decode", "h2"]
PCAP = ["pcap", "allreduce", "--ranks", "h1..h4", "--size", "4KiB", "-o", "{tmp}/x.pcap"]
RING = ["plan", "allreduce", "--ranks", "h1..h4", "--size", "4KiB"]
SIM = ["sim", "--topology", TOPO, "--traffic", "permutation"]
SWEEP = str(ROOT / "sweeps" / "policies-vs-size.yaml")
BIG = "9" * 5000  # more digits than Python converts to an int

# (argv, what the one line must contain).  "{tmp}" is the test's scratch directory (also the cwd),
# "{dir}" an existing empty directory in it, "{file}" an existing file in it, "{full}" a directory with a
# file of the user's in it.
CASES: list[tuple[list[str], str]] = [
    # --- topo ---------------------------------------------------------------------------------------
    (["topo", "generate", "fat-tree", "--k", "66"], "--k: a k=66 fat-tree has 71,874 hosts"),
    (["topo", "generate", "fat-tree", "--k", "-2"], "--k: k must be an even integer"),
    (["topo", "generate", "fat-tree", "--k", "1e3"], "argument --k: invalid int value"),
    (["topo", "generate", "fat-tree", "--k", "4", "--bw-gbps", "nan"], "--bw-gbps: bw_gbps must be a finite"),
    (["topo", "generate", "fat-tree", "--k", "4", "--bw-gbps", "inf"], "--bw-gbps: bw_gbps must be a finite"),
    (["topo", "generate", "fat-tree", "--k", "4", "--bw-gbps", "0"], "--bw-gbps: bw_gbps must be a finite"),
    (["topo", "generate", "fat-tree", "--k", "4", "--name", ""], "--name: bad fabric name ''"),
    (["topo", "generate", "fat-tree", "--k", "4", "--name", "a\nb: c"], "--name: bad fabric name"),
    (["topo", "generate", "fat-tree", "--k", "4", "-o", "{dir}"], "-o/--output: {dir} is a directory"),
    (["topo", "generate", "fat-tree", "--k", "4", "-o", "/proc/self/x"], "-o/--output: cannot write"),
    (["topo", "generate", "fat-tree", "--k", "4", "-o", "{tmp}/no/such/x.yaml"], "-o/--output: cannot write"),
    (["topo", "generate", "fat-tree", "--k", "4", "-o", "{file}/x"], "-o/--output: cannot write"),
    (["topo", "generate", "leaf-spine", "--leaves", "0", "--spines", "2", "--hosts-per-leaf", "2"],
     "--leaves: leaves must be >= 1"),
    (["topo", "generate", "leaf-spine", "--leaves", "2", "--spines", "2", "--hosts-per-leaf", "2",
      "--uplink-bw-gbps", "inf"], "--uplink-bw-gbps: uplink_bw_gbps must be a finite"),
    (["topo", "generate", "leaf-spine", "--leaves", "2", "--spines", "2", "--hosts-per-leaf", "2",
      "--parallel", "-1"], "--parallel: parallel must be >= 1"),
    (["topo", "generate", "rail", "--servers", "99999999999"],
     "rail: a rail leaf would need 199999999998 ports (servers + spines x parallel"),
    (["topo", "generate", "rail", "--servers", "4", "--gpus", "0"], "--gpus: gpus must be >= 1"),
    (["topo", "import-ibnet", IBNET, "--bw-gbps", "nan"], "argument --bw-gbps: must be a number from"),
    (["topo", "import-ibnet", IBNET, "--bw-gbps", "-1"], "argument --bw-gbps: must be a number from"),
    (["topo", "import-ibnet", IBNET, "--name", "two words"], "--name: bad fabric name"),
    (["topo", "import-ibnet", IBNET, "-o", "{dir}"], "-o/--output: {dir} is a directory"),
    (["topo", "export-ibnet", TOPO, "-o", "{dir}"], "-o/--output: {dir} is a directory"),
    (["topo", "check", "/dev/zero"], "/dev/zero: not a regular file"),
    (["topo", "generate", "torus", "--x", "1000", "--y", "1000"],
     "--x: 1,000,000 switches with 1 host(s) each: more than the generators' limit of 65,536 hosts"),
    (["topo", "generate", "dragonfly", "--groups", "1000", "--routers", "100", "--globals-per-router", "10"],
     "--groups: 100,000 switches"),
    (["topo", "generate", "random-regular", "--switches", "70000", "--degree", "4"], "--switches: 70,000"),
    (["topo", "generate", "random-regular", "--switches", "8", "--degree", "4", "--seed", "-1"],
     "argument --seed: must be 0..4294967295"),
    (["topo", "generate", "torus", "--x", BIG, "--y", "3"], "argument --x: invalid int value"),
    (["topo", "check", "{dir}"], "{dir}: is a directory"),
    # --- route --------------------------------------------------------------------------------------
    (["route", TOPO, "--vls", "0"], "--vls must be 1..15"),
    (["route", TOPO, "--vls", "99999999999999999999"], "--vls must be 1..15"),
    (["route", TOPO, "--max-shifts", "-3"], "--max-shifts must be >= 1"),
    (["route", TOPO, "--fail-links", "-1"], "--fail-links must be a count or a percentage (0..100%)"),
    (["route", TOPO, "--fail-links", "99999"], "cannot fail 99999 links"),
    (["route", TOPO, "--seed", "nan"], "argument --seed: expected an integer, got 'nan'"),
    (["route", TOPO, "--dump-dir", "/proc/self/x"], "--dump-dir: cannot create /proc/self/x"),
    (["route", TOPO, "--dump-dir", "{file}"], "--dump-dir: {file} exists and is not a folder"),
    (["route", TOPO, "--dump-dir", "{file}/sub"], "--dump-dir: cannot use {file}/sub"),
    (["route", TOPO, "--dump-dir", "{full}"], "--dump-dir: {full} is a folder with other things in it"),
    (["route", TOPO, "--dump-dir", "{full}", "--force", "--vls", "0"], "--vls must be 1..15"),
    (["route", TOPO, "--dump-dir", "."], "--dump-dir: . is the current folder or contains it"),
    (["route", TOPO, "--fail-links", "1", "--seed", "-1"], "argument --seed: must be 0..4294967295"),
    (["route", TOPO, "--seed", BIG], f"argument --seed: expected an integer, got '{BIG[:40]}'"),
    # --- traffic ------------------------------------------------------------------------------------
    (["traffic", *PCAP, "--mtu", "0"], "argument --mtu: invalid choice: 0"),
    (["traffic", *PCAP, "--mtu", "1500"], "argument --mtu: invalid choice: 1500"),
    (["traffic", *PCAP, "--pkey", "0x1ffff"], "argument --pkey: must be 0x0001..0xffff, got '0x1ffff'"),
    (["traffic", *PCAP, "--pkey", "0"], "argument --pkey: must be 0x0001..0xffff"),
    (["traffic", *PCAP, "--pkey", "-1"], "argument --pkey: must be 0x0001..0xffff"),
    (["traffic", *PCAP, "--pkey", "zz"], "argument --pkey: expected an integer"),
    (["traffic", *PCAP[:-1], "{dir}"], "-o/--output: {dir} is a directory"),
    (["traffic", *PCAP[:-1], "/proc/x/y"], "-o/--output: cannot write /proc/x/y"),
    (["traffic", *PCAP[:-3], "4GiB", "-o", "{tmp}/x.pcap"], "-o/--output: 25,165,824 frames at MTU 1024"),
    (["traffic", *KV, "--prompt-tokens", "99999999999"], "--prompt-tokens: at most 10,000,000 tokens"),
    (["traffic", *KV, "--prompt-tokens", "2000000"], "--prompt-tokens: 1 request(s) x 80 layers"),
    (["traffic", *KV, "--prompt-tokens", "64", "--requests", "999999"], "--requests: 999,999 request(s)"),
    (["traffic", *KV, "--prompt-tokens", "0"], "--prompt-tokens: must be an integer >= 1"),
    (["traffic", *KV, "--prompt-tokens", "64", "--page-tokens", "-16"], "--page-tokens: must be an integer"),
    (["traffic", *KV, "--prompt-tokens", "64", "--rate", "nan"], "--rate: must be a number >= 0"),
    (["traffic", *KV, "--prompt-tokens", "64", "--rate", "inf"], "--rate: must be a number >= 0"),
    (["traffic", *KV, "--prompt-tokens", "64", "--layer-time-us", "-1"], "--layer-time-us: must be a number"),
    (["traffic", "plan", "kv-transfer", "--layers", "0", "--kv-heads", "8", "--head-dim", "128",
      "--prompt-tokens", "64", "--prefill", "h1", "--decode", "h2"], "--layers: must be an integer >= 1"),
    (["traffic", "plan", "hotspot", "--ranks", "h1..h8", "--size", "1KiB", "--to", "h1", "--fraction", "nan"],
     "--fraction: must be between 0 and 1"),
    (["traffic", *RING[:-2], "--size=-1KiB"], "--size: must be >= 0"),
    (["traffic", *RING, "--trace", "{dir}"], "--trace: {dir} is a directory"),
    (["traffic", *RING, "--trace", "/proc/self/x"], "--trace: cannot write /proc/self/x"),
    (["traffic", *RING, "--topology", "/dev/zero"], "/dev/zero: not a regular file"),
    (["traffic", *RING[:-1], BIG], "--size: cannot parse '999"),
    (["traffic", *RING[:-1], "99999999999999999999TiB"], "--size: at most 9,223,372,036,854,775,807 bytes"),
    (["traffic", *RING, "--seed", "-1"], "argument --seed: must be 0..4294967295"),
    (["traffic", *KV, "--prompt-tokens", "64", "--layers", BIG], "argument --layers: invalid int value"),
    # --- sim, sweep (results folders: never replace what fabriclab did not write) -----------------------
    ([*SIM, "-o", "{file}"], "-o/--output: {file} exists and is not a folder"),
    ([*SIM, "-o", "{full}"], "-o/--output: {full} is a folder with other things in it (not a fabriclab"),
    ([*SIM, "-o", "."], "-o/--output: . is the current folder or contains it"),
    ([*SIM, "-o", "{tmp}"], "-o/--output: {tmp} is the current folder or contains it"),
    ([*SIM, "-o", ".."], "-o/--output: .. is the current folder or contains it"),
    ([*SIM, "-o", "{file}", "--force"], "-o/--output: {file} exists and is not a folder"),
    ([*SIM, "-o", "/proc/sys/x"], "-o/--output: cannot create /proc/sys/x"),
    ([*SIM, "-o", "{file}/x"], "-o/--output: cannot use {file}/x"),
    ([*SIM, "-o", "{tmp}/r", "--size", BIG], "size: cannot parse '999"),
    ([*SIM, "-o", "{tmp}/r", "--seed", "-1"], "argument --seed: must be 0..4294967295"),
    ([*SIM, "-o", "{tmp}/r", "--policies", ""], "policies: empty policy name in ''"),
    ([*SIM, "-o", "{tmp}/r", "--policies", "static,"], "policies: empty policy name"),
    ([*SIM[:-1], "permutation:offleaf", "-o", "{tmp}/r", "--seed", "-7"], "argument --seed: must be 0.."),
    ([*SIM[:-1], f"shift:{BIG}", "-o", "{tmp}/r"], "needs an integer in 1..15 after ':'"),
    ([*SIM[:-1], f"incast:{BIG}", "-o", "{tmp}/r"], "needs an integer in 1..15 after ':'"),
    (["sweep", SWEEP, "-o", "{file}"], "-o/--output: {file} exists and is not a folder"),
    (["sweep", SWEEP, "-o", "{full}"], "-o/--output: {full} is a folder with other things in it"),
    (["sweep", SWEEP, "-o", "{tmp}/r", "--dask-timeout", "0"], "--dask-timeout: 0.5..3600 seconds"),
    # --- controller (its own process: if validation failed it would start listening) -----------------
    (["controller", "--topology", TOPO, "--lldp-interval", "nan"], "argument --lldp-interval: must be"),
    (["controller", "--topology", TOPO, "--lldp-interval", "1e-9"], "argument --lldp-interval: must be"),
    (["controller", "--topology", TOPO, "--lldp-interval", "inf"], "argument --lldp-interval: must be"),
    (["controller", "--topology", TOPO, "--lldp-interval", "-5"], "argument --lldp-interval: must be"),
    (["controller", "--topology", TOPO, "--openflow", "127.0.0.1:6653", "--api", "127.0.0.1:6653"],
     "--api: 127.0.0.1:6653 is also the --openflow address"),
    (["controller", "--topology", TOPO, "--openflow", "127.0.0.1:6653", "--api", "0.0.0.0:6653"],
     "--api: 0.0.0.0:6653 is also the --openflow address"),
    (["controller", "--topology", TOPO, "--api", "127.0.0.1:\u00b2"], "--api: expected HOST:PORT"),
    (["controller", "--topology", TOPO, "--api", "127.0.0.1:0"], "--api: expected HOST:PORT"),
    (["controller", "--topology", TOPO, "--openflow", "no.such.host.invalid:6653"],
     "--openflow: cannot resolve"),
    (["controller", "--topology", TOPO, "--state-dir", "{file}"],
     "--state-dir: {file}: state directory is not"),
    (["controller", "--topology", TOPO, "--state-dir", "/proc/self/x"],
     "--state-dir: /proc/self/x: cannot use"),
    # --- emulate up / scenario run (run without Mininet on PATH: anything not refused up front would
    # fail later with "emulation unavailable" instead of the expected line, and never build a fabric) --
    (["emulate", "up", TOPO, "--no-cli", "--mtu", "0"], "argument --mtu: must be 576..9216"),
    (["emulate", "up", TOPO, "--no-cli", "--mtu", "100000"], "argument --mtu: must be 576..9216"),
    (["emulate", "up", TOPO, "--no-cli", "--ready-timeout", "inf"], "--ready-timeout: must be a positive"),
    (["emulate", "up", TOPO, "--no-cli", "--ready-timeout", "-1"], "--ready-timeout: must be a positive"),
    (["emulate", "up", TOPO, "--no-cli", "--scale", "400G=200T"], "--scale: link h1:1--leaf1:1"),
    (["emulate", "up", TOPO, "--no-cli", "--scale", "400G=0.0001K"], "below the smallest rate HTB"),
    (["emulate", "up", TOPO, "--no-cli", "--scale", "1.2.3G=1M"], "--scale: scale '1.2.3G=1M': expected"),
    (["emulate", "up", TOPO, "--no-cli", "--api", "127.0.0.1:6653"], "--api: 127.0.0.1:6653 is also the"),
    (["emulate", "up", TOPO, "--no-cli", "--emu-api", "127.0.0.1:8080"], "is also the --emu-api address"),
    (["emulate", "up", TOPO, "--no-cli", "--controller", "tcp:h:1:2"], "--controller: expected tcp:HOST"),
    (["emulate", "up", TOPO, "--no-cli", "--controller", "udp:127.0.0.1:6653"],
     "--controller: expected tcp:"),
    (["scenario", "run", SCENARIO, "-o", "/proc/self/x"], "-o/--output: cannot create /proc/self/x"),
    (["scenario", "run", SCENARIO, "-o", "{file}"], "-o/--output: {file} exists and is not a folder"),
    (["scenario", "run", SCENARIO, "-o", "{full}"], "-o/--output: {full} is a folder with other things"),
    (["scenario", "run", SCENARIO, "-o", "."], "-o/--output: . is the current folder or contains it"),
    (["compare", SCENARIO, "-o", "{file}"], "-o/--output: {file} exists and is not a folder"),
    (["compare", SCENARIO, "-o", "{full}"], "-o/--output: {full} is a folder with other things"),
    (["compare", SCENARIO, "-o", "{tmp}/r", "--policies", ""], "--policies: empty policy name"),
]  # fmt: skip

IN_OWN_PROCESS = ("controller", "emulate", "scenario", "compare")


def _fill(text: str, tmp: Path) -> str:
    return text.format(tmp=tmp, dir=tmp / "adir", file=tmp / "afile", full=tmp / "full")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    if argv[0] in IN_OWN_PROCESS:
        if argv[0] == "controller" and "--openflow" not in argv:
            argv = [*argv, "--openflow", f"127.0.0.1:{free_port()}"]
        if argv[0] == "controller" and "--api" not in argv:
            argv = [*argv, "--api", f"127.0.0.1:{free_port()}"]
        done = subprocess.run(
            [sys.executable, "-m", "fabriclab", *argv], capture_output=True, text=True, timeout=60,
            check=False, env={**os.environ, "PATH": "/nonexistent"},
        )  # fmt: skip
        return done.returncode, done.stdout, done.stderr
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(a)[:70] for a, _ in CASES])
def test_bad_cli_input_is_one_line_exit_2_and_leaves_nothing(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("keep me\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep me too\n")
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    code, out, err = _run([_fill(a, tmp_path) for a in argv], capsys)
    assert code == 2, err
    assert out == "", out
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert len(err) < 600, err  # a value of 5,000 characters is not echoed whole
    assert "error: " in err and _fill(message, tmp_path) in err, err
    assert _tree(tmp_path) == before  # no partial output, no temporary file, no state directory


@pytest.mark.parametrize("text", ["400G=200T", "400G=2G", "400G=1G", "400G=200M", "400G=1K", "400G=0.004K"])
def test_scenario_check_accepts_exactly_the_scales_a_run_accepts(tmp_path: Path, text: str) -> None:
    """`scenario check` used to accept `scale: 400G=200T`, which the run (MininetFabric) refused."""
    scenario = tmp_path / "s.yaml"
    original = Path(SCENARIO).read_text()
    assert "scale: 400G=200M" in original and "topology: ../topologies/fat-tree-k4.yaml" in original
    scenario.write_text(
        original.replace("scale: 400G=200M", f"scale: {text}").replace("../topologies/fat-tree-k4.yaml", TOPO)
    )
    fabric = load_topology(TOPO)
    try:
        MininetFabric(fabric, {}, scale=Scale.parse(text))  # validates only; builds nothing
        run_ok, run_error = True, ""
    except Exception as exc:
        run_ok, run_error = False, str(exc)
    try:
        load_scenario(scenario)
        check_ok, check_error = True, ""
    except InputError as exc:
        check_ok, check_error = False, exc.message
    assert check_ok == run_ok and check_error == run_error
    assert run_ok == (text in ("400G=1G", "400G=200M", "400G=1K"))


def test_good_outputs_are_written_whole(tmp_path: Path) -> None:
    """The atomic writer still writes: a file, a pcap, a trace, and a pipe or device in place."""
    out = tmp_path / "ft.yaml"
    assert main(["topo", "generate", "fat-tree", "--k", "4", "-o", str(out)]) == 0
    assert load_topology(out).name == "fat-tree-k4"
    assert main(["traffic", *RING, "--trace", str(tmp_path / "t.jsonl")]) == 0
    pcap = [a.replace("{tmp}", str(tmp_path)) for a in PCAP]
    assert main(["traffic", *pcap, "--pkey", "0x8001", "--mtu", "256"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft.yaml", "t.jsonl", "x.pcap"]
    # A pipe (like /dev/stdout or /dev/null, which a writer that renames would replace: as root, for
    # everyone) is written in place.  A FIFO of the test's own, so a regression cannot harm the machine.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    assert main(["topo", "export-ibnet", TOPO, "-o", str(fifo)]) == 0
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and received[0].startswith(b"# fat-tree-k4")
