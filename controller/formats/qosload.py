"""Reading a QoS policy file in either syntax: fabriclab's YAML (`controller.formats.qosfile`) or OpenSM's
`qos-policy.conf` (`controller.formats.opensmqos`, which builds on the YAML validator).  Here, above both, so
that neither format module imports the other's reader."""

from __future__ import annotations

from pathlib import Path

from controller.formats.opensmqos import looks_like_opensm, parse_opensm
from controller.formats.qosfile import MAX_QOS_BYTES, QosFileError, parse_policy
from controller.sm.qos import QosPolicy
from topologies.errors import read_input_file
from topologies.model import Fabric


def load_policy(path: str | Path, fabric: Fabric | None = None) -> QosPolicy:
    """A policy file: YAML, or OpenSM's `qos-policy.conf` syntax; `QosFileError` naming file, line, field."""
    text = read_input_file(Path(path), QosFileError, MAX_QOS_BYTES)
    if looks_like_opensm(text):
        return parse_opensm(text, str(path), fabric)
    return parse_policy(text, str(path), fabric)


__all__ = ["load_policy"]
