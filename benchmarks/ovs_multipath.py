"""Which OpenFlow mechanism spreads what, on this Open vSwitch (userspace datapath): the measurement behind
the routing policies' design (docs/policies.md).

One bridge (`datapath_type=netdev`) with an input port fed from a network namespace and four output ports;
N UDP packets sent into it that differ only in their source port (what a spraying RoCE sender varies), only
in their IPv4 source (different flows), or only in their source MAC; the output ports' transmit counters
say where they went, and the datapath how many megaflows it needed.  Mechanisms:

* `of13_select`: an OpenFlow 1.3 select group with four buckets (no selection method: OVS's default);
* `of15_dp_hash`: OpenFlow 1.5, `selection_method=dp_hash` (the datapath's 5-tuple hash, 16-entry table);
* `of15_hash_5tuple`: OpenFlow 1.5, `selection_method=hash,fields(ip_src,ip_dst,udp_src,udp_dst)`;
* `of13_masked_udp_src`: OpenFlow 1.3 flows matching `udp_src=i/0x3`, one per output (a slot table).

    python -m benchmarks.ovs_multipath --out benchmarks/results/ovs_multipath.json [--packets 1024]

Creates only `fl15mp*` names (bridge, veths, namespace) and removes them.  Needs root and OVS.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from benchmarks.out import out_file, write_out
from emulation.ovs import OvsDaemon, ovs_available

ROOT = Path(__file__).resolve().parents[1]

TAG = "fl15mp"
BRIDGE, NS, IN_NS, IN_BR = f"{TAG}br", f"{TAG}ns", f"{TAG}i0", f"{TAG}i1"
OUTS = [f"{TAG}o{i}" for i in range(1, 5)]
SINKS = [f"{TAG}p{i}" for i in range(1, 5)]
PORTS = [2, 3, 4, 5]
BUCKETS = ",".join(f"bucket=watch_port:{p},actions=output:{p}" for p in PORTS)
MECHANISMS: dict[str, tuple[str | None, str, list[str]]] = {
    "of13_select": (
        f"group_id=1,type=select,{BUCKETS}",
        "OpenFlow13",
        ["priority=10,in_port=1,actions=group:1"],
    ),
    "of15_dp_hash": (
        f"group_id=1,type=select,selection_method=dp_hash,{BUCKETS.replace('bucket=', 'bucket=weight:1,')}",
        "OpenFlow15",
        ["priority=10,in_port=1,actions=group:1"],
    ),
    "of15_hash_5tuple": (
        f"group_id=1,type=select,selection_method=hash,fields(ip_src,ip_dst,udp_src,udp_dst),{BUCKETS}",
        "OpenFlow15",
        ["priority=10,in_port=1,actions=group:1"],
    ),
    "of13_masked_udp_src": (
        None,
        "OpenFlow13",
        [f"priority=10,in_port=1,udp,udp_src={i}/0x3,actions=output:{p}" for i, p in enumerate(PORTS)],
    ),
}


def _run(argv: list[str], **kwargs: Any) -> str:
    done: subprocess.CompletedProcess[str] = subprocess.run(
        argv, check=True, capture_output=True, text=True, **kwargs
    )
    return done.stdout


def build() -> None:
    _run(["ip", "netns", "add", NS])
    _run(["ip", "link", "add", IN_NS, "type", "veth", "peer", "name", IN_BR])
    _run(["ip", "link", "set", IN_NS, "netns", NS])
    _run(["ip", "netns", "exec", NS, "ip", "link", "set", IN_NS, "up"])
    _run(["ip", "link", "set", IN_BR, "up"])
    _run(["ovs-vsctl", "add-br", BRIDGE, "--", "set", "bridge", BRIDGE, "datapath_type=netdev",
          "fail_mode=secure", "protocols=OpenFlow13,OpenFlow15"])  # fmt: skip
    _run(["ovs-vsctl", "add-port", BRIDGE, IN_BR, "--", "set", "interface", IN_BR, "ofport_request=1"])
    for out, sink, port in zip(OUTS, SINKS, PORTS, strict=True):
        _run(["ip", "link", "add", out, "type", "veth", "peer", "name", sink])
        for dev in (out, sink):
            _run(["ip", "link", "set", dev, "up"])
        _run(["ovs-vsctl", "add-port", BRIDGE, out, "--", "set", "interface", out, f"ofport_request={port}"])


def teardown() -> None:
    subprocess.run(["ovs-vsctl", "--if-exists", "del-br", BRIDGE], check=False, capture_output=True)
    for dev in (*OUTS, IN_BR):
        subprocess.run(["ip", "link", "del", dev], check=False, capture_output=True)
    subprocess.run(["ip", "netns", "del", NS], check=False, capture_output=True)


def tx_packets() -> dict[int, int]:
    """Packets each output port sent, from the kernel's counters of its veth (OVS's own port statistics
    of a netdev port can lag or read zero)."""
    return {
        port: int((Path("/sys/class/net") / out / "statistics" / "tx_packets").read_text())
        for out, port in zip(OUTS, PORTS, strict=True)
    }


def frames(kind: str, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        mac, ip, sport = "02:00:00:00:00:01", "10.0.0.1", 0xC000
        if kind == "udp_src":
            sport = 0xC000 + i
        elif kind == "ip_src":
            ip = f"10.{1 + i // 250 // 250}.{i // 250 % 250}.{i % 250 + 1}"
        else:
            mac = f"02:00:00:{i // 65536:02x}:{i // 256 % 256:02x}:{i % 256:02x}"
        packet = (
            Ether(src=mac, dst="02:00:00:00:00:02")
            / IP(src=ip, dst="10.0.0.2")
            / UDP(sport=sport, dport=4791)
        )
        out.append(bytes(packet / bytes(64)))
    return out


_SENDER = (
    "import pickle, socket, sys, time\n"
    "s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind((sys.argv[1], 0))\n"
    "for i, f in enumerate(pickle.load(sys.stdin.buffer)):\n"
    "    s.send(f)\n"
    "    if i % 8 == 7: time.sleep(0.001)\n"
)


def measure(kind: str, n: int) -> dict[str, Any]:
    before = tx_packets()
    payload = pickle.dumps(frames(kind, n))
    subprocess.run(
        ["ip", "netns", "exec", NS, sys.executable, "-c", _SENDER, IN_NS], input=payload, check=True
    )
    time.sleep(0.5)
    after = tx_packets()
    split = {p: after.get(p, 0) - before.get(p, 0) for p in PORTS}
    even = n / len(PORTS)
    return {
        "per_port": split,
        "delivered": sum(split.values()),
        "max_over_even": round(max(split.values()) / even, 3),
        "ports_used": sum(1 for v in split.values() if v),
    }


def megaflows() -> int:
    """Datapath flows (megaflows) entering from our input port: what one mechanism costs the fast path."""
    port = None
    for line in _run(["ovs-appctl", "dpctl/show"]).splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "port" and words[2] == IN_BR:
            port = words[1].rstrip(":")
    flows = _run(["ovs-appctl", "dpctl/dump-flows", "netdev@ovs-netdev"]).splitlines()
    return sum(
        1
        for line in flows
        if port is not None and (f"in_port({port})" in line or f"in_port({IN_BR})" in line)
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--packets", type=int, default=1024)
    parser.add_argument("--out", type=out_file)
    args = parser.parse_args()
    reason = ovs_available()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    daemon = OvsDaemon()
    daemon.ensure_running()
    report: dict[str, Any] = {
        "ovs": _run(["ovs-vsctl", "--version"]).splitlines()[0],
        "packets": args.packets,
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "mechanisms": {},
    }
    teardown()
    try:
        build()
        for name, (group, version, flows) in MECHANISMS.items():
            _run(["ovs-ofctl", "-O", version, "del-flows", BRIDGE])
            subprocess.run(
                ["ovs-ofctl", "-O", version, "del-groups", BRIDGE], check=False, capture_output=True
            )
            if group:
                _run(["ovs-ofctl", "-O", version, "add-group", BRIDGE, group])
            for flow in flows:
                _run(["ovs-ofctl", "-O", version, "add-flow", BRIDGE, flow])
            time.sleep(0.5)
            result: dict[str, Any] = {k: measure(k, args.packets) for k in ("udp_src", "ip_src", "eth_src")}
            result["megaflows_after"] = megaflows()
            report["mechanisms"][name] = result
    finally:
        teardown()
        daemon.stop_if_started()
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    if args.out:
        write_out(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
