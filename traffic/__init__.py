"""RoCEv2 traffic: packet layers, sender/receiver agents (with DCQCN), and workload planners (collectives,
KV-cache transfers, congestion traces) shared by the emulator and the simulator."""
