"""The subnet manager's pure core: LIDs, routing engines, verification and quality figures.

Imports only numpy, networkx and the fabric model; no I/O, no frameworks (enforced by import-linter).
"""
