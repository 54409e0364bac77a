"""Emulation: Mininet fabrics on Open vSwitch built from the topology model, fault injection and the scenario
runner.  Empty until the emulation issue lands; only the CLI may import it."""
