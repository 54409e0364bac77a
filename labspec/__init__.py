"""What a lab run is, as data: the scenario file's model (`labspec.scenario`), its traffic
(`labspec.trafficspec`) and congestion-control (`labspec.ccspec`) sections, and the work it plans
(`labspec.workplan`).

One description, two instruments: the emulator (`emulation`) and the flow-level simulator (`flowsim`) both
read a scenario through this package, which sits below both and imports neither — so the simulator never
drags Open vSwitch or Mininet modules in to read a file.
"""
