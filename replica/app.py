"""The replica process: one emulated GPU behind aiohttp (``make_app(settings)``)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from replica import views
from replica.engine import Engine
from replica.events import EventFeed
from replica.metrics import PoolMetrics
from replica.policies import make_policy
from replica.pool import BlockPool
from replica.prom import ReplicaCollector, make_registry
from replica.reuse import ShardsTracker
from replica.scheduler import Scheduler, SchedulerSettings
from replica.settings import ReplicaSettings
from replica.httputil import SETTINGS, STATE
from shared.httpkit import BODY_LIMIT, REJECTIONS, errors_middleware, timing_middleware
from shared.errors import InputError



class ReplicaState:
    """Everything one replica process owns, built once from its settings."""

    def __init__(self, settings: ReplicaSettings) -> None:
        self.settings = settings
        self.cost = settings.cost_model()
        capacity = settings.resolved_capacity_blocks()
        bs = settings.block_size
        metrics = PoolMetrics(
            block_size=bs,
            block_cost=lambda i: self.cost.block_cost(i, bs),
            bytes_per_block=self.cost.block_bytes(bs),
            reuse_tracker=ShardsTracker(rate=settings.shards_rate, max_tracked=settings.shards_max_tracked,
                                        seed=settings.seed),
        )
        policy = make_policy(settings.policy, **dict(settings.policy_params))
        if policy.needs_future:
            raise InputError("policy", f"{settings.policy} is an offline oracle; it runs in `kvemu sim` only")
        self.pool = BlockPool(capacity, policy, block_size=bs, hit_mode=settings.hit_mode, metrics=metrics)
        self.scheduler = Scheduler(self.pool, self.cost, SchedulerSettings(
            token_budget=settings.token_budget, max_running=settings.max_running, max_waiting=settings.max_waiting))
        self.feed = EventFeed(settings.replica_id, lambda: list(self.pool.resident), settings.event_batch_max,
                              settings.feed_max_batches, mode="push" if settings.index else "poll")
        self.registry, self.ttft_hist = make_registry()
        self.engine = Engine(self.pool, self.scheduler, settings.time_scale, on_events=self.feed.publish,
                             on_first_token=self.ttft_hist.observe)
        self.registry.register(ReplicaCollector(self))
        self.started = time.time()
        self.rejected: dict[str, int] = {}
        self.shipper = None  # set when a Redis index is configured


# ---- lifecycle ----------------------------------------------------------------------
async def engine_ctx(app: web.Application):
    state = app[STATE]
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

    shipper = RedisShipper(app[STATE], settings.index, settings.cluster)
    app[STATE].shipper = shipper
    task = asyncio.create_task(shipper.run(), name="index-shipper")
    yield
    shipper.stop()
    await shipper.flush(timeout=5.0)
    await _stop(task)
    await shipper.close()


async def _stop(task: asyncio.Task, timeout: float = 5.0) -> None:
    """Cancel a background task and wait for it, but never forever."""
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        pass


def make_app(settings: ReplicaSettings) -> web.Application:
    app = web.Application(middlewares=[timing_middleware, errors_middleware], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[STATE] = ReplicaState(settings)
    app[BODY_LIMIT] = settings.max_body_bytes
    app[REJECTIONS] = app[STATE].rejected
    app.cleanup_ctx.append(engine_ctx)
    app.cleanup_ctx.append(index_ctx)
    views.add_routes(app)
    return app
