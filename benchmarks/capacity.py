"""The emulator's capacity beside its anchor: what one Open vSwitch bridge forwards on this machine, and
what a whole fabric carries cleanly, in one run.

* **anchor** — one netdev bridge (the emulator's datapath) with two ports, each a veth into a network
  namespace made here; 512-byte frames from a Python packet socket in one namespace, counted by the kernel
  at the other (`rx_packets`): the ceiling of one hop.  For every port type this Open vSwitch offers of
  `system` (what the emulator uses) and `afxdp-nonpmd` (AF_XDP, generic mode, polled by the main thread).
  A run whose bridge forwarded all but 2 % of what was sent is `sender_limited`: the bridge's ceiling is
  higher than that figure.
* **fabric** — `fabriclab emulate calibrate` of a topology (`emulation.calibrate`, unshaped),
  `--calibrations` times: clean pkt/s per host and in total.  On k=4 each packet of the half-shift
  crosses five switches, so the fabric forwards five times its total: compare that with the anchor.

    python -m benchmarks.capacity --out benchmarks/results/capacity.json [--runs 5] [--seconds 3]
        [--topology topologies/fat-tree-k4.yaml] [--calibrations 1]

Needs root, Open vSwitch and Mininet's tools (as `emulate up` does).  Everything it creates is named
`fc<4 hex>...` and removed on the way out.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.out import emit, out_file, percentiles

ROOT = Path(__file__).resolve().parents[1]
PORT_TYPES = ("system", "afxdp-nonpmd")
FRAME_BYTES = 512


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()[-300:]}")
    return done.stdout


def send_frames(ifname: str, seconds: float) -> int:
    """Raw 512-byte UDP/IPv4 frames out of `ifname` as fast as one Python loop can: how many were sent."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((ifname, 0))
    payload = FRAME_BYTES - 14 - 28
    eth = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00"
    src, dst = b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02"
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + payload, 0, 0, 64, 17, 0, src, dst)
    frame = eth + ip + struct.pack("!HHHH", 5000, 5001, 8 + payload, 0) + bytes(payload)
    send = sock.send
    sent = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            try:
                send(frame)
                sent += 1
            except OSError:  # ENOBUFS: the frame was not sent
                pass
    return sent


class Anchor:
    """Two namespaces, two veth pairs and one bridge, all named after a fresh prefix."""

    def __init__(self) -> None:
        self.prefix = "fc" + secrets.token_hex(2)
        p = self.prefix
        self.ns = (f"{p}-a", f"{p}-b")
        self.inner = (f"{p}a0", f"{p}b0")  # in the namespaces
        self.outer = (f"{p}a1", f"{p}b1")  # on the bridge
        self.bridge = f"{p}br"

    def build(self, port_type: str) -> None:
        for ns, inner, outer in zip(self.ns, self.inner, self.outer, strict=True):
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer)
            _run("ip", "-n", ns, "link", "set", inner, "up")
            _run("ip", "link", "set", outer, "up")
        kind = [] if port_type == "system" else [f"type={port_type}", "options:xdp-mode=generic"]
        _run("ovs-vsctl", "add-br", self.bridge, "--", "set", "bridge", self.bridge, "datapath_type=netdev",
             "fail_mode=secure", "protocols=OpenFlow13",
             "--", "add-port", self.bridge, self.outer[0], "--", "set", "interface", self.outer[0],
             "ofport_request=1", *kind,
             "--", "add-port", self.bridge, self.outer[1], "--", "set", "interface", self.outer[1],
             "ofport_request=2", *kind)  # fmt: skip
        _run("ovs-ofctl", "-O", "OpenFlow13", "add-flow", self.bridge, "in_port=1,actions=output:2")
        for outer in self.outer:
            error = _run("ovs-vsctl", "get", "interface", outer, "error").strip()
            if error not in ("[]", '""'):
                raise RuntimeError(f"{port_type} port {outer}: {error}")

    def received(self) -> int:
        path = f"/sys/class/net/{self.inner[1]}/statistics/rx_packets"
        return int(_run("ip", "netns", "exec", self.ns[1], "cat", path))

    def run(self, seconds: float) -> tuple[float, float]:
        """(sent, forwarded) frames a second over `seconds`."""
        before = self.received()
        sender = [sys.executable, "-m", "benchmarks.capacity", "--sender", self.inner[0], str(seconds)]
        sent = int(_run("ip", "netns", "exec", self.ns[0], *sender))
        time.sleep(0.2)  # frames still in flight
        return sent / seconds, (self.received() - before) / seconds

    def remove(self) -> None:
        _run("ovs-vsctl", "--if-exists", "del-br", self.bridge, check=False)
        for ns, outer in zip(self.ns, self.outer, strict=True):
            _run("ip", "netns", "del", ns, check=False)
            _run("ip", "link", "del", outer, check=False)


def port_types_here() -> list[str]:
    from emulation.fastports import offered_types  # noqa: PLC0415 - with the emulator, as below

    offered = offered_types()
    return [t for t in PORT_TYPES if t == "system" or t in offered]


