"""The replica process: one emulated GPU (or ``--data-parallel-size`` ranks of them, replica/dp.py) behind aiohttp
(``make_app(settings)``)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from replica import compat_views, pd_views, sglang_pd, views
from replica.runtime import RUNTIME, SETTINGS, ReplicaRuntime
from replica.settings import ReplicaSettings
from shared import http_server
from shared.http_server import guard_middleware
from shared.httpkit import BODY_LIMIT, REJECTIONS, errors_middleware, timing_middleware
from shared.offload import OFFLOAD, Offloader, offload_ctx


# ---- lifecycle ----------------------------------------------------------------------
async def engine_ctx(app: web.Application):
    state = app[RUNTIME]
    task = asyncio.create_task(state.engine.run(), name="engine")
    yield
    await state.engine.drain(timeout=30.0)
    await _stop(task)


async def index_ctx(app: web.Application):
    settings = app[SETTINGS]
    if settings.index is None:
        yield
        return
    from replica.shipper import RedisShipper

    shipper = RedisShipper(app[RUNTIME], settings.index, settings.cluster)
    app[RUNTIME].shipper = shipper
    task = asyncio.create_task(shipper.run(), name="index-shipper")
    yield
    shipper.stop()
    await shipper.flush(timeout=5.0)
    await _stop(task)
    await shipper.close()


async def kv_events_ctx(app: web.Application):
    """vLLM's KV-event publisher (--kv-events-config): its thread sends what is queued, then closes."""
    yield
    for publisher in app[RUNTIME].vllm_events:  # one a data-parallel rank
        await asyncio.to_thread(publisher.shutdown)


async def pd_ctx(app: web.Application):
    """P/D: one client session for every pull this replica makes (replica/pd.py); at shutdown every held
    prefill is released, nothing stays pinned."""
    import aiohttp

    pd = app[RUNTIME].pd
    pd.session = aiohttp.ClientSession()
    yield
    pd.release_all()
    await pd.session.close()


async def shared_store_ctx(app: web.Application):
    """The shared KV store's client (replica/kvstore/client.py): its feed into the mirror, writes and reads out."""
    client = app[RUNTIME].store_client
    if client is None:
        yield
        return
    task = asyncio.create_task(client.run(), name="shared-store")
    yield
    await _stop(task)


async def _stop(task: asyncio.Task, timeout: float = 5.0) -> None:
    """Cancel a background task and wait for it, but never forever."""
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        pass


def make_app(settings: ReplicaSettings) -> web.Application:
    app = web.Application(middlewares=[guard_middleware, timing_middleware, errors_middleware],
                          client_max_size=settings.serving.max_body_bytes)
    guard = http_server.install(app, settings.serving.conn_limits())
    app[SETTINGS] = settings
    app[RUNTIME] = ReplicaRuntime(settings)
    app[RUNTIME].registry.register(http_server.GuardCollector(guard, "kvemu_"))
    app[BODY_LIMIT] = settings.serving.max_body_bytes
    app[REJECTIONS] = app[RUNTIME].rejected
    app[OFFLOAD] = Offloader(settings.serving.offload())
    app.cleanup_ctx.append(offload_ctx)
    app.cleanup_ctx.append(engine_ctx)
    app.cleanup_ctx.append(index_ctx)
    app.cleanup_ctx.append(kv_events_ctx)
    app.cleanup_ctx.append(pd_ctx)
    app.cleanup_ctx.append(shared_store_ctx)
    views.add_routes(app)
    app.router.add_post("/kv/pull", pd_views.kv_pull)  # P/D: a decode instance reads a held prefill's KV
    app.router.add_post("/kv/release", pd_views.kv_release)  # P/D: the router ends a hold nobody will pull
    sglang_pd.install(app)  # P/D on SGLang's wire: /kv/bootstrap (replica/sglang_pd.py)
    compat_views.add_routes(app)  # SGLang's and vLLM's auxiliary endpoints (sglang-router's worker API)
    return app
