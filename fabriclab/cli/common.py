"""Helpers shared by CLI commands: loading a fabric from any supported file, writing outputs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from topologies.errors import TopologyError
from topologies.ibnet import load_ibnet
from topologies.loader import load_topology
from topologies.model import Fabric

_IBNET_LINE = re.compile(r"^\s*(switchguid|caguid|Switch\s+\d+|Ca\s+\d+|vendid|sysimgguid)\b", re.MULTILINE)


class CliError(Exception):
    """A usage problem found after argument parsing (exit code 2)."""


def sniff_format(path: Path) -> str:
    if path.suffix.lower() in (".yaml", ".yml"):
        return "yaml"
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    return "ibnet" if _IBNET_LINE.search(head) else "yaml"


def load_fabric(path: str, fmt: str = "auto") -> Fabric:
    """A topology file (YAML) or an ibnetdiscover/ibsim dump, validated."""
    file = Path(path)
    if not file.exists():
        raise TopologyError("no such file", file=str(path))
    kind = sniff_format(file) if fmt == "auto" else fmt
    if kind == "ibnet":
        return load_ibnet(file)
    return load_topology(file)


def write_text(text: str, output: str | None) -> None:
    """Write to a file (atomically, so a failed run never leaves half a file) or to stdout."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    target = Path(output)
    if target.parent and not target.parent.exists():
        raise CliError(f"{output}: directory {target.parent} does not exist")
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
