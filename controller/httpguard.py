"""What every fabriclab REST API shares (the controller's and the emulator's): one guard, one error shape.

* **Errors** are JSON `{"error": ..., "field": ...}` naming the offending field, never a traceback and never
  an echo of (possibly huge) input; a rejected request changes nothing.
* **The guard** (an ASGI middleware, so it sees requests before FastAPI parses anything):
  - `Host` must be one of the names the server answers to (DNS rebinding: a web page that re-points its own
    name at 127.0.0.1 still sends its own name as Host);
  - bodies are bounded (413), read completely before the app sees them, and a client that disconnects
    mid-body is a log line, not a traceback;
  - mutations must say `Content-Type: application/json` (415) — a cross-site page can POST `text/plain` or
    form encoding without a CORS preflight, never JSON.  One exception: `PUT` also takes curl's default
    `-d` encoding (`application/x-www-form-urlencoded`), because browsers preflight every cross-origin PUT
    anyway; the body must still be a JSON object;
  - at most one `Authorization` header.
* **Tokens**: with a token set, mutations need `Authorization: Bearer <token>`; 401 carries
  `WWW-Authenticate`.  An empty token is a configuration error, not "open".
* **Docs** (`/docs`) load Swagger UI from the `swagger-ui-bundle` package, so they work without internet.
* **Metrics**: the guard times every request (to its response headers, so a server-sent event stream
  counts as the time it took to start) into `fabriclab_http_request_duration_seconds`, labelled with the
  route's template (never the raw path: a scan of random URLs must not create series), and `/metrics`
  serves the app's own registry in Prometheus' text format.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from topologies.errors import clip_words

LOG = logging.getLogger("fabriclab.rest")
API = "/api/v1"
TOKEN_ENV = "FABRICLAB_API_TOKEN"
ALLOWED_HOSTS_ENV = "FABRICLAB_API_ALLOWED_HOSTS"
#: Request bodies above this are refused (413) before they are read: the largest legitimate body (a P_Key
#: with every host of a 16k-GPU fabric as a member) is well below.
MAX_BODY_BYTES = 1 << 20
_MUTATIONS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_FIELD_CHARS = 80

_Model = TypeVar("_Model", bound=BaseModel)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


class ErrorBody(BaseModel):
    """Every error response."""

    error: str
    field: str | None = None


def error_response(
    status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Every error answer.  Whatever a message repeats of the request (a 900 KB member name, a 60,000
    character path segment) is clipped here, once for all: no answer echoes more than `ECHO_CHARS` of any
    one value."""
    body = {"error": clip_words(message), "field": clip_words(field) if field is not None else None}
    return JSONResponse(body, status_code=status, headers=headers)


