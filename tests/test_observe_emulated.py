"""Observability end to end on a real emulated k=4 fabric (Mininet, userspace OVS) with the controller as
its own process: `/metrics` of the controller and of the emulator move under traffic and faults (parsed with
prometheus_client's parser), and the live view in a real headless Chromium draws every node and link,
marks a link failed through the emulator's API within 2 s, with the reroute in its timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.httpguard import BackgroundServer
from controller.rest.client import ControllerClient, wait_for
from controller.sm.manager import SubnetManager
from emulation.controlproc import ControllerProcess, free_port
from emulation.mnfabric import MininetFabric, mininet_available
from emulation.ovs import OvsDaemon
from emulation.session import serve_faults
from tests.conftest import ROOT
from tests.emulation_support import require_emulation
from tests.observe_support import Samples, headless_chromium, parse_metrics, require_bundle, total
from topologies.loader import load_topology
from topologies.model import Fabric
from topologies.scale import Scale

TOPOLOGY = ROOT / "topologies" / "fat-tree-k4.yaml"
TOKEN = "observe-test-token"
#: Links shaped to 10 Mb/s, so a few hundred packets per second per host colour the view.
SCALE = "400G=10M"
ARTIFACTS = Path(os.environ.get("FABRICLAB_ARTIFACTS", ROOT / "out"))


@dataclass
class Live:
    fabric: Fabric
    ctl: ControllerProcess
    net: MininetFabric
    emu: tuple[str, int]
    ip_of: dict[str, str]

    def metrics(self, where: str = "controller", detail: bool = False) -> Samples:
        """`detail`: the controller's series per switch port and link (`/metrics?detail=ports`)."""
        host, port = (self.ctl.host, self.ctl.api_port) if where == "controller" else self.emu
        query = "?detail=ports" if detail else ""
        with urllib.request.urlopen(f"http://{host}:{port}/metrics{query}", timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            return parse_metrics(response.read().decode())

    def fault(self, action: str, target: str, token: str | None = TOKEN) -> tuple[int, Any]:
        client = ControllerClient(*self.emu)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return client.request("POST", "faults", json.dumps({"action": action, "target": target}), headers)

    def alltoall(
        self, seconds: float, rate_pps: float = 250, size: int = 1000
    ) -> list[subprocess.Popen[str]]:
        """Every host sends to every other, round robin: an all-to-all in the background."""
        procs = []
        for host in self.fabric.hosts_names():
            others = [ip for h, ip in self.ip_of.items() if h != host]
            argv = [
                sys.executable,
                str(ROOT / "tests" / "alltoall_sender.py"),
                "7000",
                str(rate_pps),
                str(seconds),
                str(size),
                *others,
            ]
            procs.append(
                self.net.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            )
        return procs


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    require_emulation(mininet_available())
    daemon = OvsDaemon()
    daemon.ensure_running()
    work = tmp_path_factory.mktemp("observe")
    fabric = load_topology(TOPOLOGY)
    addresses = SubnetManager(fabric).addresses.as_strings()
    ctl = ControllerProcess(
        TOPOLOGY,
        work / "state",
        work / "controller.log",
        "--capacity-scale",
        SCALE,
        "--stats-interval",
        "0.5",
    )
    ctl.start(env={"FABRICLAB_API_TOKEN": TOKEN})
    net = MininetFabric(fabric, addresses, controller=ctl.openflow, scale=Scale.parse(SCALE),
                        name_prefix=f"v{os.getpid() % 1000}")  # fmt: skip
    server: BackgroundServer | None = None
    try:
        try:
            net.start()
        except UnicodeDecodeError:  # Mininet's RemoteController probe decodes the OpenFlow HELLO as text
            net.start()  # start() tore down what it built; once more
        ctl.ready(len(fabric.switches))
        emu = ("127.0.0.1", free_port())
        summary = {
            "fabric": fabric.summary(),
            "switches": 20,
            "hosts": 16,
            "pairs": 0,
            "pairs_reachable": 0,
            "verified_s": 0.0,
        }
        server = serve_faults(net, summary, emu, TOKEN, controller_api=(ctl.host, ctl.api_port))
        ip_of = {host: ip for (host, _), (_, ip) in addresses.items()}
        yield Live(fabric, ctl, net, emu, ip_of)
    finally:
        if server is not None:
            server.stop()
        net.stop()
        ctl.stop()
        daemon.stop_if_started()


def _wait_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.communicate(timeout=60)


def _port_series(metrics: Any) -> int:
    return len({lbl for (n, lbl) in metrics if n == "fabriclab_port_transmit_bytes_total"})


def test_metrics_of_controller_and_emulator_move_under_traffic_and_faults(live: Live) -> None:
    # Port counters arrive with the stats poller's first round, which runs after the switches are ready:
    # on a loaded machine that round can end after this test starts, so wait for it (bounded).
    deadline = time.monotonic() + 30
    while _port_series(live.metrics(detail=True)) < 80 and time.monotonic() < deadline:
        time.sleep(0.5)
    before, emu_before = live.metrics(), live.metrics("emulator")
    assert total(before, "fabriclab_switches_connected") == 20
    assert total(before, "fabriclab_switches_in_sync") == 20
    assert total(before, "fabriclab_routing_info", engine="ftree") == 1
    assert total(before, "fabriclab_events_total", kind="switch_connect") >= 20
    assert total(before, "fabriclab_http_request_duration_seconds_count", route="/api/v1/health") >= 1
    assert _port_series(live.metrics(detail=True)) == 80  # every switch port, on request
    assert _port_series(before) == 3  # by default one series per tier (leaf, aggregation, core)
    assert len({lbl for (n, lbl) in emu_before if n == "fabriclab_emulator_port_transmit_bytes_total"}) == 80
    assert total(emu_before, "fabriclab_emulator_cpus") >= 1

    procs = live.alltoall(seconds=4)

    def utilised() -> Samples | None:
        samples = live.metrics(detail=True)
        busy = [v for (n, _), v in samples.items() if n == "fabriclab_link_utilisation_ratio" and v > 0.05]
        return samples if len(busy) >= 16 else None

    during = wait_for(utilised, 10, "links utilised above 5 % under the all-to-all", interval_s=0.5)
    _wait_all(procs)
    after, emu_after = live.metrics(), live.metrics("emulator")
    for tier in ("host-leaf", "leaf-aggregation", "aggregation-core"):  # every tier carries the all-to-all
        assert any(
            v > 0.02
            for (n, lbl), v in during.items()
            if n == "fabriclab_link_utilisation_ratio" and ("tier", tier) in lbl
        ), tier
    sent = total(after, "fabriclab_port_transmit_bytes_total") - total(
        before, "fabriclab_port_transmit_bytes_total"
    )
    assert sent > 16 * 4 * 250 * 1000  # at least every host's payload crossed one switch port
    grew = total(emu_after, "fabriclab_emulator_port_transmit_bytes_total") - total(
        emu_before, "fabriclab_emulator_port_transmit_bytes_total"
    )
    assert grew > 16 * 4 * 250 * 1000
    assert total(after, "fabriclab_port_transmit_packets_total", tier="core") > total(
        before, "fabriclab_port_transmit_packets_total", tier="core"
    )
    assert (
        "fabriclab_emulator_shaper_drops_total",
        (("port", "3"), ("switch", "leaf1"), ("tier", "leaf")),
    ) in emu_after

    # a link failure: counted by kind, timed as a failover, flow-mods sent, the link shown down
    status, body = live.fault("link_down", "leaf1:3")
    assert status == 200, body
    try:
        link = next(f"{k.a}-{k.b}" for k in live.fabric.links if "leaf1:3" in (str(k.a), str(k.b)))

        def rerouted() -> Samples | None:
            samples = live.metrics(detail=True)
            return (
                samples
                if total(samples, "fabriclab_events_total", kind="port_down")
                > total(after, "fabriclab_events_total", kind="port_down")
                else None
            )

        failed = wait_for(rerouted, 10, "a port_down event in the metrics", interval_s=0.2)
        assert total(failed, "fabriclab_link_up", link=link) == 0
        assert (
            total(failed, "fabriclab_failover_duration_seconds_count")
            == total(after, "fabriclab_failover_duration_seconds_count") + 1
        )
        assert (
            0
            < total(failed, "fabriclab_failover_duration_seconds_sum")
            - total(after, "fabriclab_failover_duration_seconds_sum")
            < 5
        )
        assert (
            total(failed, "fabriclab_reroute_duration_seconds_count", cause="port_down", phase="installed")
            >= 1
        )
        assert total(failed, "fabriclab_flow_mods_sent_total") > total(
            after, "fabriclab_flow_mods_sent_total"
        )
        assert total(failed, "fabriclab_routing_generation") > total(after, "fabriclab_routing_generation")
        assert total(failed, "fabriclab_events_unobserved_total") == 0
        assert (
            total(
                live.metrics("emulator"),
                "fabriclab_http_request_duration_seconds_count",
                route="/api/v1/faults",
                code="200",
            )
            >= 1
        )
    finally:
        assert live.fault("link_up", "leaf1:3")[0] == 200
        wait_for(lambda: all(lk["up"] for lk in live.ctl.get("links?counters=false")), 10, "leaf1:3 up again")
        live.ctl.ready(len(live.fabric.switches), timeout_s=20)


def test_live_view_draws_the_fabric_and_shows_a_failure_within_two_seconds(live: Live) -> None:
    require_bundle()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    nodes = set(live.fabric.nodes)
    links = {f"{k.a}-{k.b}" for k in live.fabric.links}
    target = "leaf2:4"
    key = next(f"{k.a}-{k.b}" for k in live.fabric.links if target in (str(k.a), str(k.b)))
    procs = live.alltoall(seconds=25)
    try:
        with headless_chromium() as browser:
            url = f"http://{live.ctl.host}:{live.ctl.api_port}/?emu=http://{live.emu[0]}:{live.emu[1]}"
            browser.get(url)
            wait = WebDriverWait(browser, 20, poll_frequency=0.05)
            wait.until(lambda b: b.execute_script("return document.body.dataset.live") == "yes")
            drawn = {
                e.get_attribute("data-node") for e in browser.find_elements(By.CSS_SELECTOR, "[data-node]")
            }
            assert drawn == nodes
            wires = {
                e.get_attribute("data-link") for e in browser.find_elements(By.CSS_SELECTOR, "[data-link]")
            }
            assert wires == links
            assert browser.find_elements(By.CSS_SELECTOR, "[data-link][data-state=down]") == []
            # utilisation arrives: some link is coloured (not the idle grey)
            wait.until(
                lambda b: b.execute_script(
                    "return [...document.querySelectorAll('[data-link] .wire')]"
                    ".some(w => w.getAttribute('stroke') !== '#b9c2cc')"
                )
            )

            # the token goes in once; then fail the link from the page (the emulator's API, with CORS)
            token = browser.find_element(By.ID, "token")
            token.send_keys(TOKEN)
            browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", token)
            element = browser.find_element(By.CSS_SELECTOR, f'[data-link="{key}"]')
            browser.execute_script(
                "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", element
            )
            button = wait.until(lambda b: b.find_element(By.ID, "fail-link"))
            clicked = time.monotonic()
            button.click()
            wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, f'[data-link="{key}"][data-state=down]'))
            marked = time.monotonic() - clicked
            ends = key.split("-")  # the reroute names whichever end reported first

            def rerouted(b: Any) -> bool:
                items = b.find_elements(By.CSS_SELECTOR, "li[data-event-kind=port_down]")
                return any(end in e.text for e in items for end in ends)

            wait.until(rerouted)
            timeline = time.monotonic() - clicked
            assert marked <= 2.0 and timeline <= 2.0, (marked, timeline)
            assert "emulator: " in browser.find_element(By.ID, "message").text
            assert [f["target"] for f in ControllerClient(*live.emu).get("faults")][-1] == target

            # the route picker highlights the current route, avoiding the failed link
            browser.find_element(By.CSS_SELECTOR, "#src option[value=h3]").click()
            browser.find_element(By.CSS_SELECTOR, "#dst option[value=h16]").click()
            browser.find_element(By.ID, "show-route").click()
            wait.until(lambda b: "h3" in b.find_element(By.ID, "route-text").text)
            on_route = {
                e.get_attribute("data-link") for e in browser.find_elements(By.CSS_SELECTOR, ".link.route")
            }
            hops = live.ctl.get("routes?src=h3&dst=h16")["hops"]
            assert len(on_route) == len(hops) - 1 and key not in on_route

            # a switch's tables on click
            leaf = browser.find_element(By.CSS_SELECTOR, '[data-node="leaf2"]')
            browser.execute_script(
                "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", leaf
            )
            wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#details-body table.ports tbody tr"))
            rows = browser.find_elements(By.CSS_SELECTOR, "#details-body table.ports tbody tr")
            assert len(rows) == 4 and any("down" in r.text for r in rows)

            time.sleep(1.5)  # a couple of utilisation frames for the picture
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "live-view-k4.png"
            assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
            stats = browser.execute_script("return window.fabriclabStats")
            assert stats["frames"] >= 2
    finally:
        _wait_all(procs)
        live.fault("link_up", target)
