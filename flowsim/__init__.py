"""Flow-level simulator: the fabric, the controller's tables and the routing policies at 1k–16k GPUs.

The core (`network`, `routes`, `maxmin`, `workload`, `engine`, `metrics`) is pure Python + numpy and does no
I/O; `scenario` adapts scenario files, `report` writes results, `sweep` runs grids on processes or Dask.
"""
