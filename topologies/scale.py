"""Link speed scaling: the speeds a fabric is declared with versus the speeds it is emulated at.

An emulated 400 Gb/s fabric runs its links at, say, 200 Mb/s (HTB on every cable); the emulator shapes
with it and the controller measures utilisation against it, so both read the same `REAL=EMULATED` text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topologies.model import Fabric

_UNITS = {"K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}
#: What the emulator can shape per link: Mininet's TCLink caps HTB at 1 Gb/s, and rates go to tc with three
#: decimals of Mb/s (anything smaller would be "0.000mbit").
MAX_SHAPED_MBPS = 1000.0
MIN_SHAPED_MBPS = 0.001


@dataclass(frozen=True)
class Scale:
    """Real link speed -> emulated speed, e.g. `400G=200M`: a 400 Gb/s link is shaped to 200 Mb/s."""

    real_gbps: float
    emulated_gbps: float

    @classmethod
    def parse(cls, text: str) -> Scale:
        number = r"(\d+(?:\.\d*)?|\.\d+)"
        match = re.fullmatch(rf"\s*{number}\s*([KMGT])\s*=\s*{number}\s*([KMGT])\s*", text.upper())
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

    def check(self, fabric: Fabric) -> None:
        """Raise ValueError unless every link of `fabric` scales into what HTB can shape here: the one
        validator behind `scenario check`, `scenario run` and `emulate up`, so a check never passes what a
        run refuses."""
        for link in fabric.links:
            rate = self.mbps(link.bw_gbps)
            if rate > MAX_SHAPED_MBPS:
                raise ValueError(
                    f"link {link}: {link.bw_gbps:g} Gb/s scales to {rate:g} Mb/s, above what Mininet's "
                    f"TCLink shapes ({MAX_SHAPED_MBPS:g} Mb/s); choose a smaller scale"
                )
            if rate < MIN_SHAPED_MBPS:
                raise ValueError(
                    f"link {link}: {link.bw_gbps:g} Gb/s scales to {rate:g} Mb/s, below the smallest rate "
                    f"HTB is given here ({MIN_SHAPED_MBPS:g} Mb/s); choose a larger scale"
                )

    @property
    def factor(self) -> float:
        """Emulated speed / real speed."""
        return self.emulated_gbps / self.real_gbps

    def __str__(self) -> str:
        return f"{_speed(self.real_gbps)}={_speed(self.emulated_gbps)}"


def _speed(gbps: float) -> str:
    """A speed in the unit that shows it without a fraction where one exists (500K, 200M, 400G)."""
    for unit, scale in (("T", 1e3), ("G", 1.0), ("M", 1e-3), ("K", 1e-6)):
        value = gbps / scale
        if value >= 1 and abs(value - round(value)) < 1e-9 * max(1.0, value):
            return f"{round(value):g}{unit}"
    return f"{gbps * 1000:g}M"


__all__ = ["MAX_SHAPED_MBPS", "MIN_SHAPED_MBPS", "Scale"]
