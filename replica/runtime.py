"""What one replica process owns (``ReplicaRuntime``) and the typed keys its app stores it under."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from aiohttp import web

from replica.core.build import build_core
from replica.dp import DpEngine
from replica.engine import Engine
from replica.events import EventFeed
from replica.kvstore.client import StoreClient
from replica.kvstore.mirror import MirrorStore
from replica.pd import PdRuntime
from replica.prom import LABELS, ReplicaCollector, ReplicaMetrics
from replica.settings import ReplicaSettings
from replica.shipper import RedisShipper
from replica.vllm_events import EventTranslator, ZmqEventPublisher


class ReplicaRuntime:
    """Everything one replica process owns, built once from its settings."""

    def __init__(self, settings: ReplicaSettings) -> None:
        self.settings = settings
        self.cost = settings.cost_model()
        # the shared KV level, live: a mirror of the store process's store (replica/kvstore/)
        shared = settings.knobs.tiers.shared
        self.shared_store = MirrorStore(shared, emit_events=False) if shared is not None else None
        # --data-parallel-size: one core a rank, each its own scheduler and pool (replica/dp.py); rank 0's is ``core``
        self.cores = [build_core(settings.core_settings(), self.cost, shared=self.shared_store)
                      for _ in range(settings.dp.size)]
        self.core = self.cores[0]
        self.pool = self.core.pool
        self.scheduler = self.core.scheduler
        self.backend = None
        if settings.backend == "torch":  # real kernels time the steps (replica/backends/torch_backend.py)
            from replica.backends.torch_backend import TorchBackend

            self.backend = TorchBackend(self.cost.model, self.pool, settings.device, settings.layers,
                                        settings.knobs.seed, self.core.tiers).attach(self.scheduler)
        held = sum(core.capacity_with_tiers for core in self.cores)
        self.feed = EventFeed(settings.replica_id, self.core.snapshot_events, settings.event_batch_max,
                              settings.feed_max_batches, mode="push" if settings.index else "poll",
                              # a resync (every block held, in every tier) must always fit, or it would drop itself
                              max_hashes=max(settings.feed_max_hashes, 2 * held + 1024),
                              rank_snapshots=[core.snapshot_events for core in self.cores] if self.dp_ranks else (),
                              # several KV cache groups: the index follows one (replica/core/cache/group_events.py)
                              index_group=self.core.group_keys.index_group if self.core.group_keys is not None else None)
        self.prom = ReplicaMetrics(settings.model, settings.replica_id)
        self.registry = self.prom.registry
        self.ttft_recent = RecentTtft()
        self._feed_changed: asyncio.Future | None = None  # what long polls of the feed wait on
        if not settings.index:  # poll mode: the feed's listener wakes them (push mode: the Redis shipper)
            self.feed.listener = self._wake_feed_readers
        # vLLM's publisher of each rank (--kv-events-config; its port offset by the rank, as vLLM's), or none
        self.vllm_events = [self._vllm_publisher(settings, rank) for rank in range(settings.dp.size)] \
            if settings.kv_events is not None else []
        self.engine: Engine | DpEngine
        if self.dp_ranks:
            self.engine = DpEngine(self.cores, self.cost, settings.dp, settings.time_scale, self._publish_rank,
                                   self._first_token, self.prom.finished)
            first = self.engine.engines[0]
        else:
            first = self.engine = Engine(self.core, settings.time_scale, on_events=self._publish,
                                         on_first_token=self._first_token, on_finished=self.prom.finished)
        # disaggregated prefill / decode: this instance's NIC, held prefills, remote decodes (replica/pd.py; one
        # rank: a replica of several is refused a P/D role)
        self.pd = PdRuntime(settings, first, self.cost.kv_bytes_per_token, self.registry, LABELS)
        self.store_client: StoreClient | None = None
        if self.shared_store is not None and settings.shared_store_url is not None:
            self.store_client = StoreClient(settings.shared_store_url, self.shared_store, settings.replica_id,
                                          settings.serving.cluster_token, self.engine.now)
        self.registry.register(ReplicaCollector(self))
        self.started = time.time()
        self.rejected: dict[str, int] = {}
        self.shipper: RedisShipper | None = None  # set when a Redis index is configured
        self.policy_switches: deque[dict] = deque(maxlen=50)  # live switches by /admin/policy, newest last

    def _wake_feed_readers(self) -> None:
        fut, self._feed_changed = self._feed_changed, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def feed_changed(self, timeout: float) -> None:
        """Until the feed gets a batch, or ``timeout`` seconds (a router's long poll)."""
        if self._feed_changed is None:
            self._feed_changed = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._feed_changed)
        except TimeoutError:
            pass

    @property
    def dp_ranks(self) -> bool:
        """Several data-parallel ranks (replica/dp.py)."""
        return len(self.cores) > 1

    @property
    def pools(self) -> list:
        """Each rank's KV pool (one in a replica of one rank)."""
        return [core.pool for core in self.cores]

    @property
    def running(self) -> int:
        return sum(core.scheduler.num_running for core in self.cores)

    @property
    def waiting(self) -> int:
        return sum(core.scheduler.num_waiting for core in self.cores)

    def kv_usage(self) -> float:
        """The ranks' mean KV use (the router weighs the replica by it, as the simulator does an instance)."""
        return sum(pool.usage() for pool in self.pools) / len(self.cores)

    def _vllm_publisher(self, settings: ReplicaSettings, rank: int) -> ZmqEventPublisher:
        """vLLM's KV-event publisher of data-parallel rank ``rank`` (--kv-events-config): vLLM's endpoints with
        their ports offset by the rank, its batches stamped with it. Its sockets open here: a port in use is a
        one-line error at start."""
        config = settings.kv_events
        assert config is not None
        core = self.cores[rank]
        tiers = core.tiers
        translator = EventTranslator(settings.block_size, config.event_encoding, config.hash_algo, config.hash_seed,
                                     tiers.names if tiers is not None else (),
                                     pending_max=max(1 << 17, 4 * core.capacity_with_tiers),
                                     groups=self.cost.model.kv_groups if core.group_keys is not None else None)
        return ZmqEventPublisher(config, translator, data_parallel_rank=rank)

    def _publish(self, events) -> None:
        self.feed.publish(events)
        for publisher in self.vllm_events:
            publisher.publish(events)

    def _publish_rank(self, rank: int, events) -> None:
        self.feed.publish(events, rank)
        if self.vllm_events:
            self.vllm_events[rank].publish(events)

    def register_blocks(self, hashes, response_hashes, tokens, rank: int = 0) -> None:
        """A submitted request's blocks and the tokens they cover, for vLLM's events of its rank (a no-op
        without them)."""
        if self.vllm_events:
            self.vllm_events[rank].translator.register([*hashes, *(response_hashes or ())], tokens)
        keys = self.cores[rank].group_keys
        if keys is not None:  # several KV cache groups: each block's key in each (replica/core/cache/group_events.py)
            keys.teach(hashes, response_hashes)

    def _first_token(self, ttft_s: float) -> None:
        self.prom.first_token(ttft_s)
        self.ttft_recent.add(ttft_s)


class RecentTtft:
    """Emulated TTFTs of the last ``window_s`` seconds of wall time (at most ``maxlen`` of them),
    for the percentiles the dashboard draws over time (the Prometheus histogram is cumulative)."""

    def __init__(self, window_s: float = 30.0, maxlen: int = 4096) -> None:
        self.window_s = window_s
        self._items: deque[tuple[float, float]] = deque(maxlen=maxlen)

    def add(self, ttft_s: float, now: float | None = None) -> None:
        self._items.append((time.monotonic() if now is None else now, ttft_s))

    def summary(self, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        while self._items and self._items[0][0] < now - self.window_s:
            self._items.popleft()
        values = sorted(v for _, v in self._items)
        out: dict = {"window_s": self.window_s, "requests": len(values)}
        for name, q in (("p50_s", 0.5), ("p90_s", 0.9), ("p99_s", 0.99)):
            out[name] = values[min(int(q * len(values)), len(values) - 1)] if values else None
        return out


SETTINGS = web.AppKey("settings", ReplicaSettings)
RUNTIME = web.AppKey("runtime", ReplicaRuntime)