def _short(text: str, limit: int = _FIELD_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def token_from_env(value: str | None) -> str | None:
    """The API token from the environment: unset means no token; set but empty is a mistake."""
    if value is None:
        return None
    if not value.strip():
        raise ValueError(f"{TOKEN_ENV} is set but empty: unset it for no token, or give it a value")
    if value != value.strip() or any(c in value for c in "\r\n"):
        raise ValueError(f"{TOKEN_ENV} must not contain whitespace at its ends or line breaks")
    return value


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The `Host` header values a server bound to host:port answers to; None = any (a wildcard bind, where
    the names clients use cannot be known; `FABRICLAB_API_ALLOWED_HOSTS` narrows it)."""
    extra = [e.strip().lower() for e in extra if e.strip()]
    if host in ("0.0.0.0", "::", "") and not extra:
        return None
    names = {host.lower(), *extra}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "::1"}
    result = set()
    for name in names:
        bare = name.strip("[]")
        shown = f"[{bare}]" if ":" in bare else bare
        result |= {shown, f"{shown}:{port}"}
    return frozenset(result)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class HttpMetrics:
    """Request latency of one app, in that app's registry (two apps in one process never share series)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.duration = Histogram(
            "fabriclab_http_request_duration_seconds",
            "REST request latency until the response headers were sent, by route template and status code",
            ["method", "route", "code"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        method = str(scope.get("method", ""))
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        self.duration.labels(method if method in _METHODS else "other", route, str(status)).observe(seconds)


class Guard:
    """ASGI middleware: Host allow-list, bounded and fully-read bodies, JSON mutations, one Authorization;
    and the latency of every request when given `metrics`."""

    def __init__(
        self,
        app: ASGIApp,
        hosts: frozenset[str] | None,
        max_body_bytes: int = MAX_BODY_BYTES,
        metrics: HttpMetrics | None = None,
    ):
        self.app, self.hosts, self.max_body_bytes, self.metrics = app, hosts, max_body_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics = self.metrics
        if metrics is None:
            await self._guarded(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics.observe(scope, int(message["status"]), time.perf_counter() - start)
            await send(message)

        await self._guarded(scope, receive, timed)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        problem = self._check(scope["method"], headers)
        if problem is not None:
            await _send_error(send, *problem)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                LOG.info(
                    "%s %s: client went away before sending its whole body", scope["method"], scope["path"]
                )
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body"))
            if len(body) > self.max_body_bytes:
                await _send_error(send, 413, f"body larger than {self.max_body_bytes} bytes", None)
                return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _check(self, method: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, str, str | None] | None:
        values: dict[bytes, list[bytes]] = {}
        for name, value in headers:
            values.setdefault(name.lower(), []).append(value)
        host = b"".join(values.get(b"host", [b""])[:1]).decode("latin-1").lower()
        if self.hosts is not None and host not in self.hosts:
            return 400, f"Host {_short(host)!r} is not a name this server answers to", "Host"
        if len(values.get(b"authorization", [])) > 1:
            return 400, "more than one Authorization header", "Authorization"
        length = values.get(b"content-length", [b"0"])[0]
        if not length.isdigit() and length:
            return 400, "Content-Length is not a number", "Content-Length"
        if length.isdigit() and (len(length) > 12 or int(length) > self.max_body_bytes):
            return 413, f"body larger than {self.max_body_bytes} bytes", None
        if method in _MUTATIONS and (length not in (b"", b"0") or b"transfer-encoding" in values):
            kind = values.get(b"content-type", [b""])[0].decode("latin-1").split(";")[0].strip().lower()
            allowed = {"application/json"} | (
                {"application/x-www-form-urlencoded"} if method == "PUT" else set()
            )
            if kind not in allowed:
                return (
                    415,
                    f"Content-Type must be application/json, not {_short(kind) or 'none'!r}",
                    "Content-Type",
                )
        return None


async def _send_error(send: Send, status: int, message: str, field: str | None) -> None:
    payload = json.dumps({"error": message, "field": field}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def require_token_dependency(token: str | None) -> Callable[..., None]:
    """A FastAPI dependency: with a token set, `Authorization: Bearer <token>` or 401."""

    def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is None:
            return
        expected = f"Bearer {token}".encode()
        given = (authorization or "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            raise ApiError(
                401, "missing or wrong bearer token", "Authorization", {"WWW-Authenticate": "Bearer"}
            )

    return require_token


def parse_body(raw: bytes, model: type[_Model]) -> _Model:
    """A JSON object body validated by `model`: 400 for what is not JSON, 422 for what does not fit."""
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {_short(str(exc))}", None) from None
    except RecursionError:
        raise ApiError(400, "body is nested too deeply", None) from None
    except ValueError as exc:  # e.g. integers past Python's digit limit
        raise ApiError(400, f"body has a value that cannot be read: {_short(str(exc))}", None) from None
    if not isinstance(data, dict):
        raise ApiError(422, "body must be a JSON object", None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        field = _short(".".join(str(p) for p in first["loc"])) or None
        raise ApiError(422, f"{field}: {_short(first['msg'], 300)}", field) from None
    except RecursionError:
        raise ApiError(400, "body is nested too deeply", None) from None


def install(
    app: FastAPI,
    hosts: frozenset[str] | None,
    max_body_bytes: int = MAX_BODY_BYTES,
    registry: CollectorRegistry | None = None,
    detailed: CollectorRegistry | None = None,
) -> None:
    """Error handlers, the guard and local API docs on `app` (created with `docs_url=None`); with a
    `registry`, request latency goes into it and `GET /metrics` serves it (and `GET /metrics?detail=ports`
    serves `detailed`, when given: the large per-entity view, asked for explicitly)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.field, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, _short(str(exc.detail), 300), None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
        field = _short(".".join(loc)) or None
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        return error_response(422, _short(message, 300), field)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        LOG.error(
            "%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, _short(str(exc))
        )
        return error_response(500, f"internal error ({type(exc).__name__}); see the server log", None)

    metrics = HttpMetrics(registry) if registry is not None else None
    app.add_middleware(Guard, hosts=hosts, max_body_bytes=max_body_bytes, metrics=metrics)
    _local_docs(app)
    if registry is not None:
        _metrics_endpoint(app, registry, detailed)


def _metrics_endpoint(app: FastAPI, registry: CollectorRegistry, detailed: CollectorRegistry | None) -> None:
    @app.get("/metrics", include_in_schema=False)
    def metrics(detail: str | None = None) -> Response:  # a plain def: runs on the thread pool
        if detail is None:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
        if detail != "ports" or detailed is None:
            choices = "'ports'" if detailed is not None else "none here"
            raise ApiError(422, f"detail: expected {choices}, got {_short(detail, 40)!r}", "detail")
        return Response(generate_latest(detailed), media_type=CONTENT_TYPE_LATEST)


def allow_page_origins(app: FastAPI, origins: Iterable[str]) -> None:
    """Let pages served from `origins` (the controller's live view) call this API from a browser, with a
    bearer token: CORS for exactly those origins, GET and POST only.  Call after `install`."""
    from starlette.middleware.cors import CORSMiddleware  # noqa: PLC0415

    allowed = sorted({o.rstrip("/") for o in origins if o})
    if allowed:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=allowed,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )


def page_origins(host: str, port: int) -> list[str]:
    """The origins a browser shows for a server at host:port (loopback answers to its usual names too)."""
    names = {host}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "[::1]"}
    return sorted(
        f"http://{'[' + n + ']' if ':' in n and not n.startswith('[') else n}:{port}" for n in names
    )


def _local_docs(app: FastAPI) -> None:
    import swagger_ui_bundle  # noqa: PLC0415
    from starlette.staticfiles import StaticFiles  # noqa: PLC0415

    app.mount("/docs-assets", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon-32x32.png",
        )


@dataclass
class BackgroundServer:
    """uvicorn serving an app on a thread of this process."""

    server: Any
    thread: threading.Thread

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


class ListenError(RuntimeError):
    pass


def serve_in_thread(app: FastAPI, address: tuple[str, int], name: str, option: str) -> BackgroundServer:
    """Start uvicorn for `app` on a thread; return once it accepts connections (or raise ListenError)."""
    import uvicorn  # noqa: PLC0415

    host, port = address
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:  # announce the address only once it answers
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ListenError(f"{option}: cannot listen on {host}:{port}")
        time.sleep(0.02)
    return BackgroundServer(server, thread)


__all__ = [
    "ALLOWED_HOSTS_ENV",
    "API",
    "MAX_BODY_BYTES",
    "TOKEN_ENV",
    "ApiError",
    "BackgroundServer",
    "ErrorBody",
    "Guard",
    "HttpMetrics",
    "ListenError",
    "allow_page_origins",
    "allowed_hosts",
    "error_response",
    "install",
    "is_loopback",
    "page_origins",
    "parse_body",
    "require_token_dependency",
    "serve_in_thread",
    "token_from_env",
]
