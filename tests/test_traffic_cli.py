"""`fabriclab traffic plan|pcap` end to end: figures, traces, pcaps whose every ICRC is valid, and bad
input refused with the field named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.utils import rdpcap

from traffic.fastpath import icrc_ok
from traffic.trace import read_trace


def fabriclab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabriclab", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_plan_ring_allreduce_as_json_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "ring.jsonl"
    done = fabriclab("traffic", "plan", "allreduce", "--ranks", "h1..h16", "--size", "256MiB", "--json",
                     "--trace", str(trace))  # fmt: skip
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert (info["steps"], info["ranks"], info["bus_factor"]) == (30, 16, 1.875)
    assert info["total_bytes"] == 2 * 15 * 256 * 2**20
    records = read_trace(trace)
    assert len(records) == 30 * 16 and sum(r.size_bytes for r in records) == info["total_bytes"]


def test_plan_kv_transfer_sizes() -> None:
    done = fabriclab("traffic", "plan", "kv-transfer", "--model", "llama3-70b", "--prompt-tokens", "4096",
                     "--prefill", "h1,h2", "--decode", "h9", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["total_bytes"] == 4096 * 320 * 1024 and info["peak_senders"] == 2


def test_pcap_of_a_kv_transfer_is_valid_roce(tmp_path: Path) -> None:
    out = tmp_path / "kv.pcap"
    done = fabriclab("traffic", "pcap", "kv-transfer", "--model", "llama3-70b", "--prompt-tokens", "64",
                     "--prefill", "h1", "--decode", "h2", "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    frames = rdpcap(str(out))
    assert len(frames) == 80 * 4 * 64  # layers x pages x (64 KiB page / 1 KiB MTU)
    assert all(icrc_ok(bytes(f)) for f in frames)
    if shutil.which("tshark"):
        summary = subprocess.run(
            ["tshark", "-r", str(out)], capture_output=True, text=True, check=True
        ).stdout
        assert summary.count("RC RDMA Write First") == 320 and summary.count("RC RDMA Write Last") == 320


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "allreduce", "--ranks", "h1..h99", "--size", "1MiB"], "ranks: unknown host"),
        (["plan", "allreduce", "--ranks", "h1..h4", "--size", "12XB"], "size: cannot parse '12XB'"),
        (["plan", "allreduce", "--algo", "hd", "--ranks", "h1..h6", "--size", "1MiB"],
         "ranks: halving-doubling"),
        (["plan", "alltoall", "--algo", "ring", "--ranks", "h1..h4", "--size", "1MiB"], "algo:"),
        (["plan", "kv-transfer", "--model", "nope", "--prompt-tokens", "4", "--prefill", "h1",
          "--decode", "h2"], "model: unknown model 'nope'"),
        (["plan", "kv-transfer", "--layers", "8", "--prompt-tokens", "4", "--prefill", "h1",
          "--decode", "h2"],
         "kv_heads"),
        (["pcap", "allreduce", "--ranks", "h1..h4", "--size", "1KiB"], "-o/--output"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(args: list[str], message: str) -> None:
    done = fabriclab("traffic", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_plan_incast_permutation_and_hotspot() -> None:
    done = fabriclab(
        "traffic", "plan", "incast", "--ranks", "h1..h8", "--to", "h9", "--size", "1MiB", "--json"
    )
    incast = json.loads(done.stdout)
    assert (incast["transfers"], incast["total_bytes"]) == (8, 8 * 2**20)
    runs = [
        fabriclab(
            "traffic", "plan", "permutation", "--ranks", "h1..h16", "--size", "1KiB", "--seed", seed
        ).stdout
        for seed in ("1", "1", "2")
    ]
    assert runs[0] == runs[1] != runs[2]
    hot = fabriclab(
        "traffic", "plan", "hotspot", "--ranks", "h1..h16", "--to", "h3", "--size", "1KiB", "--json"
    )
    assert hot.returncode == 0 and json.loads(hot.stdout)["transfers"] == 16
    missing = fabriclab("traffic", "plan", "hotspot", "--ranks", "h1..h16", "--size", "1KiB")
    assert missing.returncode == 2 and "to: --to is required" in missing.stderr
