"""Scenario files: an experiment written down — fabric, controller settings, traffic, faults, timing, seed.

Validated like topology files, in layers: YAML syntax and duplicate keys, a strict schema (unknown keys
rejected with "did you mean"), then cross-references against the topology (hosts, ports and switches exist,
faults fall inside the run).  Every error names file, line and field; nothing runs until all of it passed.
The result is frozen.  Sections for what later issues add (RoCEv2 traffic, partitions, QoS, adaptive
routing) extend `traffic` kinds and `controller` keys without changing the rest.

```yaml
fabriclab: 1
name: link-failure
topology: ../topologies/fat-tree-k4.yaml     # relative to this file
scale: 400G=200M                             # link speeds -> what HTB shapes (optional)
controller: {engine: ftree, fast_failover: true, policy: adaptive, interval_ms: 100, threshold: 0.7}
duration_s: 8
repetitions: 1
seed: 7
poll_interval_s: 0.5                         # port counters for the utilisation heatmap
traffic:
  - {kind: udp, src: h1, dst: h16, rate_pps: 2000, size_bytes: 512}
  - {kind: udp-permutation, rate_pps: 500}   # every host sends to one other, seeded
  - {kind: udp-permutation, rate_pps: 300, leave: pod, flows_per_host: 2}   # every flow leaves its pod
  - {kind: udp-permutation, rate_pps: 300, pattern: shift, shift: 4}        # host i sends to host i+4
faults:
  - {at_s: 3, action: link_down, port: "leaf1:3"}
  - {at_s: 5, action: link_up, port: "leaf1:3"}
```

Entropy: a flow's UDP source port is what multipath policies hash on.  `entropy: policy` (the default)
follows the routing policy — one seeded source port per flow, or under a per-packet policy (spray,
adaptive) another port for every packet, as a RoCE NIC spraying over multipath does; `fixed` and `spray`
force one or the other (e.g. a legacy flow that cannot be sprayed).  Ports are seeded from the scenario's
seed and the flow's name, so every policy of a comparison sees the same traffic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from controller.formats.partitions_file import load_partitions
from controller.formats.qosload import load_policy
from controller.sm.engines import default_registry
from controller.sm.policies import PolicyChoice, PolicyError, PolicyParams, class_map, default_policies
from controller.sm.qos import QosPolicy
from labspec.ccspec import CongestionControl, DcqcnError, DcqcnSpec, dcqcn_params
from labspec.trafficspec import (
    PLAN_CHECK_RANKS,
    TRAFFIC_MODELS,
    Entropy,
    KvTransfer,
    RoceCollective,
    RoceIncast,
    RoceTraffic,
    Strict,
    TraceReplay,
    Traffic,
    UdpFlow,
    UdpPermutation,
    check_collective,
    check_incast,
    check_kv,
    check_trace,
    collective_plan,
    collective_ranks,
    incast_senders,
    trace_path,
)
from topologies.errors import InputError, read_input_file
from topologies.loader import load_topology
from topologies.model import Fabric, PortRef
from topologies.scale import Scale
from topologies.schema import Seed
from topologies.yamlio import AllowedKeys, Document, PathItem, load_document, validate
from traffic.dcqcn import DcqcnParams
from traffic.entropy import seeded_sports
from traffic.errors import TrafficError

#: Random permutations whose flows must leave their leaf or pod are drawn by rejection, at most this often.
MAX_SHUFFLES = 100_000


class ScenarioError(InputError):
    pass


class ControllerSpec(Strict):
    engine: str = "ftree"
    fast_failover: bool = True
    #: Legacy: true means policy ecmp when no policy is named.
    multipath: bool = False
    #: Routing policy and its parameters (names and checks from `controller.sm.policies`; `multipath: true`
    #: with the default policy is the legacy spelling of ecmp).
    policy: str = "static"
    interval_ms: int = 100
    threshold: float = 0.7
    hysteresis: float = 0.1
    #: Per-DSCP policy exceptions, {26: static}.
    classes: dict[int | str, str] | None = None

    def choice(self) -> PolicyChoice:
        """The routing policy this controller runs (validated: PolicyError naming the field)."""
        params = PolicyParams(self.interval_ms, self.threshold, self.hysteresis)
        name = "ecmp" if self.multipath and self.policy == "static" else self.policy
        return PolicyChoice(name, params, class_map(self.classes)).validate(default_policies())

    def controller_args(self) -> list[str]:
        """This choice as `fabriclab controller` options."""
        choice = self.choice()
        args = ["--engine", self.engine, "--policy", choice.name]
        args += [] if self.fast_failover else ["--no-fast-failover"]
        params = choice.params
        args += ["--interval-ms", str(params.interval_ms), "--threshold", str(params.threshold)]
        args += ["--hysteresis", str(params.hysteresis)]
        for dscp, name in choice.classes:
            args += ["--policy-class", f"{dscp}={name}"]
        return args


class Fault(Strict):
    at_s: Annotated[float, Field(ge=0)]
    action: Literal["link_down", "link_up", "switch_down", "switch_up"]
    port: str | None = None
    switch: str | None = None


class ScenarioSpec(Strict):
    fabriclab: Literal[1]
    name: str
    description: str | None = None
    topology: str
    scale: str | None = None
    #: Partitions the controller enforces: an OpenSM partitions.conf or YAML file, relative to this file.
    partitions: str | None = None
    controller: ControllerSpec = ControllerSpec()
    duration_s: Annotated[float, Field(gt=0, le=3600)]
    repetitions: Annotated[int, Field(ge=1, le=100)] = 1
    seed: Seed = 0
    poll_interval_s: Annotated[float, Field(ge=0.1, le=60)] = 0.5
    #: Queue of every shaped switch port, in packets (a switch's buffer); default: the interface's 1000.
    buffer_packets: Annotated[int, Field(ge=2, le=100_000)] | None = None
    #: What a shaped link may send above its rate after a pause (HTB's bucket); default 64 KB.
    burst_bytes: Annotated[int, Field(ge=1600, le=1 << 24)] | None = None
    settle_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    #: QoS policy file (relative to this file; docs/qos.md): the controller's and every switch port's queues.
    qos: str | None = None
    traffic: list[Traffic] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    #: Congestion control of the RoCE senders (labspec.ccspec): none (open loop) or dcqcn.
    cc: CongestionControl = "none"
    #: DCQCN parameter overrides at the modelled speed (used under `cc: dcqcn`, from the file or `--cc`).
    dcqcn: DcqcnSpec | None = None


class _Keys(AllowedKeys):
    def __init__(self, data: Any) -> None:
        self.data = data

    def for_path(self, path: Sequence[PathItem]) -> Sequence[str]:
        if not path:
            return list(ScenarioSpec.model_fields)
        if path == ("controller",):
            return list(ControllerSpec.model_fields)
        if path == ("dcqcn",):
            return list(DcqcnSpec.model_fields)
        if len(path) == 2 and path[0] == "faults":
            return list(Fault.model_fields)
        if len(path) == 2 and path[0] == "traffic" and isinstance(self.data, dict):
            try:
                kind = self.data["traffic"][path[1]].get("kind")
            except (KeyError, IndexError, TypeError, AttributeError):
                return ()
            model = TRAFFIC_MODELS.get(kind)
            return list(model.model_fields) if model else ()
        return ()


@dataclass(frozen=True)
class FlowPlan:
    """One concrete flow of a run (permutations expanded with the seed)."""

    name: str
    src: str
    dst: str
    rate_pps: float
    size_bytes: int
    start_s: float
    duration_s: float
    #: A fixed UDP source port, or (None) kernel-chosen; `spray` (an offset) gives every packet its own.
    sport: int | None = None
    spray: int | None = None
    dscp: int | None = None
    #: The traffic item (`traffic[job]`) the flow belongs to.
    job: int = 0

    @property
    def entropy(self) -> str:
        return "spray" if self.spray is not None else ("fixed" if self.sport is not None else "kernel")


@dataclass(frozen=True)
class Scenario:
    spec: ScenarioSpec
    file: Path
    fabric: Fabric
    scale: Scale | None
    #: The `qos:` policy, validated against the fabric (None: no QoS).
    qos: QosPolicy | None = None

    @property
    def partitions_file(self) -> Path | None:
        """The partitions file the controller is started with (checked against the topology on load)."""
        return (self.file.parent / self.spec.partitions).resolve() if self.spec.partitions else None

    @property
    def per_packet(self) -> bool:
        """The routing policy sprays (senders following it vary the source port per packet)."""
        return default_policies().create(self.spec.controller.choice().name).per_packet

    def sprays(self, entropy: str) -> bool:
        return entropy == "spray" or (entropy == "policy" and self.per_packet)

    def with_policy(self, policy: str) -> Scenario:
        """The same experiment (seed, traffic, faults) under another routing policy."""
        controller = self.spec.controller.model_copy(update={"policy": policy})
        return replace(self, spec=self.spec.model_copy(update={"controller": controller}))

    def with_cc(self, cc: str) -> Scenario:
        """The same experiment under another congestion control (`dcqcn:` applies whenever it is dcqcn)."""
        if cc not in ("none", "dcqcn"):
            raise ScenarioError(f"unknown congestion control {cc!r} (none, dcqcn)", field="cc")
        return replace(self, spec=self.spec.model_copy(update={"cc": cc}))

    def dcqcn(self, nic_gbps: float) -> DcqcnParams | None:
        """The DCQCN a NIC of `nic_gbps` (modelled speed) runs at the scenario's scale; None: `cc: none`."""
        if self.spec.cc != "dcqcn":
            return None
        return dcqcn_params(self.spec.dcqcn, nic_gbps, self.scale.factor if self.scale else 1.0)

    def flows(self, repetition: int = 0) -> list[FlowPlan]:
        rng = random.Random(f"{self.spec.seed}:{repetition}")
        hosts = [h.name for h in self.fabric.hosts]
        plans: list[FlowPlan] = []
        for index, item in enumerate(self.spec.traffic):
            if isinstance(item, RoceTraffic):
                continue  # see collective_plan(); the others are simulated only
            if isinstance(item, UdpFlow):
                duration = item.duration_s or (self.spec.duration_s - item.start_s)
                plans.append(self._entropy(FlowPlan(f"f{index}", item.src, item.dst, item.rate_pps,
                                                    item.size_bytes, item.start_s, duration,
                                                    dscp=item.dscp, job=index),
                                           item.entropy, repetition, item.sport))  # fmt: skip
                continue
            members = list(item.hosts or hosts)
            for i, (src, dst) in enumerate(zip(members, self._targets(item, members, rng), strict=True)):
                for q in range(item.flows_per_host):
                    name = f"f{index}.{i}" + (f".{q}" if item.flows_per_host > 1 else "")
                    plan = FlowPlan(
                        name,
                        src,
                        dst,
                        item.rate_pps,
                        item.size_bytes,
                        0.0,
                        self.spec.duration_s,
                        dscp=item.dscp,
                        job=index,
                    )
                    plans.append(self._entropy(plan, item.entropy, repetition))
        return plans

    def _targets(self, item: UdpPermutation, members: list[str], rng: random.Random) -> list[str]:
        if item.pattern == "shift":
            shift = item.shift or 1
            return [members[(i + shift) % len(members)] for i in range(len(members))]
        group = self._group_of(item.leave)
        targets = members[:]
        for _ in range(MAX_SHUFFLES):
            if not any(group(a) == group(b) for a, b in zip(members, targets, strict=True)):
                return targets
            rng.shuffle(targets)
        raise ScenarioError(
            f"no permutation of {len(members)} hosts leaves every {item.leave}", field="leave"
        )

    def _group_of(self, leave: str) -> Any:
        fabric = self.fabric
        if leave == "leaf":
            return lambda host: getattr(fabric.peer(host, 1), "node", host)
        if leave == "pod":
            return lambda host: fabric.nodes[host].pod
        return lambda host: host

    def _entropy(self, plan: FlowPlan, entropy: str, repetition: int, sport: int | None = None) -> FlowPlan:
        """The flow's source port(s), seeded by scenario seed, repetition and flow name (never the policy),
        so every policy of a comparison sends the same packets."""
        seed = f"{self.spec.seed}:{repetition}:{plan.name}"
        if self.sprays(entropy):
            return replace(plan, spray=random.Random(seed).randrange(1 << 14))
        return replace(plan, sport=sport or seeded_sports(seed, 1)[0])


