# Prometheus for `docker compose --profile observability up`: Debian's own package on the same base image as
# fabriclab (no other registry needed), with a scrape config for the controller and the emulator and a
# console page (fabriclab.html) that needs no JavaScript and no internet.
FROM debian:bookworm-slim

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && prometheus --version

COPY docker/prometheus/ /etc/fabriclab/
RUN mkdir -p /var/lib/fabriclab-prometheus && chown prometheus:prometheus /var/lib/fabriclab-prometheus

USER prometheus
CMD ["prometheus", "--help"]
