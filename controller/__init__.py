"""The fabric controller: an InfiniBand-style subnet manager for Ethernet/OpenFlow fabrics.

Where a decision is taken: `controller.sm` computes (routing engines, tables, verification, intents),
`controller.core` decides (what the controller does on every switch, port, discovery and operator event:
pure functions of state, event and `now`).  The rest carries: `controller.service` runs the core on one
worker thread and executes its commands, `controller.southbound` speaks OpenFlow (os-ken), and
`controller.rest` serves the snapshots the worker publishes.  The `fabriclab` command (`fabriclab.cli`)
composes them.
"""
