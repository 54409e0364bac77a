"""Fabric model, generators, topology files and importers.

The model (`topologies.model`) is imported by the routing core; file formats live in their own modules so
that the core never pulls in YAML or schema libraries.
"""
