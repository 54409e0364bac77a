"""Seeing the fabric: Prometheus metrics, the live view's data (`/api/v1/view`, its event stream) and the
page itself — all read from the service's published snapshots, never from the worker's internals."""