def anchor(runs: int, seconds: float) -> dict[str, Any]:
    result: dict[str, Any] = {"frame_bytes": FRAME_BYTES, "seconds_per_run": seconds, "runs": runs}
    for port_type in port_types_here():
        net = Anchor()
        try:
            net.build(port_type)
            pairs = [net.run(seconds) for _ in range(runs)]
        finally:
            net.remove()
        sent, forwarded = [p[0] for p in pairs], [p[1] for p in pairs]
        result[port_type] = {
            "forwarded_pps": percentiles(forwarded, digits=0),
            "sent_pps": percentiles(sent, digits=0),
            "sender_limited_runs": sum(1 for s, f in pairs if f >= 0.98 * s),
        }
    return result


#: Fabric builds a calibration can measure: (shards, cables inside a shard, switch ports) as `emulate up
#: --shards N --shard-cables C --ports P` builds them.
BUILDS: dict[str, tuple[int, str, str]] = {
    "packet-sockets": (1, "auto", "system"),  # the default build: one OVS, veth cables, packet sockets
    "afxdp": (1, "auto", "afxdp"),  # the same with AF_XDP ports
    "afxdp-patch": (1, "patch", "afxdp"),  # one shard, patch cables, AF_XDP ports on the host cables
}


def fabric(
    topology: Path, calibrations: int, build: str = "packet-sockets", shards: int = 0
) -> dict[str, Any]:
    """`calibrations` calibrations of `topology` as `build` builds it (`shards` > 0 overrides its count)."""
    from emulation import calibrate  # noqa: PLC0415 - the emulator only when a fabric is measured
    from topologies.loader import load_topology  # noqa: PLC0415

    count, cables, ports = BUILDS[build]
    count = shards or count
    loaded = load_topology(topology)
    runs = []
    for _ in range(calibrations):
        with tempfile.TemporaryDirectory(prefix="fabriclab-capacity-") as work:
            runs.append(
                calibrate.calibrate(
                    topology.resolve(),
                    loaded,
                    Path(work),
                    shards=count,
                    cables=cables,
                    ports=ports,
                    progress=lambda line: print(line, file=sys.stderr),
                )
            )
    per_host = [r["per_host_pps"] for r in runs]
    total = [r["total_pps"] for r in runs]
    return {
        "topology": str(topology),
        "summary": loaded.summary(),
        "build": {
            "name": build,
            "shards": count,
            "shard_cables": cables,
            "ports": runs[0]["ports"] if runs else ports,
        },
        "calibrations": calibrations,
        "per_host_pps": percentiles(per_host, digits=0),
        "total_pps": percentiles(total, digits=0),
        # each packet of the half-shift crosses this many switches: what the datapath forwards in total
        "switch_hops": _hops(loaded),
        "runs": [
            {k: r[k] for k in ("per_host_pps", "total_pps", "duration_s", "machine", "steps")} for r in runs
        ],
    }


def _hops(loaded: Any) -> int:
    """Switches on the longest half-shift path: 2 per tier below the top, plus the top (k=4: 5)."""
    tiers = {getattr(s, "tier", None) for s in loaded.switches} - {None}
    return 2 * len(tiers) - 1 if tiers else 1


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--sender"]:  # inside the sending namespace
        print(send_frames(args_in[1], float(args_in[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_file, help="write the JSON here (else stdout)")
    parser.add_argument("--runs", type=int, default=5, help="anchor runs per port type (default 5)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per anchor run (default 3)")
    parser.add_argument("--topology", type=Path, default=ROOT / "topologies" / "fat-tree-k4.yaml")
    parser.add_argument("--calibrations", type=int, default=1, help="calibrations per build (0: none)")
    parser.add_argument(
        "--builds",
        default="packet-sockets,afxdp-patch",
        help=f"comma-separated fabric builds to calibrate, of {', '.join(BUILDS)}",
    )
    parser.add_argument("--shards", type=int, default=0, help="shards for every build (default: the build's)")
    parser.add_argument("--no-anchor", action="store_true", help="fabric figures only")
    args = parser.parse_args(args_in)
    if not 1 <= args.runs <= 100 or not 0.5 <= args.seconds <= 60 or not 0 <= args.calibrations <= 20:
        parser.error("--runs 1..100, --seconds 0.5..60, --calibrations 0..20")
    builds = [b for b in args.builds.split(",") if b]
    if not builds or any(b not in BUILDS for b in builds) or not 0 <= args.shards <= 64:
        parser.error(f"--builds: comma-separated, of {', '.join(BUILDS)}; --shards 0..64")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces, Open vSwitch)")
    # SIGTERM as an exception, so every fabric built so far is torn down on the way out (a killed k=16
    # calibration once left 1,032 namespaces behind)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from emulation.ovs import OvsDaemon  # noqa: PLC0415

    daemon = OvsDaemon()
    load_before = os.getloadavg()
    try:
        daemon.ensure_running()
        report: dict[str, Any] = {"benchmark": "capacity"}
        if not args.no_anchor:
            report["anchor"] = anchor(args.runs, args.seconds)
        if args.calibrations:
            report["fabrics"] = [fabric(args.topology, args.calibrations, b, args.shards) for b in builds]
    finally:
        daemon.stop_if_started()
    report["machine"] = {
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
