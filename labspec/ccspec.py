"""`cc:` and `dcqcn:` of scenario files: which congestion control the RoCE senders run, and its parameters.

`cc: none` (the default) keeps the senders open-loop at their paced rate; `cc: dcqcn` runs DCQCN
(`traffic.dcqcn`) in every sender's QPs, CNPs from every receiver and ECN marking at the shaped switch
egresses, in the emulator and the simulator alike.  `dcqcn:` overrides parameters at the *modelled*
fabric's speed (the paper's units); both instruments then scale them with the scenario's `scale`
(`DcqcnParams.scaled`), so one file gives one controller.  Omitted fields keep the published defaults
(docs/congestion.md lists them with their sources).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from labspec.trafficspec import Strict
from traffic.dcqcn import DcqcnParams

CongestionControl = Literal["none", "dcqcn"]
_Pos = Annotated[float, Field(gt=0, le=1e12)]


class DcqcnSpec(Strict):
    """Overrides of DCQCN's parameters, in the units their names say, at the modelled (real) speed."""

    kmin_bytes: Annotated[int, Field(ge=0, le=1 << 30)] | None = None
    kmax_bytes: Annotated[int, Field(gt=0, le=1 << 30)] | None = None
    pmax: Annotated[float, Field(gt=0, le=1)] | None = None
    g: Annotated[float, Field(gt=0, le=1)] | None = None
    alpha_period_us: _Pos | None = None
    increase_period_us: _Pos | None = None
    byte_counter_bytes: Annotated[int, Field(gt=0, le=1 << 40)] | None = None
    fast_recovery_steps: Annotated[int, Field(ge=1, le=1000)] | None = None
    ai_rate_mbps: _Pos | None = None
    hai_rate_mbps: _Pos | None = None
    min_rate_mbps: _Pos | None = None
    cnp_interval_us: Annotated[float, Field(ge=0, le=1e9)] | None = None


#: spec field -> (DcqcnParams field, factor from the spec's unit to the parameter's).
_FIELDS: dict[str, tuple[str, float]] = {
    "kmin_bytes": ("kmin_bytes", 1),
    "kmax_bytes": ("kmax_bytes", 1),
    "pmax": ("pmax", 1),
    "g": ("g", 1),
    "alpha_period_us": ("alpha_period_s", 1e-6),
    "increase_period_us": ("increase_period_s", 1e-6),
    "byte_counter_bytes": ("byte_counter_bytes", 1),
    "fast_recovery_steps": ("fast_recovery_steps", 1),
    "ai_rate_mbps": ("ai_rate_bps", 1e6),
    "hai_rate_mbps": ("hai_rate_bps", 1e6),
    "min_rate_mbps": ("min_rate_bps", 1e6),
    "cnp_interval_us": ("cnp_interval_s", 1e-6),
}
_SPEC_NAME = {param: spec for spec, (param, _) in _FIELDS.items()}


class DcqcnError(ValueError):
    """A DCQCN parameter set that cannot run; `field` is the scenario's name for the offending value."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def dcqcn_params(spec: DcqcnSpec | None, nic_gbps: float, scale: float) -> DcqcnParams:
    """DCQCN for a NIC of `nic_gbps` (modelled speed) on links `scale` times that speed: the published
    defaults, `spec`'s overrides, then scaled.  DcqcnError names the spec field that is out of range."""
    values: dict[str, float | int] = {"line_rate_bps": nic_gbps * 1e9}
    for name, (param, factor) in _FIELDS.items():
        given = getattr(spec, name) if spec is not None else None
        if given is not None:
            values[param] = given * factor if factor != 1 else given
    try:
        return DcqcnParams(**values).scaled(scale)  # type: ignore[arg-type]
    except ValueError as exc:
        text = str(exc)
        param = next((p for p in _SPEC_NAME if f" {p} " in text), "")
        field = _SPEC_NAME.get(param, "min_rate_mbps" if "line_rate" in text else "kmax_bytes")
        if param == "min_rate_bps":
            text = f"min_rate_mbps must be above 0 and at most the NIC's {nic_gbps * 1e3:g} Mb/s"
        elif param == "kmax_bytes":
            text = "kmax_bytes must be above kmin_bytes"
        elif param == "hai_rate_bps":
            text = "hai_rate_mbps must be at least ai_rate_mbps"
        raise DcqcnError(text, field) from None


__all__ = ["CongestionControl", "DcqcnError", "DcqcnSpec", "dcqcn_params"]
