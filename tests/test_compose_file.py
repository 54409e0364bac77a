"""The container setup's promises, checked on the files themselves (the running stack is smoke-tested
by `.ci/compose_smoke.py` in CI): least privilege, no bridge networks, the test service isolated and
forced to run the emulation tests, settings documented, README's two commands being what CI runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

# SYS_NICE: emulation/priority.py; IPC_LOCK: AF_XDP switch ports pin their buffers (emulation/fastports.py)
EMULATION_CAPS = {"NET_ADMIN", "SYS_ADMIN", "NET_RAW", "SYS_NICE", "IPC_LOCK"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_file_works_with_v2_and_1_29(compose: dict[str, Any]) -> None:
    assert "version" not in compose  # obsolete in v2 (warns); 1.29 reads the Compose Specification without it
    assert set(compose["services"]) == {"controller", "fabric", "test", "prometheus", "scheduler", "emu-host"}
    assert "networks" not in compose  # no Docker bridge networks at all


def test_least_privilege_and_no_bridge_networks(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert not service.get("privileged"), name
        assert service["network_mode"] in {"host", "none"}, name
        assert "networks" not in service and "ports" not in service, name
        assert set(service.get("cap_add", [])) <= EMULATION_CAPS, name
    images = {name: (s["image"], s["build"].get("target")) for name, s in compose["services"].items()}
    assert images == {  # one image for controller and fabric; the tests add a browser; Prometheus its own
        "controller": ("fabriclab:latest", "runtime"),
        "fabric": ("fabriclab:latest", "runtime"),
        "test": ("fabriclab-test:latest", "test"),
        "prometheus": ("fabriclab-prometheus:latest", None),
        "scheduler": ("fabriclab:latest", "runtime"),
        "emu-host": ("fabriclab:latest", "runtime"),
    }
    for name, service in compose["services"].items():
        dockerfile = "docker/prometheus.Dockerfile" if name == "prometheus" else "docker/Dockerfile"
        assert {k: v for k, v in service["build"].items() if k != "target"} == {
            "context": ".",
            "dockerfile": dockerfile,
            "network": "host",
        }
    controller = compose["services"]["controller"]
    assert "cap_add" not in controller and "devices" not in controller  # it only speaks TCP
    for name in ("fabric", "test"):
        service = compose["services"][name]
        assert set(service["cap_add"]) == EMULATION_CAPS
        assert service["devices"] == ["/dev/net/tun:/dev/net/tun"]
        assert service["security_opt"] == ["seccomp=unconfined"]
        assert "ulimits" not in service  # this engine may not raise memlock: `IPC_LOCK` instead


def test_services_start_in_order_and_stop_cleanly(compose: dict[str, Any]) -> None:
    controller, fabric = compose["services"]["controller"], compose["services"]["fabric"]
    assert controller["network_mode"] == fabric["network_mode"] == "host"
    assert "/api/v1/health" in " ".join(controller["healthcheck"]["test"])
    assert "/api/v1/emulation" in " ".join(fabric["healthcheck"]["test"])  # healthy = all pairs verified
    assert fabric["depends_on"] == {"controller": {"condition": "service_healthy"}}
    assert fabric["init"] is True  # SIGTERM reaches fabriclab, which tears down what it built
    assert int(fabric["stop_grace_period"].rstrip("s")) >= 30
    assert "./results:/fabriclab/results" in fabric["volumes"]
    for service in (controller, fabric):  # users' own topology files, no rebuild; never written
        assert "./topologies:/fabriclab/topologies:ro" in service["volumes"]
    command = fabric["command"]
    assert command[:4] == ["fabriclab", "emulate", "up", "--no-cli"]
    assert "--controller" in command and "--controller-api" in command


def test_test_service_is_isolated_and_must_run_emulation(compose: dict[str, Any]) -> None:
    test = compose["services"]["test"]
    assert test["network_mode"] == "none"
    assert test["environment"]["FABRICLAB_REQUIRE_EMULATION"] == "1"
    assert test["command"] == ["sh", "tests/suite.sh"]
    # both phases, the emulation one without -n (one test at a time), and neither can be skipped
    script = (ROOT / "tests" / "suite.sh").read_text(encoding="utf-8")
    lines = [line for line in script.splitlines() if line.startswith("python -m pytest")]
    assert lines == [
        'python -m pytest -q -m "not emulation" -n "$workers" "$@"',
        'python -m pytest -q -m emulation "$@"',
    ]
    assert 'if [ "$pure" -ne 0 ]; then exit "$pure"; fi' in script and script.rstrip().endswith(
        'exit "$emulated"'
    )
    assert test["profiles"] == ["test"]  # not started by `docker compose up`
    assert test["environment"]["FABRICLAB_ARTIFACTS"].startswith("/fabriclab/results/")  # the screenshot


def test_observability_profile_runs_prometheus_on_both_endpoints(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    assert prometheus["profiles"] == ["observability"] and prometheus["network_mode"] == "host"
    assert "cap_add" not in prometheus and "volumes" not in prometheus
    script = prometheus["command"][2]
    assert prometheus["command"][:2] == ["sh", "-c"]
    assert "--web.listen-address=127.0.0.1:$$PROMETHEUS_PORT" in script  # loopback; $$: the shell's $
    assert "--web.console.templates=/etc/fabriclab/consoles" in script
    env = prometheus["environment"]
    assert env["API_PORT"] == "${FABRICLAB_API_PORT:-8080}"
    assert env["EMU_API_PORT"] == "${FABRICLAB_EMU_API_PORT:-8081}"
    config = (ROOT / "docker" / "prometheus" / "prometheus.yml.in").read_text()
    rendered = yaml.safe_load(config.replace("@API_PORT@", "8080").replace("@EMU_API_PORT@", "8081"))
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in rendered["scrape_configs"]}
    assert targets == {"fabriclab-controller": ["127.0.0.1:8080"], "fabriclab-emulator": ["127.0.0.1:8081"]}
    dockerfile = (ROOT / "docker" / "prometheus.Dockerfile").read_text()
    assert re.findall(r"^FROM .*$", dockerfile, re.M) == [
        "FROM debian:bookworm-slim"
    ]  # same base, Debian's package
    assert "install -y --no-install-recommends prometheus" in dockerfile and "USER prometheus" in dockerfile


def test_cluster_profile_is_a_scheduler_and_emulation_hosts_on_the_host_network(
    compose: dict[str, Any],
) -> None:
    """`docker compose --profile cluster up`: what `emulate up --dask` places shards on (docs/sharding.md);
    never started by a plain `docker compose up`."""
    scheduler, host = compose["services"]["scheduler"], compose["services"]["emu-host"]
    for service in (scheduler, host):
        assert service["profiles"] == ["cluster"] and service["network_mode"] == "host"
    assert "cap_add" not in scheduler  # the scheduler only coordinates
    assert set(host["cap_add"]) == EMULATION_CAPS  # the shards: namespaces, OVS, VXLAN
    assert scheduler["command"][:4] == ["python", "-m", "dask", "scheduler"]
    worker = host["command"]
    assert worker[:4] == ["python", "-m", "dask", "worker"]
    assert worker[worker.index("--resources") + 1] == "fabriclab-emu=1"  # emulation.cluster.EMU_RESOURCE
    assert worker[worker.index("--host") + 1] == "${FABRICLAB_UNDERLAY_IP:-127.0.0.1}"


def test_every_setting_is_documented_with_its_default() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = dict(re.findall(r"\$\{(FABRICLAB_[A-Z_]+):-([^}]*)\}", text))
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert used == example  # same names, same defaults
    settings = (ROOT / "docs" / "compose.md").read_text()  # the settings table (the README links it)
    assert [name for name in used if f"`{name}`" not in settings] == []
    assert "docs/compose.md" in (ROOT / "README.md").read_text()


def test_image_installs_extra_cas_from_the_documented_folder() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.findall(r"^FROM .*$", dockerfile, re.M) == [
        "FROM debian:bookworm-slim AS web",
        "FROM debian:bookworm-slim AS runtime",
        "FROM runtime AS test",
    ]
    stages = re.split(r"^FROM .*$", dockerfile, flags=re.M)[1:]
    for stage, fetch in ((stages[0], "npm ci"), (stages[1], "pip install")):
        copy = re.search(r"^COPY docker/certs/ (\S+)$", stage, re.M)
        assert copy and copy.group(1).startswith("/usr/local/share/ca-certificates/")
        assert stage.index("update-ca-certificates") < stage.index(fetch)  # trusted before any HTTPS fetch
    assert "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt" in stages[0]
    assert "COPY web/package.json web/package-lock.json" in stages[0]  # the lockfile pins the bundle
    assert "COPY --from=web /src/controller/observe/page/dist/" in stages[1]
    assert "chromium chromium-driver" in stages[2] and "chromium" not in stages[1]
    assert (ROOT / "docker" / "certs" / "README.md").is_file()
    assert "/docker/certs/*.crt" in (ROOT / ".gitignore").read_text().splitlines()


def test_readme_starts_with_the_two_commands_and_ci_runs_them() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["docker compose up", "docker compose run --rm test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "../shared/ci/prepare-docker.sh --ca-dir docker/certs" in ci
    assert "\ndocker compose run --rm test " in ci  # README's test command, verbatim
    assert "python3 .ci/compose_smoke.py" in ci


@pytest.mark.parametrize(
    ("pure", "emulated", "expected"), [(0, 0, 0), (1, 0, 1), (0, 1, 1), (0, 5, 5), (2, 1, 2)]
)
def test_the_suite_runs_both_phases_and_fails_when_either_does(
    tmp_path: Path, pure: int, emulated: int, expected: int
) -> None:
    """tests/suite.sh with a stand-in `python` that records its arguments and exits as told."""
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\necho "$*" >> "$CALLS"\n'
        'case "$*" in *"not emulation"*) exit "$PURE";; *) exit "$EMULATED";; esac\n'
    )
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "CALLS": str(calls),
           "PURE": str(pure), "EMULATED": str(emulated), "FABRICLAB_TEST_WORKERS": "3"}  # fmt: skip
    done = subprocess.run(["sh", str(ROOT / "tests" / "suite.sh"), "-x"], env=env, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == expected, done.stdout + done.stderr
    assert calls.read_text().splitlines() == [
        "-m pytest -q -m not emulation -n 3 -x",
        "-m pytest -q -m emulation -x",
    ]
