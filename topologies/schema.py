"""Schema of topology files (layer 2 of validation: shape and types; unknown keys are errors).

A topology file is either explicit, containerlab-like::

    fabriclab: 1
    name: tiny
    defaults: {bw_gbps: 400}
    nodes:
      h1: {kind: host}
      leaf1: {kind: switch, tier: 0}
    links:
      - endpoints: ["h1:1", "leaf1:1"]

or a generator block that expands to the same model::

    name: ft8
    generator: {kind: fat-tree, k: 8, bw_gbps: 400}
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from topologies.errors import SEED_MAX
from topologies.model import MAX_PORTS
from topologies.yamlio import AllowedKeys, PathItem

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+\-]*$")


def _guid(value: Any) -> int:
    """GUIDs may be written as YAML hex ints (0x0002c9...) or as strings ("0x0002c9..." or plain hex)."""
    if isinstance(value, bool):
        raise ValueError("a GUID must be a 64-bit number such as 0x0002c90000000001")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip().lower()
        text = text.removeprefix("0x")
        if not re.fullmatch(r"[0-9a-f]{1,16}", text):
            raise ValueError(f"not a GUID: {value!r} (expected up to 16 hex digits, e.g. 0x0002c90000000001)")
        number = int(text, 16)
    else:
        raise ValueError(f"a GUID must be a number or a hex string, got {type(value).__name__}")
    if not 0 < number < 1 << 64:
        raise ValueError(f"GUID {value!r} is out of range (1 .. 2^64-1)")
    return number


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"node names must be strings; quote {value!r} in the file")
    if not NAME_RE.match(value):
        raise ValueError(f"bad node name {value!r}: use letters, digits and _ . : / @ + -")
    return value


def _endpoint(value: Any) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f'an endpoint is "node:port", got {value!r}')
    node, _, port = value.rpartition(":")
    if not port.isdigit():
        raise ValueError(f'an endpoint is "node:port" with a port number, got {value!r}')
    number = int(port)
    if not 1 <= number <= MAX_PORTS:
        raise ValueError(f"port number in {value!r} must be 1..{MAX_PORTS}")
    return _name(node), number


Guid = Annotated[int, BeforeValidator(_guid)]
NodeName = Annotated[str, BeforeValidator(_name)]
Endpoint = Annotated[tuple[str, int], BeforeValidator(_endpoint)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class NodeSpec(_Strict):
    kind: Literal["host", "switch"] | None = None
    guid: Guid | None = None
    ports: Annotated[int, Field(ge=1, le=MAX_PORTS)] | None = None
    tier: int | None = None
    pod: Annotated[int, Field(ge=0)] | None = None
    rail: Annotated[int, Field(ge=0)] | None = None
    group: Annotated[int, Field(ge=0)] | None = None
    server: str | None = None
    description: str | None = None
    system_guid: Guid | None = None
    vendor_id: Annotated[int, Field(ge=0, le=0xFFFFFF)] = 0
    device_id: Annotated[int, Field(ge=0, le=0xFFFF)] = 0
    revision: Annotated[int, Field(ge=0, le=0xFFFFFFFF)] = 0
    port_guids: dict[Annotated[int, Field(ge=1, le=MAX_PORTS)], Guid] = Field(default_factory=dict)


class LinkSpec(_Strict):
    endpoints: Annotated[tuple[Endpoint, Endpoint], Field(strict=False)]  # YAML gives a list
    bw_gbps: PositiveFloat | None = None
    latency_us: NonNegativeFloat | None = None
    delay: Any = None
    loss: Any = None

    @model_validator(mode="after")
    def _no_netem(self) -> LinkSpec:
        # Mininet's TCLink silently applies no delay without netem, which this platform lacks: refuse early.
        if self.delay is not None or self.loss is not None:
            raise ValueError(
                "delay/loss are not supported (no netem qdisc on the emulation platform); "
                "use latency_us to document cable latency for the flow simulator"
            )
        return self


class Defaults(_Strict):
    kind: Literal["host", "switch"] | None = None
    bw_gbps: PositiveFloat = 400.0
    latency_us: NonNegativeFloat | None = None


class FatTreeGenerator(_Strict):
    kind: Literal["fat-tree"]
    k: int
    bw_gbps: PositiveFloat = 400.0


class LeafSpineGenerator(_Strict):
    kind: Literal["leaf-spine"]
    leaves: int
    spines: int
    hosts_per_leaf: int
    parallel: int = 1
    bw_gbps: PositiveFloat = 400.0
    uplink_bw_gbps: PositiveFloat | None = None


class RailGenerator(_Strict):
    kind: Literal["rail"]
    servers: int
    gpus: int = 8
    groups: int = 1
    spines: int | None = None
    parallel: int | None = None
    bw_gbps: PositiveFloat = 400.0


class OpenSmFatTreeGenerator(_Strict):
    kind: Literal["opensm-fat-tree"]
    k: int
    bw_gbps: PositiveFloat = 400.0


class TorusGenerator(_Strict):
    kind: Literal["torus"]
    x: int
    y: int
    hosts_per_switch: int = 1
    bw_gbps: PositiveFloat = 400.0


class DragonflyGenerator(_Strict):
    kind: Literal["dragonfly"]
    groups: int
    routers: int
    globals_per_router: int
    hosts_per_switch: int = 1
    bw_gbps: PositiveFloat = 400.0


class RandomRegularGenerator(_Strict):
    kind: Literal["random-regular"]
    switches: int
    degree: int
    hosts_per_switch: int = 1
    seed: Seed = 0
    bw_gbps: PositiveFloat = 400.0


GeneratorSpec = Annotated[
    FatTreeGenerator
    | OpenSmFatTreeGenerator
    | LeafSpineGenerator
    | RailGenerator
    | TorusGenerator
    | DragonflyGenerator
    | RandomRegularGenerator,
    Field(discriminator="kind"),
]


class TopologySpec(_Strict):
    fabriclab: Literal[1] = 1
    name: NodeName
    description: str | None = None
    defaults: Defaults = Field(default_factory=Defaults)
    nodes: dict[NodeName, NodeSpec] | None = None
    links: list[LinkSpec] | None = None
    generator: GeneratorSpec | None = None

    @model_validator(mode="after")
    def _one_form(self) -> TopologySpec:
        if self.generator is not None and (self.nodes is not None or self.links is not None):
            raise ValueError("give either a generator block or nodes/links, not both")
        if self.generator is None and (self.nodes is None or self.links is None):
            raise ValueError("a topology needs nodes and links (or a generator block)")
        return self


_GENERATOR_MODELS: dict[str, type[BaseModel]] = {
    "fat-tree": FatTreeGenerator,
    "opensm-fat-tree": OpenSmFatTreeGenerator,
    "leaf-spine": LeafSpineGenerator,
    "rail": RailGenerator,
    "torus": TorusGenerator,
    "dragonfly": DragonflyGenerator,
    "random-regular": RandomRegularGenerator,
}


class TopologyKeys(AllowedKeys):
    """Allowed keys per place in a topology file, for "did you mean" messages."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def for_path(self, path: Sequence[PathItem]) -> Sequence[str]:
        model: type[BaseModel] | None = None
        if not path:
            model = TopologySpec
        elif path[0] == "nodes" and len(path) == 2:
            model = NodeSpec
        elif path[0] == "links" and len(path) == 2:
            model = LinkSpec
        elif path == ("defaults",):
            model = Defaults
        elif path == ("generator",) and isinstance(self.data, dict):
            block = self.data.get("generator")
            kind = block.get("kind") if isinstance(block, dict) else None
            model = _GENERATOR_MODELS.get(str(kind))
        if model is None:
            return ()
        return [name for name in model.model_fields if name not in ("delay", "loss")]


__all__ = ["Defaults", "GeneratorSpec", "LinkSpec", "NodeSpec", "Seed", "TopologyKeys", "TopologySpec"]
