"""Emulation: fabrics of real Open vSwitch bridges built from the topology model (Mininet, or lightweight
namespaces, on one ovs-vswitchd or on shards), fault injection, the all-pairs check and the scenario runner.
The CLI composes it; it uses `controller.sm`, `traffic` and the REST client, never the controller's running
parts (docs/modules.md lists its modules)."""
