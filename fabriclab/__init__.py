"""fabriclab: an InfiniBand-style subnet manager and emulation testbed for Ethernet/OpenFlow AI fabrics.

The packages, bottom to top (import-linter contracts in setup.cfg keep them in this order):

* `topologies` — the fabric model, generators, files (depends on nothing else of ours);
* `controller` — the subnet manager: `controller.sm` (routing, pure), `controller.core` (the controller's
  decisions, pure), `controller.southbound` (os-ken/OpenFlow), `controller.service` (one worker thread),
  `controller.rest` (FastAPI on published snapshots);
* `traffic` — RoCEv2 packets, senders/receivers and planners;
* `emulation` — Mininet/OVS fabrics, faults, scenarios (may use `controller.sm` and the REST client);
* `fabriclab.cli` — the `fabriclab` command: the only composition root.
"""
