"""The page at `/`, its data (`/api/v1/view`, `/api/v1/view/stream`) and `/metrics`, on the REST app.

Every asset ships in the package (`controller/observe/page/`): the HTML and CSS are source files, the
script is a bundle built from `web/` with npm (`npm ci && npm run build`, pinned by its lockfile; the Docker
image builds it).  A checkout without the bundle serves a page that says how to build it, never a page
that half works; the response carries a Content-Security-Policy that allows scripts and styles from this
server only, so a CDN could not sneak in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from prometheus_client import CollectorRegistry
from starlette.staticfiles import StaticFiles

from controller.httpguard import API, ApiError
from controller.observe.live import LiveOptions, LiveView
from controller.observe.metrics import Observer, RecordFollower, controller_registry
from controller.observe.model import Layout, capacity_factor
from controller.published import Published
from topologies.scale import Scale

PAGE_DIR = Path(__file__).parent / "page"
BUNDLE = PAGE_DIR / "dist" / "fabric-view.js"
BUILD_HINT = "cd web && npm ci && npm run build"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' http: https:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def bundle_missing() -> str | None:
    """Why the page cannot work (its script was not built), or None.  Named relative to the checkout: a
    page served to anyone does not show where the server's files are."""
    if BUNDLE.is_file() and BUNDLE.stat().st_size > 0:
        return None
    where = f"controller/observe/page/dist/{BUNDLE.name}"
    return f"the live view's script ({where}) is not built: run `{BUILD_HINT}`"


@dataclass
class Observability:
    """Metrics registry, event follower and live view of one controller."""

    layout: Layout
    registry: CollectorRegistry
    follower: RecordFollower
    live: LiveView
    snapshot: Callable[[], Published] = field(repr=False)
    #: What `/metrics?detail=ports` serves: per switch port and link.
    detailed: CollectorRegistry | None = None

    @classmethod
    def for_service(
        cls,
        snapshot: Callable[[], Published],
        scale: Scale | None = None,
        options: LiveOptions | None = None,
        token_required: bool = False,
    ) -> Observability:
        layout = Layout(snapshot().context.declared)
        factor = capacity_factor(scale)
        registry, follower, detailed = controller_registry(snapshot, layout, factor)
        live = LiveView(snapshot, layout, factor, options, token_required)
        return cls(layout, registry, follower, live, snapshot, detailed)

    def observer(self, interval_s: float = 0.5) -> Observer:
        return Observer(self.snapshot, self.follower, interval_s)


def mount(app: FastAPI, obs: Observability) -> None:
    """The page, its static files and its data on `app` (`/metrics` comes with `common.install`)."""
    live = obs.live
    app.mount("/ui", StaticFiles(directory=PAGE_DIR, check_dir=False), name="ui")

    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        problem = bundle_missing()
        if problem is not None:
            return HTMLResponse(
                f"<!doctype html><title>fabriclab</title><p>{problem}</p>"
                f'<p>The REST API is at <a href="/docs">/docs</a>.</p>',
                status_code=503,
                headers={"Content-Security-Policy": CSP},
            )
        html = (PAGE_DIR / "index.html").read_text(encoding="utf-8")
        return HTMLResponse(html, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})

    @app.get(f"{API}/view", include_in_schema=False)
    def view() -> JSONResponse:
        return JSONResponse(live.view())

    @app.get(f"{API}/view/stream", include_in_schema=False)
    def stream(since: Annotated[int, Query(ge=0, le=2**62)] = 0) -> StreamingResponse:
        """Server-sent events: a frame whenever the fabric changed, at most 1/frame_interval_s a second."""
        if not live.can_accept():
            raise ApiError(503, "too many live-view clients; try again shortly", None, {"Retry-After": "5"})
        return StreamingResponse(
            live.stream(since),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


__all__ = ["BUILD_HINT", "BUNDLE", "PAGE_DIR", "Observability", "bundle_missing", "mount"]
