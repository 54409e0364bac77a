"""`fabriclab emulate clean`: remove what runs that are gone left behind, by their recorded names."""

from __future__ import annotations

from dataclasses import dataclass, field

from emulation import lightnet, runfile
from emulation.mnfabric import _bridges, leftovers, remove


@dataclass
class Cleaned:
    runs: list[str] = field(default_factory=list)
    #: Runs still alive (their own teardown is theirs to do).
    running: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    controllers: list[int] = field(default_factory=list)


def _names_with_prefix(prefix: str) -> list[str]:
    """Node names of a `--name-prefix` run found on this machine (bridges, interfaces, namespaces)."""
    pattern = runfile.prefix_pattern(prefix)
    found = set(_bridges()) | set(lightnet.namespaces())
    found |= {n.rsplit("-eth", 1)[0] if "-eth" in n else n for n in lightnet.root_links()}
    return sorted(n for n in found if pattern.fullmatch(n))


def clean(prefix: str | None = None) -> Cleaned:
    """Every recorded run whose process is gone (or only the one of `prefix`): its names removed, its
    controller stopped, its record deleted.  With a `prefix` and no record, the names `{prefix}s<i>` and
    `{prefix}h<i>` present are removed (a run killed before it wrote its record)."""
    result = Cleaned()
    seen = False
    for path, record in runfile.records():
        if prefix is not None and record.prefix != prefix:
            continue
        seen = True
        label = record.prefix or "(no prefix)"
        if runfile.alive(record.pid, record.marker):
            result.running.append(f"{label} (pid {record.pid})")
            continue
        result.removed += leftovers(record.names)
        remove(record.names, record.group)
        if runfile.stop_controller(record.controller_pid):
            result.controllers.append(record.controller_pid or 0)
        path.unlink(missing_ok=True)
        result.runs.append(label)
    if prefix and not seen:
        names = _names_with_prefix(prefix)
        if names:
            result.removed += leftovers(names)
            remove(names)
            result.runs.append(prefix)
    return result


__all__ = ["Cleaned", "clean"]
