"""Errors of bad traffic input, and the two parsers every traffic front end needs (sizes, host lists).

A workload is described by a user (CLI flags, scenario files, trace files), so every mistake is reported as
one `TrafficError` naming the field (and, for files, where): the CLI prints it on one line, a REST layer can
answer 422 with the same text.  It is a `ValueError` so callers that only know "bad value" still catch it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

from topologies.errors import InputError, clip

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_SIZE_HINT = "use e.g. 4096, 64KiB, 256MiB, 1GB"
_HOST_RE = re.compile(r"^(.*?)(\d+)$")
#: A range longer than this is almost certainly a typo ("h1..h10000000"), not a fabric.
MAX_RANGE_HOSTS = 65536


class TrafficError(InputError):
    """Bad traffic input (sizes, host lists, model shapes, trace lines): one located line, like every
    other input error, so the CLI prints it and exits 2."""


#: The largest size anything accepts: what a signed 64-bit counter holds.
MAX_SIZE_BYTES = 2**63 - 1


def parse_size(text: str | int, field: str = "size") -> int:
    """A byte count from a user: an int or "4096", "64KiB", "1.5MB" (KiB = 1024, KB = 1000, any case).

    Fractions are exact (Fraction, not float) so "1.5MB" is 1,500,000 and not 1,499,999; a value that is
    not a whole number of bytes is refused rather than silently rounded.
    """
    if isinstance(text, bool):
        raise TrafficError(f"expected a size, got {text!r}", field=field)
    if isinstance(text, int):
        if text < 0:
            raise TrafficError(f"must be >= 0, got {clip(str(text))}", field=field)
        if text > MAX_SIZE_BYTES:
            raise TrafficError(
                f"at most {MAX_SIZE_BYTES:,} bytes (8 EiB), got {clip(str(text))}", field=field
            )
        return text
    if not isinstance(text, str):
        raise TrafficError(f"expected a size, got {type(text).__name__}", field=field)
    match = _SIZE_RE.match(text) if len(text) <= 64 else None  # no 5,000-digit numbers to convert
    unit = match.group(3).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise TrafficError(f"cannot parse {clip(repr(text))} ({_SIZE_HINT})", field=field)
    if match.group(1) == "-":
        raise TrafficError(f"must be >= 0, got {text!r}", field=field)
    value = Fraction(match.group(2)) * _UNITS[unit]
    if value.denominator != 1:
        raise TrafficError(f"{text!r} is not a whole number of bytes", field=field)
    if value > MAX_SIZE_BYTES:
        raise TrafficError(f"at most {MAX_SIZE_BYTES:,} bytes (8 EiB), got {text!r}", field=field)
    return int(value)


def parse_hosts(text: str, known: Sequence[str] | None = None, field: str = "ranks") -> list[str]:
    """Host names from "h1..h16", "h1,h2,h9" or mixtures ("h1..h4,h9"), in the order written.

    Order matters (it is the rank order of a collective), so nothing is sorted; duplicates are refused
    because a rank listed twice would silently change the ring and the byte counts.
    """
    if not isinstance(text, str):
        raise TrafficError(f"expected a host list like 'h1..h16,h20', got {type(text).__name__}", field=field)
    if not text.strip():
        raise TrafficError("empty host list (use e.g. h1..h16 or h1,h2,h9)", field=field)
    hosts: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise TrafficError(f"empty item in {text!r}", field=field)
        hosts.extend(_expand(item, field) if ".." in item else [item])
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            raise TrafficError(f"{host!r} is listed twice", field=field)
        seen.add(host)
    if known is not None:
        known_set = set(known)
        unknown = [h for h in hosts if h not in known_set]
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise TrafficError(f"unknown host {unknown[0]!r}{more}", field=field)
    return hosts


def _expand(item: str, field: str) -> list[str]:
    first, sep, last = (part.strip() for part in item.partition(".."))
    a, b = _HOST_RE.match(first), _HOST_RE.match(last)
    if not sep or a is None or b is None or ".." in last:
        raise TrafficError(f"bad range {item!r} (use e.g. h1..h16)", field=field)
    if a.group(1) != b.group(1):
        raise TrafficError(f"bad range {item!r}: both ends need the same prefix", field=field)
    lo, hi = int(a.group(2)), int(b.group(2))
    if lo > hi:
        raise TrafficError(f"bad range {item!r}: {first} comes after {last}", field=field)
    if hi - lo + 1 > MAX_RANGE_HOSTS:
        raise TrafficError(f"bad range {item!r}: more than {MAX_RANGE_HOSTS} hosts", field=field)
    # "h01..h12" keeps its zero padding; "h1..h12" has none.
    width = len(a.group(2)) if a.group(2).startswith("0") else 0
    return [f"{a.group(1)}{i:0{width}d}" for i in range(lo, hi + 1)]
