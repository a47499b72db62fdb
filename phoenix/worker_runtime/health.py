"""HTTP endpoints for Kubernetes and Prometheus: /metrics, /healthz (alive: no restart needed), /readyz."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


async def start_health_server(
    port: int,
    *,
    alive: Callable[[], tuple[bool, str]],
    ready: Callable[[], Awaitable[tuple[bool, str]]],
    registry: CollectorRegistry = REGISTRY,
) -> web.AppRunner:
    """Serve until the returned runner is cleaned up; `registry` is what /metrics exposes (the operator has its own)."""

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok, reason = alive()
        return web.Response(status=200 if ok else 503, text=f"{reason}\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, reason = await ready()
        return web.Response(status=200 if ok else 503, text=f"{reason}\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
