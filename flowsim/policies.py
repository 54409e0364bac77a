"""The simulator's routing policies: the controller's (`controller.sm.policies`, same names and checks) plus
what only a simulator can show.

`local-ar` is switch-local adaptive routing as InfiniBand switches do it (NVIDIA's AR, per packet or
flowlet): every switch sends each packet of a flow to whichever of its equal-cost ports is least loaded
*locally*, with no controller round trip.  Open vSwitch cannot do this (its select groups do not read queue
depth, and a controller polling counters is `adaptive`), so it is labelled not realisable and the emulator
refuses it; it answers "what would hardware AR give at 4,096 GPUs?".  At flow level it is modelled as the
split of every set's traffic over its ports that evens out their utilisation given everything else on them,
recomputed at every event (reaction time zero, which is what per-packet AR approaches).
"""

from __future__ import annotations

from controller.sm.policies import PolicyRegistry, RoutingPolicy, default_policies


class LocalArPolicy(RoutingPolicy):
    name = "local-ar"
    summary = (
        "switch-local adaptive routing (InfiniBand-style): each switch spreads packets over its equal-cost "
        "ports by local load, no controller; simulator only, not realisable on Open vSwitch"
    )
    multipath = True
    per_packet = True
    adaptive = False


#: Policies the emulator (and the controller) cannot run.
SIMULATED_ONLY = (LocalArPolicy.name,)


def sim_policies() -> PolicyRegistry:
    """The controller's policies, then the simulator-only ones."""
    registry = default_policies()
    registry.register(LocalArPolicy)
    return registry


__all__ = ["SIMULATED_ONLY", "LocalArPolicy", "sim_policies"]
