"""A small REST client of the controller (stdlib only): what the emulator, the benchmarks, the tests and CI's
compose smoke use to talk to a running controller (or to the emulator's API, which speaks the same style).

Kept free of FastAPI and of the rest of the controller so that a bare `python3` on the CI host can use it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError):
    """`wait_for` gave up.  An AssertionError, so that tests read it as a failed expectation; its own type, so
    that the CLI can tell the user what did not become ready instead of showing a traceback."""


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise WaitTimeout(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")


class ControllerClient:
    """The controller's REST API at host:api_port, whoever started it (this process, a user, compose)."""

    def __init__(self, host: str, api_port: int) -> None:
        self.host, self.api_port = host, api_port

    def request(
        self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        req = urllib.request.Request(
            f"http://{self.host}:{self.api_port}/api/v1/{path}",
            data=body.encode() if body is not None else None,
            method=method,
            headers={**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, body
        return body

    def ready(self, switches: int, timeout_s: float = 60) -> dict[str, Any]:
        """Wait until every switch is connected and holds the current tables."""

        def check() -> dict[str, Any] | None:
            health: dict[str, Any] = self.get("health")
            ok = health["switches_connected"] == switches and health["in_sync"]
            return health if ok else None

        result: dict[str, Any] = wait_for(check, timeout_s, f"{switches} switches connected and in sync")
        return result


__all__ = ["ControllerClient", "WaitTimeout", "wait_for"]
