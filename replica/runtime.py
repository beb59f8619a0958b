"""What one replica process owns (``ReplicaRuntime``) and the typed keys its app stores it under."""

from __future__ import annotations

import time

from aiohttp import web

from replica.core.build import build_core
from replica.engine import Engine
from replica.events import EventFeed
from replica.prom import ReplicaCollector, make_registry
from replica.settings import ReplicaSettings


class ReplicaRuntime:
    """Everything one replica process owns, built once from its settings."""

    def __init__(self, settings: ReplicaSettings) -> None:
        self.settings = settings
        self.cost = settings.cost_model()
        self.core = build_core(settings.core_settings(), self.cost)
        self.pool = self.core.pool
        self.scheduler = self.core.scheduler
        self.feed = EventFeed(settings.replica_id, lambda: list(self.pool.resident), settings.event_batch_max,
                              settings.feed_max_batches, mode="push" if settings.index else "poll",
                              # a resync (every resident block) must always fit, or it would drop itself
                              max_hashes=max(settings.feed_max_hashes, 2 * self.pool.capacity + 1024))
        self.registry, self.ttft_hist = make_registry()
        self.engine = Engine(self.pool, self.scheduler, settings.time_scale, on_events=self.feed.publish,
                             on_first_token=self.ttft_hist.observe)
        self.registry.register(ReplicaCollector(self))
        self.started = time.time()
        self.rejected: dict[str, int] = {}
        self.shipper = None  # set when a Redis index is configured


SETTINGS = web.AppKey("settings", ReplicaSettings)
RUNTIME = web.AppKey("runtime", ReplicaRuntime)
