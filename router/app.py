"""The router process: ``make_app(settings)`` builds the aiohttp app.

Per request: parse the prompt into block hashes (the replicas' own code), look the
hashes up in the prefix index (one round trip), call the strategy (the simulator's
function) with every replica's load, count the request in flight at that moment, and
proxy it. A replica that fails before answering is reported to the health checker and
the request is retried once elsewhere; if nothing can take it, 503 with Retry-After.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from router import dashboard, views
from router.metrics import GuardMirror, multiprocess_dir
from router.settings import RouterSettings
from router.state import ROUTER, SETTINGS, RouterState
from shared import http_server
from shared.http_server import guard_middleware
from shared.httpkit import BODY_LIMIT, errors_middleware
from shared.offload import OFFLOAD, Offloader, offload_ctx


async def background_ctx(app: web.Application):
    state = app[ROUTER]
    conn = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
    # No cookie jar: replicas set none, and one client's cookie must never ride along on another's request.
    state.cluster.session = aiohttp.ClientSession(connector=conn, auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
    tasks = [asyncio.create_task(state.cluster.health_loop(), name="health")]
    if state.embedded:
        tasks.append(asyncio.create_task(state.cluster.feed_loop(), name="feeds"))
    await asyncio.gather(*(state.cluster.check(r) for r in state.cluster.replicas),
                         *(state.cluster.check_store(p) for p in state.cluster.stores), return_exceptions=True)
    tasks.append(asyncio.create_task(app[dashboard.DASHBOARD].loop(state), name="dashboard"))
    if GUARD_MIRROR in app:
        tasks.append(asyncio.create_task(app[GUARD_MIRROR].loop(), name="guard-metrics"))
    yield
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await state.cluster.session.close()
    await state.index.close()


GUARD_MIRROR = web.AppKey("guard_mirror", GuardMirror)


def make_app(settings: RouterSettings) -> web.Application:
    app = web.Application(middlewares=[guard_middleware, errors_middleware], client_max_size=settings.serving.max_body_bytes)
    guard = http_server.install(app, settings.serving.conn_limits())
    app[SETTINGS] = settings
    app[ROUTER] = RouterState(settings)
    if multiprocess_dir():  # one of --workers N: its guard's counts join the other workers' (router/metrics.py)
        app[GUARD_MIRROR] = GuardMirror(guard, "kvemu_router_")
    else:
        app[ROUTER].metrics.registry.register(http_server.GuardCollector(guard, "kvemu_router_"))
    app[BODY_LIMIT] = settings.serving.max_body_bytes
    app[dashboard.DASHBOARD] = dashboard.Dashboard(settings.dashboard_interval_s)
    app[OFFLOAD] = Offloader(settings.serving.offload())
    app.cleanup_ctx.append(offload_ctx)
    app.cleanup_ctx.append(background_ctx)
    views.add_routes(app)
    dashboard.add_routes(app)
    return app
