"""RoCEv2 sender benchmark: packets per second from one process, valid ICRC on every packet.  JSON.

Two network namespaces joined by a veth pair (created here, removed at the end).  In the same run:
the baseline — scapy building each packet (new PSN, scapy's ICRC) and sending it with `sendp` — and our
sender (`traffic.fastpath`: one prebuilt frame, PSN and ICRC patched per packet, AF_PACKET), each received
by `traffic.agent recv` in the other namespace, which verifies every ICRC and PSN.  Then a paced run at
`--rate` shows what the receiver takes without loss.

    python -m benchmarks.traffic [--count 300000] [--rate 100000] [--baseline 100]
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

MACS = ("02:fa:b1:00:00:01", "02:fa:b1:00:00:02")
IPS = ("10.0.0.1", "10.0.0.2")

SCAPY_BASELINE = """
import sys, time
from scapy.all import sendp
from scapy.contrib.roce import BTH
from traffic.roce import Endpoints, frame, op
ep = Endpoints(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], dqpn=7)
n = int(sys.argv[6])
start = time.perf_counter()
for psn in range(n):
    pkt = frame(ep, BTH(opcode=op("RC", "RDMA_WRITE_MIDDLE"), dqpn=7, psn=psn), payload=bytes(1024))
    sendp(pkt, iface=sys.argv[1], verbose=False)
print((time.perf_counter() - start))
"""


def sh(*argv: str, stdin: str | None = None) -> str:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True).stdout


def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def receive_while(
    ns: str, iface: str, expect: int, duration: float, sender: list[str]
) -> tuple[dict[str, Any], str]:
    recv = subprocess.Popen(
        in_ns(ns, sys.executable, "-m", "traffic.agent", "recv", iface, "--duration", str(duration),
              "--expect", str(expect)),
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
    out = subprocess.run(sender, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    result = json.loads(recv.communicate(timeout=duration + 30)[0])
    return result, out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--rate", type=float, default=100_000)
    parser.add_argument("--baseline", type=int, default=100, help="packets in the scapy baseline")
    args = parser.parse_args()
    tag = "fb" + secrets.token_hex(2)
    ns = (f"{tag}a", f"{tag}b")
    veth = (f"{tag}a0", f"{tag}b0")
    report: dict[str, Any] = {"frame_bytes": 14 + 20 + 8 + 12 + 1024 + 4}
    sh("ip", "-batch", "-", stdin="".join(f"netns add {n}\n" for n in ns)
       + f"link add {veth[0]} netns {ns[0]} type veth peer name {veth[1]} netns {ns[1]}\n")  # fmt: skip
    try:
        for i in range(2):
            sh("ip", "-n", ns[i], "link", "set", veth[i], "address", MACS[i], "up")
        time.sleep(0.5)
        agent_args = ["--src-mac", MACS[0], "--dst-mac", MACS[1], "--src-ip", IPS[0], "--dst-ip", IPS[1],
                      "--qp", "7", "--size", "1024"]  # fmt: skip
        base, out = receive_while(
            ns[1], veth[1], args.baseline, 120,
            in_ns(ns[0], sys.executable, "-c", SCAPY_BASELINE, veth[0], *MACS, *IPS, str(args.baseline)),
        )  # fmt: skip
        base_s = float(out.strip())
        report["scapy_sendp_baseline"] = {"packets": args.baseline, "pps": round(args.baseline / base_s, 1),
                                          "receiver": base["qps"].get("7")}  # fmt: skip
        fast, out = receive_while(
            ns[1], veth[1], args.count, 60,
            in_ns(ns[0], sys.executable, "-m", "traffic.agent", "send", veth[0], *agent_args,
                  "--count", str(args.count)),
        )  # fmt: skip
        sent = json.loads(out)
        report["fastpath_sender"] = {
            "packets": sent["sent"],
            "pps": round(sent["pps"]),
            "receiver": fast["qps"].get("7"),
        }
        report["ratio_vs_scapy"] = round(sent["pps"] / report["scapy_sendp_baseline"]["pps"], 1)
        report["receiver_paced"] = []
        for rate in (args.rate, args.rate * 0.7, args.rate * 0.5):
            paced_count = int(rate * 2)
            paced, out = receive_while(
                ns[1], veth[1], paced_count, 60,
                in_ns(ns[0], sys.executable, "-m", "traffic.agent", "send", veth[0], *agent_args,
                      "--count", str(paced_count), "--rate", str(rate)),
            )  # fmt: skip
            qp = paced["qps"].get("7", {})
            report["receiver_paced"].append(
                {"rate_pps": rate, "sent": json.loads(out)["sent"], "received": qp.get("received"),
                 "lost": qp.get("lost"), "bad_icrc": qp.get("bad_icrc"), "receiver_pps": qp.get("pps")}
            )  # fmt: skip
            if qp.get("lost") == 0:
                break
        lossless = [r["rate_pps"] for r in report["receiver_paced"] if r["lost"] == 0]
        report["receiver_lossless_pps"] = max(lossless) if lossless else None
        report["targets"] = {"sender_pps": 100_000, "ratio_vs_scapy": 20}
    finally:
        cleanup = "".join(f"netns del {n}\n" for n in ns)
        subprocess.run(
            ["ip", "-force", "-batch", "-"], input=cleanup, text=True, capture_output=True, check=False
        )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
