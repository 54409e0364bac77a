"""The emulator's Prometheus metrics (`:8081/metrics` beside its REST API): what the emulated switches'
interfaces count, and how much headroom the emulator itself has left.

On 2 cores the emulator drops packets from CPU load long before the modelled links fill, so a result is
only worth reading next to these:

* `fabriclab_emulator_port_*_total{switch,port,tier}` — kernel counters of every switch-side interface
  (`/proc/net/dev`, one read per scrape);
* `fabriclab_emulator_shaper_drops_total{switch,port,tier}` and `..._shaper_backlog_bytes` — the shaping
  qdisc (HTB) of each port, i.e. drops **on the modelled links** (their buffers overflowing: the fabric);
* `fabriclab_emulator_datapath_drops_total{reason}` — Open vSwitch's own datapath drop counters, and
  `fabriclab_emulator_interface_drops_total` — drops by the kernel outside any shaper: both are drops
  **inside the emulator** (not a property of the fabric under test);
* `fabriclab_emulator_vswitchd_cpu_seconds_total`, `fabriclab_emulator_load1`, `fabriclab_emulator_cpus` —
  how busy the machine doing the emulating is.

Headroom measured by scenario runs (see `HeadroomSource`) is exported as `fabriclab_emulator_headroom_*`
gauges: whoever measures it registers a source; nothing here guesses it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: /proc/net/dev columns: receive bytes packets errs drop fifo frame compressed multicast, transmit bytes ...
_RX = {"bytes": 0, "packets": 1, "errors": 2, "drops": 3}
_TX = {"bytes": 8, "packets": 9, "errors": 10, "drops": 11}
VSWITCHD_PID = Path("/var/run/openvswitch/ovs-vswitchd.pid")


@dataclass(frozen=True)
class HeadroomReading:
    """One headroom figure, e.g. ("max_pps", "packets per second the emulator forwards without loss", x)."""

    name: str
    help: str
    value: float


#: A headroom measurement's latest readings (called at every scrape; must be quick and never raise).
HeadroomSource = Callable[[], Iterable[HeadroomReading]]


@dataclass(frozen=True)
class SwitchPort:
    switch: str
    port: int
    tier: str
    interface: str


def read_net_dev(path: Path = Path("/proc/net/dev")) -> dict[str, list[int]]:
    """Interface -> the 16 counters of /proc/net/dev (this process's network namespace)."""
    result = {}
    for line in path.read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        values = rest.split()
        if len(values) >= 16:
            result[name.strip()] = [int(v) for v in values[:16]]
    return result


@dataclass(frozen=True)
class SwitchDaemon:
    """Where an emulator's switches run: a network namespace (None: this process's) and the pidfile and
    control socket of its ovs-vswitchd (None: the system's).  A sharded fabric has one per shard."""

    netns: str | None = None
    pidfile: Path | None = None
    ctl: str | None = None

    def net_dev(self) -> dict[str, list[int]]:
        if self.netns is None:
            return read_net_dev()
        pid = _pid(self.pidfile)
        return read_net_dev(Path(f"/proc/{pid}/net/dev")) if pid is not None else {}


def _pid(pidfile: Path | None) -> int | None:
    try:
        return int((pidfile or VSWITCHD_PID).read_text().strip())
    except (OSError, ValueError):
        return None


def read_shapers(netns: str | None = None) -> dict[str, dict[str, int]]:
    """Root qdisc statistics per interface (`tc -s -j qdisc show`): drops, backlog, packets."""
    done = subprocess.run(
        ["tc", *(["-n", netns] if netns else []), "-s", "-j", "qdisc", "show"],
        capture_output=True, text=True, check=False, timeout=10,
    )  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    result = {}
    for entry in json.loads(done.stdout):
        if entry.get("root") and entry.get("kind") in ("htb", "tbf"):
            result[entry["dev"]] = {k: int(entry.get(k, 0)) for k in ("drops", "backlog", "packets")}
    return result


_COVERAGE = re.compile(r"^datapath_drop_(\w+)\s.*total:\s*(\d+)\s*$")


def read_datapath_drops(ctl: str | None = None) -> dict[str, int]:
    """Open vSwitch's datapath drop counters by reason (only those that ever counted are listed)."""
    try:
        done = subprocess.run(
            ["ovs-appctl", *(["-t", ctl] if ctl else []), "coverage/show"],
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    drops = {}
    for line in done.stdout.splitlines():
        match = _COVERAGE.match(line.strip())
        if match:
            drops[match[1]] = int(match[2])
    return drops


def vswitchd_cpu_seconds(pidfile: Path | None = None) -> float | None:
    try:
        pid = int((pidfile or VSWITCHD_PID).read_text().strip())
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class EmulatorCollector(Collector):
    def __init__(
        self,
        ports: Sequence[SwitchPort],
        headroom: Sequence[HeadroomSource] = (),
        daemons: Sequence[SwitchDaemon] = (SwitchDaemon(),),
    ) -> None:
        self.ports, self.headroom, self.daemons = list(ports), list(headroom), list(daemons)

    def add_headroom(self, source: HeadroomSource) -> None:
        self.headroom.append(source)

    def collect(self) -> Iterator[Metric]:
        labels = ["switch", "port", "tier"]
        dev: dict[str, list[int]] = {}
        shapers: dict[str, dict[str, int]] = {}
        for daemon in self.daemons:
            dev.update(daemon.net_dev())
            shapers.update(read_shapers(daemon.netns))
        rows = [(p, dev[p.interface]) for p in self.ports if p.interface in dev]
        for direction, columns in (("receive", _RX), ("transmit", _TX)):
            for what, column in columns.items():
                family = CounterMetricFamily(
                    f"fabriclab_emulator_port_{direction}_{what}",
                    f"{what.capitalize()} {direction}d by an emulated switch's interface (kernel counters)",
                    labels=labels,
                )
                for port, values in rows:
                    family.add_metric([port.switch, str(port.port), port.tier], values[column])
                yield family
        internal = CounterMetricFamily(
            "fabriclab_emulator_interface_drops",
            "Packets the kernel dropped at emulated switch interfaces, outside any shaper (in the emulator)",
            labels=labels,
        )
        for port, values in rows:
            internal.add_metric([port.switch, str(port.port), port.tier], values[3] + values[11])
        yield internal
        drops = CounterMetricFamily(
            "fabriclab_emulator_shaper_drops",
            "Packets dropped by a port's shaping queue: the modelled link's buffer overflowing",
            labels=labels,
        )
        backlog = GaugeMetricFamily(
            "fabriclab_emulator_shaper_backlog_bytes", "Bytes queued in a port's shaping queue", labels=labels
        )
        for port in self.ports:
            shaper = shapers.get(port.interface)
            if shaper is not None:
                drops.add_metric([port.switch, str(port.port), port.tier], shaper["drops"])
                backlog.add_metric([port.switch, str(port.port), port.tier], shaper["backlog"])
        yield drops
        yield backlog
        datapath = CounterMetricFamily(
            "fabriclab_emulator_datapath_drops",
            "Open vSwitch datapath drops by reason (the whole OVS instance: inside the emulator)",
            labels=["reason"],
        )
        reasons: dict[str, int] = {}
        for daemon in self.daemons:
            for reason, count in read_datapath_drops(daemon.ctl).items():
                reasons[reason] = reasons.get(reason, 0) + count
        for reason, count in sorted(reasons.items()):
            datapath.add_metric([reason], count)
        yield datapath
        cpus_s = [c for d in self.daemons if (c := vswitchd_cpu_seconds(d.pidfile)) is not None]
        cpu = sum(cpus_s) if cpus_s else None
        if cpu is not None:
            family = CounterMetricFamily(
                "fabriclab_emulator_vswitchd_cpu_seconds", "CPU time of ovs-vswitchd (rate 1.0 = a core busy)"
            )
            family.add_metric([], cpu)
            yield family
        load1 = GaugeMetricFamily(
            "fabriclab_emulator_load1", "1-minute load average of the emulating machine"
        )
        load1.add_metric([], os.getloadavg()[0])
        yield load1
        cpus = GaugeMetricFamily("fabriclab_emulator_cpus", "CPUs of the emulating machine")
        cpus.add_metric([], float(os.cpu_count() or 1))
        yield cpus
        yield from self._headroom()

    def _headroom(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for source in self.headroom:
            for reading in source():
                name = f"fabriclab_emulator_headroom_{reading.name}"
                if name in seen or not re.fullmatch(r"[a-z_][a-z0-9_]*", reading.name):
                    continue
                seen.add(name)
                family = GaugeMetricFamily(name, reading.help)
                family.add_metric([], reading.value)
                yield family


def emulator_registry(
    ports: Sequence[SwitchPort],
    headroom: Sequence[HeadroomSource] = (),
    daemons: Sequence[SwitchDaemon] = (SwitchDaemon(),),
) -> tuple[CollectorRegistry, EmulatorCollector]:
    registry = CollectorRegistry()
    collector = EmulatorCollector(ports, headroom, daemons)
    registry.register(collector)
    return registry, collector


__all__ = [
    "EmulatorCollector",
    "HeadroomReading",
    "HeadroomSource",
    "SwitchDaemon",
    "SwitchPort",
    "emulator_registry",
    "read_net_dev",
]
