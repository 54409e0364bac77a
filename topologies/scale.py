"""Link speed scaling: the speeds a fabric is declared with versus the speeds it is emulated at.

An emulated 400 Gb/s fabric runs its links at, say, 200 Mb/s (HTB on every cable); the emulator shapes
with it and the controller measures utilisation against it, so both read the same `REAL=EMULATED` text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}


@dataclass(frozen=True)
class Scale:
    """Real link speed -> emulated speed, e.g. `400G=200M`: a 400 Gb/s link is shaped to 200 Mb/s."""

    real_gbps: float
    emulated_gbps: float

    @classmethod
    def parse(cls, text: str) -> Scale:
        match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT])\s*=\s*([\d.]+)\s*([KMGT])\s*", text.upper())
        if not match:
            raise ValueError(f"scale {text!r}: expected REAL=EMULATED like 400G=200M")
        try:
            real = float(match[1]) * _UNITS[match[2]]
            emulated = float(match[3]) * _UNITS[match[4]]
        except ValueError:
            raise ValueError(f"scale {text!r}: expected REAL=EMULATED like 400G=200M") from None
        if real <= 0 or emulated <= 0:
            raise ValueError(f"scale {text!r}: speeds must be > 0")
        return cls(real, emulated)

    def mbps(self, bw_gbps: float) -> float:
        return bw_gbps * self.emulated_gbps / self.real_gbps * 1000.0

    def __str__(self) -> str:
        return f"{self.real_gbps:g}G={self.emulated_gbps * 1000:g}M"


__all__ = ["Scale"]
