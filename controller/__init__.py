"""The fabric controller: an InfiniBand-style subnet manager for Ethernet/OpenFlow fabrics.

`controller.sm` is the pure core (discovery model, addressing, routing engines, verification);
`controller.cli` is the composition root that ties it to files and, later, to os-ken, the REST API and the
emulator.
"""
