"""`phoenix ui`'s HTTP server (aiohttp): the page and its assets from package data, and the JSON it polls.

Read-only: every route is a GET. The page, its script and its style hold no data and are served to anyone who
reaches the port; /api/ answers only a request bearing the token (`Authorization: Bearer`), compared in constant
time, unless the server was started with --no-auth (loopback only, checked by the command). One poll loop reads
the stages every `interval` seconds whatever the number of open pages; the page asks for its latest result.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from aiohttp import web
from kubernetes.client.exceptions import ApiException

from phoenix.cli.kubectl import PluginError
from phoenix.cli.ui.source import DLQ_PAGE, StageReader

STATIC = resources.files(__package__) / "static"
ASSETS = {"app.js": "text/javascript", "style.css": "text/css"}
# Nothing from elsewhere, ever: the page works without internet access, and an injected URL could not load.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
READER = web.AppKey("reader", StageReader)
LATEST = web.AppKey("latest", dict[str, Any])


@dataclass(frozen=True, slots=True)
class ServerOptions:
    token: str | None  # None: no auth (the command allows it on loopback only)
    interval: float  # seconds between two reads of the stages


def make_app(reader: StageReader, options: ServerOptions) -> web.Application:
    app = web.Application(middlewares=[_headers, _authenticated(options.token)])
    app[READER] = reader
    app[LATEST] = {"pipelines": [], "problems": [], "error": "not read yet", "at": None}
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _asset)
    app.router.add_get("/api/pipelines", _pipelines)
    app.router.add_get("/api/stages/{namespace}/{name}/dlq", _dead_letters)
    app.cleanup_ctx.append(_polling(options.interval))
    return app


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.update(SECURITY_HEADERS)
    return response


def _authenticated(token: str | None) -> Any:
    expected = None if token is None else f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and request.path.startswith("/api/"):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                raise web.HTTPUnauthorized(
                    text='{"error": "a bearer token is required"}',
                    content_type="application/json",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return check


def _polling(interval: float) -> Callable[[web.Application], Any]:
    async def context(app: web.Application) -> Any:
        task = asyncio.create_task(_poll(app, interval))
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await app[READER].aclose()

    return context


async def _poll(app: web.Application, interval: float) -> None:
    while True:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            found = await app[READER].snapshot()
            app[LATEST] = {**found, "error": None, "at": at, "intervalSeconds": interval}
        except Exception as exc:  # the API server down raises urllib3's own errors: whatever it is, the loop goes on
            # The last pipelines stay on the page, with the reason they are not fresh.
            last: dict[str, Any] = app[LATEST]
            app[LATEST] = {**last, "error": _explain(exc), "at": at, "intervalSeconds": interval}
        await asyncio.sleep(interval)


def _explain(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"the API server refused: {exc.status} {exc.reason}"
    return " ".join(str(exc).split()) or type(exc).__name__


async def _index(request: web.Request) -> web.Response:
    return web.Response(text=(STATIC / "index.html").read_text(), content_type="text/html")


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.Response(text=(STATIC / name).read_text(), content_type=ASSETS[name])


async def _pipelines(request: web.Request) -> web.Response:
    return web.json_response(request.app[LATEST])


async def _dead_letters(request: web.Request) -> web.Response:
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        found = await request.app[READER].dead_letters(namespace, name, DLQ_PAGE)
    except (PluginError, ApiException) as exc:  # not found, a Secret the caller may not read, Redis down
        return web.json_response({"error": _explain(exc)}, status=502)
    return web.json_response(found)
