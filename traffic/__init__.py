"""RoCEv2 traffic: packet layers, sender/receiver agents and workload planners (collectives, KV-cache
transfers, congestion traces).  Empty until the traffic issue lands."""