def emulator_refuses(scenario: Scenario) -> str | None:
    """Why the emulator cannot run this scenario (None: it can).  Every traffic kind and every routing
    policy of the controller runs on both instruments; what is left is what the emulator cannot shape."""
    if scenario.scale is None and any(
        isinstance(item, RoceTraffic) and item.rate_pps is None for item in scenario.spec.traffic
    ):
        return (
            "scale: RoCE senders at line rate need shaped links (give `scale:`, or `rate_pps` for each "
            "RoCE traffic item): unshaped, the line rate is the machine's, not the modelled NIC's"
        )
    return None


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    text = read_input_file(path, ScenarioError)
    document = load_document(text, str(path))
    if not isinstance(document.data, dict):
        raise ScenarioError(
            "a scenario file is a YAML mapping (name:, topology:, ...)", file=str(path), line=1
        )
    spec = validate(ScenarioSpec, document, _Keys(document.data))
    return _cross_check(spec, document, path)


def _cross_check(spec: ScenarioSpec, doc: Document, path: Path) -> Scenario:
    topology_path = (path.parent / spec.topology).resolve()
    if not topology_path.exists():
        raise doc.error(["topology"], f"no such file: {topology_path}")
    fabric = load_topology(topology_path)
    scale = None
    if spec.scale is not None:
        try:
            scale = Scale.parse(spec.scale)
            scale.check(fabric)  # what `scenario run` (MininetFabric) would refuse
        except ValueError as exc:
            raise doc.error(["scale"], str(exc)) from None
    qos = None
    if spec.qos is not None:
        if scale is None:
            raise doc.error(["qos"], "QoS needs `scale:` (the classes share shaped links)")
        try:
            qos = load_policy((path.parent / spec.qos).resolve(), fabric)
        except InputError as exc:
            raise doc.error(["qos"], str(exc)) from None
    try:
        spec.controller.choice()
    except PolicyError as exc:
        raise doc.error(["controller", exc.field or "policy"], exc.message) from None
    partitions = None
    if spec.partitions is not None:
        partitions_path = (path.parent / spec.partitions).resolve()
        if not partitions_path.exists():
            raise doc.error(["partitions"], f"no such file: {partitions_path}")
        try:
            partitions = load_partitions(partitions_path, fabric)
        except InputError as exc:
            raise doc.error(["partitions"], str(exc)) from None
    engines = default_registry()
    if spec.controller.engine not in engines:
        known = ", ".join(engines.names())
        raise doc.error(
            ["controller", "engine"], f"unknown routing engine {spec.controller.engine!r} ({known})"
        )
    hosts = {h.name for h in fabric.hosts}
    for i, item in enumerate(spec.traffic):
        if isinstance(item, RoceCollective):
            try:
                check_collective(item, sorted(hosts))
            except TrafficError as exc:
                field = exc.field if exc.field in ("ranks", "size", "schedule") else "collective"
                raise doc.error(["traffic", i, field], exc.message) from None
            ranks = collective_ranks(item, sorted(hosts))
            if partitions is not None and len(ranks) <= PLAN_CHECK_RANKS:  # the pairs the plan really uses
                pairs = collective_plan(item, sorted(hosts)).bytes_by_pair()
                apart = next((p for p in sorted(pairs) if not partitions.permitted(*p)), None)
                if apart is not None:
                    raise doc.error(["traffic", i, "ranks"], f"ranks {apart[0]} and {apart[1]} share no "
                                    "partition: the fabric would drop their traffic")  # fmt: skip
            continue
        if isinstance(item, KvTransfer):
            check_kv(item, sorted(hosts), doc, i)
            continue
        if isinstance(item, TraceReplay):
            check_trace(item, hosts, doc, i, path)
            continue
        if isinstance(item, RoceIncast):
            check_incast(item, sorted(hosts), doc, i)
            continue
        names: list[tuple[str, str]] = (
            [("src", item.src), ("dst", item.dst)] if isinstance(item, UdpFlow) else []
        )
        if isinstance(item, UdpPermutation):
            names = [(str(j), h) for j, h in enumerate(item.hosts or [])]
            if item.hosts is not None and len(set(item.hosts)) < 2:
                raise doc.error(["traffic", i, "hosts"], "a permutation needs at least two distinct hosts")
            members = item.hosts or [h.name for h in fabric.hosts]
            if item.pattern == "shift" and (item.shift or 1) % len(members) == 0:
                raise doc.error(["traffic", i, "shift"], f"shift {item.shift} sends every host to itself")
            if item.pattern != "shift" and item.shift is not None:
                raise doc.error(["traffic", i, "shift"], "only with pattern: shift")
            if item.leave == "pod" and any(fabric.nodes[h].pod is None for h in members if h in fabric.nodes):
                raise doc.error(["traffic", i, "leave"], "the topology does not say which pod a host is in")
        for field, name in names:
            if name not in hosts:
                where: list[PathItem] = (
                    ["traffic", i, field] if field in ("src", "dst") else ["traffic", i, "hosts"]
                )
                raise doc.error(where, f"unknown host {name!r}")
        if isinstance(item, UdpFlow):
            if item.src == item.dst:
                raise doc.error(["traffic", i, "dst"], "a flow needs two different hosts")
            if item.start_s >= spec.duration_s:
                raise doc.error(["traffic", i, "start_s"], f"starts after the run ends ({spec.duration_s} s)")
    for i, fault in enumerate(spec.faults):
        if fault.at_s >= spec.duration_s:
            raise doc.error(["faults", i, "at_s"], f"after the run ends ({spec.duration_s} s)")
        if fault.action.startswith("link"):
            if fault.port is None or fault.switch is not None:
                raise doc.error(
                    ["faults", i, "port"], f"{fault.action} needs `port: NODE:PORT` (and no switch)"
                )
            node, _, number = fault.port.rpartition(":")
            if node not in fabric.nodes or not number.isdigit() or fabric.peer(node, int(number)) is None:
                raise doc.error(["faults", i, "port"], f"{fault.port!r} is not a cabled port of the topology")
        else:
            if fault.switch is None or fault.port is not None:
                raise doc.error(["faults", i, "switch"], f"{fault.action} needs `switch: NAME` (and no port)")
            if fault.switch not in fabric.nodes or not fabric.nodes[fault.switch].is_switch:
                raise doc.error(["faults", i, "switch"], f"unknown switch {fault.switch!r}")
    scenario = Scenario(spec, path, fabric, scale, qos)
    checked = scenario.with_cc("dcqcn")  # `dcqcn:` under cc: none is what `--cc dcqcn` will run: checked now
    for speed in sorted({nic_gbps(fabric, h.name) or 0.0 for h in fabric.hosts} - {0.0}):
        try:
            checked.dcqcn(speed)
        except DcqcnError as exc:
            raise doc.error(["dcqcn", exc.field], str(exc)) from None
    return scenario


def nic_gbps(fabric: Fabric, host: str) -> float | None:
    """The speed of a host's first port (its NIC), as modelled; None: not cabled."""
    entry = fabric.port_map.get(PortRef(host, 1))
    return fabric.links[entry[0]].bw_gbps if entry is not None else None


__all__ = [
    "PLAN_CHECK_RANKS",
    "Entropy",
    "FlowPlan",
    "KvTransfer",
    "RoceCollective",
    "RoceIncast",
    "RoceTraffic",
    "Scenario",
    "ScenarioError",
    "ScenarioSpec",
    "TraceReplay",
    "UdpFlow",
    "UdpPermutation",
    "check_collective",
    "check_incast",
    "collective_plan",
    "collective_ranks",
    "emulator_refuses",
    "incast_senders",
    "load_scenario",
    "nic_gbps",
    "trace_path",
]
