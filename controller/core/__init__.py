"""The controller's decision core: typed events in, new state plus commands out (see `fabric`).

Pure: no threads, no sockets, no clock of its own (enforced by import-linter).  `controller.service` runs it.
"""
