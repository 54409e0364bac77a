"""Every `curl` line the docs show against the controller (localhost:8080) runs here, against the real
controller service and REST app on fake switches that decode its OpenFlow (a k=4 fat-tree, the fabric the
docs use).  The method, headers and body are the line's own; a line followed by an `{"error": ...}` output
must be refused with that error (4xx), any other must succeed (2xx) — so a line that would get 415 for a
missing Content-Type, or 404 for a path that moved, fails here.  Lines of one page run in order on one
controller (a GET may read what a POST before it made).  The emulator's API (localhost:8081) is run by the
emulation tests."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import pytest

from tests.test_docs import PAGES, code_lines
from tests.test_rest_api import Rig


class Curl(NamedTuple):
    page: str
    method: str
    path: str
    headers: dict[str, str]
    body: str | None
    error: str | None  # the error the docs show it answering, if any


def curl_lines(page: Path) -> list[Curl]:
    found: list[Curl] = []
    for text, following in code_lines(page):
        if not text.startswith("curl ") or "localhost:8080" not in text:
            continue
        words = shlex.split(text.split(" | ")[0], comments=True)
        method, headers, body, url = "GET", {}, None, ""
        k = 1
        while k < len(words):
            word = words[k]
            if word == "-X":
                method, k = words[k + 1], k + 2
            elif word == "-H":
                name, _, value = words[k + 1].partition(":")
                headers[name.strip()], k = value.strip(), k + 2
            elif word in ("-d", "--data"):
                body, k = words[k + 1], k + 2
                method = "POST" if method == "GET" else method
            elif word.startswith("-"):
                k += 1
            else:
                url, k = word, k + 1
        error = json.loads(following)["error"] if following.startswith('{"error"') else None
        parts = urlsplit("http://" + url if "://" not in url else url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        found.append(Curl(page.name, method, path, headers, body, error))
    return found


PAGES_WITH_CURL = [p for p in PAGES if curl_lines(p)]


def test_the_docs_have_curl_lines_to_run() -> None:
    lines = [c for p in PAGES for c in curl_lines(p)]
    assert len(lines) >= 15 and any(c.body for c in lines) and any(c.error for c in lines)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    r.connect_all()
    yield r
    r.service.stop()


@pytest.mark.parametrize("page", PAGES_WITH_CURL, ids=lambda p: p.name)
def test_curl_lines_answer_as_the_docs_show(page: Path, rig: Rig) -> None:
    for curl in curl_lines(page):
        response = rig.client.request(
            curl.method, curl.path, content=curl.body.encode() if curl.body else None, headers=curl.headers
        )
        shown = (
            f"{page.name}: curl -X {curl.method} {curl.path}: {response.status_code} {response.text[:200]}"
        )
        if curl.error is None:
            assert 200 <= response.status_code < 300, shown
        else:
            assert 400 <= response.status_code < 500, shown
            assert response.json()["error"] == curl.error, shown
