"""Routing-policy benchmark on real Open vSwitch (userspace datapath).  Writes one JSON document.

1. `switch`: policy switch time on a running k=8 fat-tree (80 bridges, 128 host namespaces): `PUT
   /routing/policy` until the reply, which comes once every switch confirmed the new tables by barrier
   (make and break) — per transition (static -> ecmp -> spray -> adaptive -> static ...), n rounds.
   Baseline in the same process: a PUT that changes nothing (same policy): REST, recompute, persist and
   an empty rollout, the overhead every change pays.
2. `reaction`: adaptive routing's reaction on a k=4 fat-tree: a flow with a fixed source port fills 60% of
   one leaf uplink and a sprayed flow adds 30% to both; from the moment both start sending (onset) to the
   adaptive move that relieves the hot uplink being decided (`decided_s`: the counter sample it came from)
   and installed on the switch (`moved_s`: barrier-confirmed).  n trials, weights reset between them.
   `flow_mods_per_step`: flow-mods of every adaptive move seen (its OpenFlow cost).
3. `compare`: wall time of `fabriclab compare` on scenarios/permutation-k4.yaml with all four policies (the
   budget is 10 minutes), and whether the emulator carried each run cleanly.

    python -m benchmarks.policies --out benchmarks/results/policies.json            # everything
    python -m benchmarks.policies --parts reaction --n 5 --out /tmp/p.json          # a quick look

The machine's load average is recorded before and after each part: figures from a busy machine say so.
Needs root and Open vSwitch (Mininet for `compare`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.out import out_file, percentiles, write_out
from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess
from emulation.ovs import OvsDaemon, OvsFabric, ovs_available
from topologies.generators import fat_tree
from topologies.loader import dump_yaml

ROOT = Path(__file__).resolve().parents[1]

POLICIES = ["static", "ecmp", "spray", "adaptive"]
#: The reaction trials tell the controller links carry 8 Mb/s: 1000 packets/s of 1000 bytes fill one.
SCALE = "400G=8M"


def _pcts(values: list[float], digits: int = 3) -> dict[str, float]:
    return percentiles(values, digits=digits, mean=True) or {"n": 0}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Lab:
    """A k-ary fat-tree of OVS bridges and host namespaces with the controller as its own process."""

    def __init__(self, k: int, workdir: Path, *controller_args: str) -> None:
        self.fabric = fat_tree(k)
        topology = workdir / f"ft{k}.yaml"
        topology.write_text(dump_yaml(self.fabric))
        self.addresses = SubnetManager(self.fabric).addresses.as_strings()
        self.ctl = ControllerProcess(topology, workdir / f"state{k}", workdir / f"controller{k}.log",
                                     "--lldp-interval", "3600", *controller_args)  # fmt: skip
        self.net = OvsFabric(self.fabric, self.addresses, controller=None)
        self.bringup_s = 0.0

    def __enter__(self) -> Lab:
        start = time.perf_counter()
        self.ctl.start()
        try:
            self.net.up()
            self.net.set_controller(self.ctl.openflow)
            self.ctl.ready(len(self.fabric.switches), timeout_s=600)
        except BaseException:
            self.__exit__()
            raise
        self.bringup_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.ctl.proc is not None:
                self.ctl.stop()
        finally:
            self.net.down()

    def put_policy(self, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        status, reply = self.ctl.request("PUT", "routing/policy", json.dumps(body))
        elapsed = time.perf_counter() - start
        if status != 200:
            raise RuntimeError(f"PUT routing/policy {body}: {status} {reply}")
        return elapsed, reply

    def events(self, since: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.ctl.get(f"events?since={since}&limit=1000")
        return found

    def last_event(self) -> int:
        events = self.ctl.get("events")
        return int(events[-1]["id"]) if events else 0


# --- 1. policy switch time ----------------------------------------------------------------------------------


def switch_time(k: int, rounds: int, workdir: Path) -> dict[str, Any]:
    load_before = _load()
    with Lab(k, workdir) as lab:
        per: dict[str, list[float]] = {}
        installed: dict[str, list[float]] = {}
        mods: dict[str, list[float]] = {}
        baseline: list[float] = []
        current = "static"
        for _ in range(rounds):
            for policy in [*POLICIES[1:], POLICIES[0]]:
                key = f"{current}->{policy}"
                elapsed, event = lab.put_policy({"policy": policy})
                per.setdefault(key, []).append(elapsed * 1000)
                installed.setdefault(key, []).append(float(event["cleaned_ms"]))
                mods.setdefault(key, []).append(float(event["flow_mods"]))
                current = policy
            elapsed, event = lab.put_policy({"policy": current})  # nothing changes: the overhead
            baseline.append(elapsed * 1000)
        return {
            "fabric": lab.fabric.summary(),
            "bringup_s": round(lab.bringup_s, 1),
            "rounds": rounds,
            "rest_to_all_switches_confirmed_ms": {k_: _pcts(v, 1) for k_, v in per.items()},
            "controller_cleaned_ms": {k_: _pcts(v, 1) for k_, v in installed.items()},
            "flow_mods": {k_: _pcts(v, 0) for k_, v in mods.items()},
            "baseline_no_change_ms": _pcts(baseline, 1),
            "load_before": load_before,
            "load_after": _load(),
        }


# --- 2. adaptive reaction -----------------------------------------------------------------------------------


def reaction(trials: int, workdir: Path) -> dict[str, Any]:
    load_before = _load()
    with Lab(4, workdir, "--capacity-scale", SCALE) as lab:
        body = {"policy": "adaptive", "interval_ms": 100, "threshold": 0.7, "hysteresis": 0.1}
        lab.put_policy(body)
        ip = lab.net.address_of("h16")
        assert all(lab.net.ping_all([("h1", "h16"), ("h2", "h16")]).values())  # ARP resolved
        probe = [sys.executable, "-m", "emulation.probe", "send", ip, "7000"]
        decided, moved, steps, missed = [], [], [], 0
        for trial in range(trials):
            lab.put_policy({"policy": "spray"})  # even weights again
            lab.put_policy(body)
            time.sleep(0.35)  # a few clean samples before the onset
            since = lab.last_event()
            procs = [
                lab.net.popen("h1", [*probe, "600", "2.5", "1000", "--sport", str(50001 + trial % 2)],
                              stdout=subprocess.PIPE, text=True),
                lab.net.popen("h2", [*probe, "600", "2.5", "1000", "--spray", str(trial)],
                              stdout=subprocess.PIPE, text=True),
            ]  # fmt: skip
            # the onset: when the later of the two senders sent its first packet (wall clock, as events are)
            onset = max(float(json.loads(p.communicate(timeout=30)[0])["start"]) for p in procs)
            moves = [e for e in lab.events(since) if e["kind"] == "adaptive_move" and "leaf1:" in e["reason"]]
            if moves:
                decided.append(moves[0]["detected_at"] - onset)
                moved.append(moves[0]["detected_at"] + moves[0]["installed_ms"] / 1000 - onset)
            else:
                missed += 1
            steps += [float(e["flow_mods"]) for e in lab.events(since) if e["kind"] == "adaptive_move"]
        return {
            "fabric": lab.fabric.summary(),
            "interval_ms": 100,
            "trials": trials,
            "trials_without_a_move": missed,
            "onset_to_decided_s": _pcts(decided),
            "onset_to_moved_s": _pcts(moved),
            "flow_mods_per_step": _pcts(steps, 1),
            "load_before": load_before,
            "load_after": _load(),
        }


# --- 3. the four-policy comparison --------------------------------------------------------------------------


def compare(workdir: Path) -> dict[str, Any]:
    from emulation.compare import run_compare  # noqa: PLC0415
    from labspec.scenario import load_scenario  # noqa: PLC0415

    load_before = _load()
    start = time.perf_counter()
    summary = run_compare(
        load_scenario(ROOT / "scenarios" / "permutation-k4.yaml"), POLICIES, workdir / "cmp"
    )
    seconds = time.perf_counter() - start
    return {
        "scenario": "scenarios/permutation-k4.yaml",
        "seconds": round(seconds, 1),
        "within_10_minutes": seconds < 600,
        "emulator_overloaded": {p: f["emulator_overloaded"] for p, f in summary["policies"].items()},
        "aggregate_goodput_mbps": {p: f["aggregate_goodput_mbps"] for p, f in summary["policies"].items()},
        "load_before": load_before,
        "load_after": _load(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="switch,reaction,compare")
    parser.add_argument("--n", type=int, default=20, help="rounds (switch) and trials (reaction), >= 20")
    parser.add_argument("--k", type=int, default=8, help="fat-tree of the switch-time part")
    parser.add_argument("--out", type=out_file, help="write the JSON here (else stdout)")
    args = parser.parse_args()
    reason = ovs_available()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count() or 0}, "n": args.n}
    daemon = OvsDaemon()
    daemon.ensure_running()
    try:
        with tempfile.TemporaryDirectory(prefix="fabriclab-policies-") as tmp:
            work = Path(tmp)
            if "switch" in parts:
                report["switch"] = switch_time(args.k, args.n, work)
            if "reaction" in parts:
                report["reaction"] = reaction(args.n, work)
            if "compare" in parts:
                report["compare"] = compare(work)
    finally:
        daemon.stop_if_started()
    text = json.dumps(report, indent=2)
    if args.out:
        write_out(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
