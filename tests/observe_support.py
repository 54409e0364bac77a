"""Shared by the observability tests: the page's script bundle must exist (a clear failure, not a skip,
when it was not built), a headless Chromium through Selenium when the machine has Debian's chromium and
chromium-driver, and Prometheus text parsed into {(name, labels): value}."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.observe.web import bundle_missing
from tests.emulation_support import REQUIRE_ENV

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers have a small /dev/shm
    "--window-size=1500,900",
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def require_bundle() -> None:
    problem = bundle_missing()
    if problem is not None:
        pytest.fail(problem)


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus text exposition (parsed by prometheus_client's own parser)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and want <= set(lbl))


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Debian's chromedriver (nothing downloaded at run time); the network is
    loopback only.  Skips where they are not installed, fails instead under FABRICLAB_REQUIRE_EMULATION=1."""
    paths = chromium_paths()
    if paths is None:
        reason = "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    profile = tempfile.mkdtemp(prefix="fabriclab-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.binary_location = paths[0]
    driver = webdriver.Chrome(service=Service(paths[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
