"""``kvemu store``: the process that holds a cluster's shared KV level live.

One aiohttp app holds ONE ``SharedStore`` (replica/core/tiers/shared.py, the very class one object of which
serves every simulated replica of its scope in ``kvemu sim``) and its aggregate ``Link``. Replicas talk to it
on loopback (``replica/kvstore/client.py``); each keeps a mirror of what it holds (``mirror.py``) from this
process's event feed, so a replica's synchronous core plans from local memory and never waits on the network.

Endpoints (JSON; msgpack where asked, as the replicas'; the ``/kv/*`` ones need the cluster token, as a
replica's ``/kv/events``: ``shared/auth.py``):

* ``POST /kv/write`` ``{"replica_id": str, "chunks": [[hash, ...], ...]}``: a replica's writes (blocks it
  evicted from its last own level, or a finished request's full chunks for write-through), each chunk
  ``chunk_blocks`` hashes from depth 0 of its prompt. Answers ``{"written": chunks newly stored,
  "present": chunks already held, "refused": [chunk keys the store found no room for], "used_blocks"}``;
  the blocks written cross the aggregate link.
* ``POST /kv/read`` ``{"replica_id": str, "hashes": [...]}``: a replica's fetch: read leases on the chunks
  held (Mooncake's, ``LEASE_S`` emulated seconds), the held blocks priced on the aggregate link at the store's
  emulated clock; the answer comes when that transfer ends, ``time_scale`` wall seconds per emulated one
  (as a replica paces its steps): ``{"held": blocks read, "missing": blocks the store no longer holds,
  "ready_at": emulated end of the transfer, "now": the store's emulated clock when it started}``.
* ``GET /kv/events?after=SEQ&wait=MS&limit=N`` and ``POST /kv/resync``: the store's ``stored`` / ``removed``
  events, in exactly a replica's feed format and numbering (``replica/events.py``'s ``EventFeed``):
  ``{"replica_id": store id, "epoch", "oldest_seq", "next_seq", "batches": [{"seq", "events": [[kind,
  hashes, level], ...]}]}``, level ``SHARED_LEVEL`` (3: the shared level's index in every replica's stack,
  after host 1 and SSD 2), one ``stored`` event per chunk written, ``removed`` per eviction round; a resync
  is ``["cleared", []]`` then ``stored`` of every chunk held.
* ``GET /health``, ``GET /stats`` (the store's ``stats()``, the feed's, request counts and what the store
  would lose if it died now), ``GET /metrics`` (Prometheus: occupancy, writes, refused writes, reads,
  evictions, bytes on the aggregate link).

Clock: the store's emulated clock follows its wall clock, ``1 / time_scale`` emulated seconds per wall second
(the replicas' ``--time-scale``; at 0, the largest ``now`` a replica sent). Replicas started a moment apart
have emulated clocks that differ by that moment over the time scale, so the store keeps one clock of its own
for the store's leases and its link rather than trusting each replica's.

**A kvemu service, not Redis.** Measured on loopback (one write of a 1-block chunk then one read of it, 2,000
times in a row, one client, two runs): this service (aiohttp client and server, JSON, the cluster token)
0.88 and 1.36 ms per write + read, Redis (redis-py ``SET`` + ``GET`` of one key) 0.37 and 0.08 ms. Redis is faster per
round trip, but a replica never waits on either (writes and reads are queued after each engine step and
shipped in batches; plans come from the local mirror), and Redis would give the store's *keys*, not the
store: Mooncake's watermark eviction skipping leased objects, chunk membership, the aggregate link's
processor sharing and the numbered feed of stored/removed events would be Lua scripts re-implementing
``SharedStore`` beside the one the simulator runs, which is exactly the divergence "the same in sim and live"
forbids. This process runs the simulator's class unchanged. The data itself is emulated (no K/V bytes move),
so Redis's strength, holding bytes, buys nothing here.

It is a cache: killed, it loses everything it held (its log and ``/stats`` say how much: ``at_risk``);
replicas carry on with their own levels and resync when a store answers again (a new epoch: their mirrors
start empty, as the new store does). A replica's death costs the store nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from replica.core.cache.pool import KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.shared import SharedSettings, SharedStore
from replica.core.tiers.stack import TierSettings
from replica.events import EventFeed, read_feed
from shared import http_server
from shared.auth import require_cluster_token
from shared.errors import InputError
from shared.http_server import guard_middleware
from shared.httpkit import BODY_LIMIT, errors_middleware, read_body, respond
from shared.serving import ServingSettings
from shared.validate import check_int, check_number

log = logging.getLogger("kvemu.store")

DEFAULT_STORE_ID = "shared-store"
# the shared level's index in every replica's TierStack (host 1, SSD 2, then the shared level): the level
# the store's events carry, as a replica's host and SSD events carry theirs
SHARED_LEVEL = 1 + [lv.kind for lv in TierSettings(shared=SharedSettings(1)).levels()].index("shared")
MAX_HASHES = 1 << 16  # per write or read request


@dataclass(frozen=True, slots=True)
class StoreSettings:
    shared: SharedSettings
    block_bytes: int  # bytes of one block (the model's KV per block of block_size tokens)
    block_size: int = 16
    store_id: str = DEFAULT_STORE_ID
    port: int = 8300
    time_scale: float = 1.0
    serving: ServingSettings = ServingSettings()
    event_batch_max: int = 512
    feed_max_batches: int = 4096
    index: str | None = None  # a Redis index the store's feed is shipped to too (routers reading Redis see it)
    cluster: str = "default"  # that index's key namespace

    def __post_init__(self) -> None:
        if not self.store_id or len(self.store_id) > 128:
            raise InputError("store_id", "must be 1-128 characters")
        check_int("block_bytes", self.block_bytes, minimum=1)
        check_int("block_size", self.block_size, minimum=1)
        check_number("time_scale", self.time_scale, minimum=0)
        if not 0 <= self.port <= 65535:
            raise InputError("port", f"must be 0-65535, got {self.port}")

    def describe(self) -> dict:
        """What a replica checks against its own flags before it uses this store (``client.check_store``)."""
        s = self.shared
        return {"store_id": self.store_id, "pool_id": self.store_id, "blocks": s.blocks, "chunk_blocks": s.chunk_blocks, "write": s.write,
                "eviction": s.eviction, "block_bytes": self.block_bytes, "block_size": self.block_size,
                "store_gbps": s.store_gbps, "pool_gbps": s.store_gbps, "level": SHARED_LEVEL}


@dataclass(slots=True)
class StoreCounters:
    write_requests: int = 0
    read_requests: int = 0
    present: int = 0  # chunks a write found already held
    read_blocks: int = 0
    read_missing: int = 0  # blocks a read asked for that the store no longer held (evicted since the mirror saw them)
    bad_requests: int = 0
    by_replica: dict[str, int] = field(default_factory=dict)  # write + read requests per replica


class StoreRuntime:
    """What the store process owns: the store, its feed, its clock."""

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.store = SharedStore(settings.shared, emit_events=True)
        n = settings.shared.chunk_blocks
        # a batch holds whole chunks (a mirror cuts a stored event into chunks of n)
        batch_max = max(1, settings.event_batch_max // n) * n
        self.feed = EventFeed(settings.store_id, self.snapshot, batch_max, settings.feed_max_batches, mode="poll",
                              max_hashes=max(1 << 18, 2 * settings.shared.blocks + 1024))
        self.feed.listener = self._wake
        # With a Redis index, a second feed of the same events is shipped there (replica/shipper.py), as a
        # replica's is; the polled feed above stays for the replicas' mirrors and any router that follows it.
        self.index_feed = EventFeed(settings.store_id, self.chunks_held, batch_max, settings.feed_max_batches,
                                    mode="push", max_hashes=max(1 << 18, 2 * settings.shared.blocks + 1024)) \
            if settings.index else None
        self._changed: asyncio.Future | None = None
        self.counters = StoreCounters()
        self.started = time.time()
        self._t0 = time.monotonic()
        self._given_now = 0.0

    # ---- clock ---------------------------------------------------------------------
    def now(self) -> float:
        ts = self.settings.time_scale
        if ts > 0:
            return (time.monotonic() - self._t0) / ts
        return self._given_now

    def saw(self, now: object) -> None:
        """A replica's emulated clock (the store's clock at time scale 0)."""
        if isinstance(now, (int, float)) and not isinstance(now, bool) and now > self._given_now:
            self._given_now = float(now)

    # ---- events --------------------------------------------------------------------
    def snapshot(self) -> list[KvEvent]:
        """``stored`` of every chunk held (a resync), one event per chunk, the store's pending events dropped."""
        self.store.drain_events()
        return [KvEvent("stored", chunk, SHARED_LEVEL) for chunk in self.store.chunks.values()]

    def chunks_held(self) -> list[KvEvent]:
        """``stored`` of every chunk held, the store's pending events left for ``publish`` (the Redis feed's
        resync: the polled feed's would drop them)."""
        return [KvEvent("stored", chunk, SHARED_LEVEL) for chunk in self.store.chunks.values()]

    def publish(self) -> None:
        events = [KvEvent(e.kind, e.hashes, SHARED_LEVEL) for e in self.store.drain_events()]
        if events:
            self.feed.publish(events)
            if self.index_feed is not None:
                self.index_feed.publish(events)

    def _wake(self) -> None:
        fut, self._changed = self._changed, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def changed(self, timeout: float) -> None:
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._changed)
        except TimeoutError:
            pass

    # ---- the store's operations ------------------------------------------------------
    def write(self, replica_id: str, chunks: list[list[int]]) -> dict:
        c = self.counters
        c.write_requests += 1
        c.by_replica[replica_id] = c.by_replica.get(replica_id, 0) + 1
        now, store, n = self.now(), self.store, self.settings.shared.chunk_blocks
        written, refused = 0, []
        for chunk in chunks:
            key = chunk[-1]
            if key in store.chunks:
                store.touch(key)
                c.present += 1
                continue
            new = store.admit_absent(chunk, now)
            if new:
                written += 1
                store.link.start(now, len(new) * self.settings.block_bytes)
            elif len(chunk) == n:
                refused.append(key)
        self.publish()
        return {"written": written, "present": len(chunks) - written - len(refused), "refused": refused,
                "used_blocks": store.used}

    def read(self, replica_id: str, hashes: list[int]) -> tuple[dict, float]:
        """Leases and the aggregate link's transfer; (answer, wall seconds to wait before giving it)."""
        c = self.counters
        c.read_requests += 1
        c.by_replica[replica_id] = c.by_replica.get(replica_id, 0) + 1
        now, store = self.now(), self.store
        held = [h for h in hashes if h in store.held]
        c.read_blocks += len(held)
        c.read_missing += len(hashes) - len(held)
        ready = now
        if held:
            store.acquire(Lookup(held, now=now))
            ready = store.link.reserve(now, len(held) * self.settings.block_bytes)
        return ({"held": len(held), "missing": len(hashes) - len(held), "ready_at": ready, "now": now},
                max(ready - now, 0.0) * self.settings.time_scale)

    def at_risk(self) -> dict:
        """What the store loses if it dies now: everything it holds (it is a cache)."""
        s = self.store
        return {"chunks": len(s.chunks), "blocks": s.used, "bytes": s.used * self.settings.block_bytes}

    def stats(self) -> dict:
        c = self.counters
        now = self.now()
        return {"store_id": self.settings.store_id, "pool_id": self.settings.store_id, "epoch": self.feed.epoch, **self.store.stats(),
                "block_bytes": self.settings.block_bytes, "used_bytes": self.store.used * self.settings.block_bytes,
                "link": {"bytes_moved": self.store.link.bytes_moved, "in_flight": self.store.link.in_flight,
                         "utilization": self.store.link.utilization(now) if now > 0 else 0.0},
                "requests": {"write": c.write_requests, "read": c.read_requests, "bad": c.bad_requests,
                             "by_replica": dict(c.by_replica)},
                "present_writes": c.present, "read_blocks": c.read_blocks, "read_missing_blocks": c.read_missing,
                "at_risk": self.at_risk(), "events": self.feed.stats(), "time_scale": self.settings.time_scale,
                "emulated_now_s": now, "uptime_s": time.time() - self.started}


class StoreCollector:
    """The store's Prometheus series, read from the store at scrape time."""

    def __init__(self, rt: StoreRuntime) -> None:
        self.rt = rt

    def describe(self):
        return []

    def collect(self):
        rt, pid = self.rt, self.rt.settings.store_id
        s, c = rt.store, rt.store.counters

        series = (
            (GaugeMetricFamily, "capacity_blocks", "Blocks the shared store holds at most.", s.capacity),
            (GaugeMetricFamily, "used_blocks", "Blocks the shared store holds.", s.used),
            (GaugeMetricFamily, "occupancy", "Fraction of the shared store in use (0-1).", s.used / s.capacity),
            (GaugeMetricFamily, "chunks", "Objects (chunks) the shared store holds.", len(s.chunks)),
            (CounterMetricFamily, "writes", "Chunks written into the shared store.", c.writes),
            (CounterMetricFamily, "refused_writes", "Chunks a write found no room for.", c.refused),
            (CounterMetricFamily, "reads", "Chunks read from the shared store (leases taken).", c.reads),
            (CounterMetricFamily, "read_missing_blocks", "Blocks a read asked for that the store no longer held.",
             rt.counters.read_missing),
            (CounterMetricFamily, "evictions", "Chunks evicted from the shared store.", c.evictions),
            (CounterMetricFamily, "bytes", "Bytes across the store's aggregate link (writes and reads).",
             s.link.bytes_moved),
            (CounterMetricFamily, "requests", "Write and read requests answered.",
             rt.counters.write_requests + rt.counters.read_requests),
        )
        # kvemu_store_*{store}, and under their names until this release (kvemu_pool_*{pool}) for one more
        for prefix, label in (("kvemu_store_", "store"), ("kvemu_pool_", "pool")):
            for kind, name, doc, value in series:
                m = kind(prefix + name, doc, labels=[label])
                m.add_metric([pid], value)
                yield m


STORE = web.AppKey("store", StoreRuntime)
REGISTRY = web.AppKey("store_registry", CollectorRegistry)


def _rt(request: web.Request) -> StoreRuntime:
    return request.app[STORE]


def _guard(request: web.Request) -> None:
    require_cluster_token(request, _rt(request).settings.serving.cluster_token)


def _hashes(body: dict, name: str, rt: StoreRuntime) -> list[int]:
    value = body.get(name)
    if not isinstance(value, list) or len(value) > MAX_HASHES:
        rt.counters.bad_requests += 1
        raise InputError(name, f"expected a list of at most {MAX_HASHES} block hashes")
    if not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 1 << 64 for h in value):
        rt.counters.bad_requests += 1
        raise InputError(name, "expected unsigned 64-bit integers")
    return value


def _replica(body: dict) -> str:
    rid = body.get("replica_id", "?")
    return rid[:128] if isinstance(rid, str) else "?"


async def write(request: web.Request) -> web.Response:
    _guard(request)
    rt = _rt(request)
    body = await read_body(request)
    chunks = body.get("chunks")
    n = rt.settings.shared.chunk_blocks
    if not isinstance(chunks, list) or len(chunks) * n > MAX_HASHES:
        rt.counters.bad_requests += 1
        raise InputError("chunks", f"expected a list of chunks of {n} block hashes")
    parsed = [_hashes({"chunk": c}, "chunk", rt) for c in chunks]
    if any(len(c) != n for c in parsed):
        rt.counters.bad_requests += 1
        raise InputError("chunks", f"every chunk is {n} block hashes (this store's --shared-chunk-tokens)")
    rt.saw(body.get("now"))
    return respond(request, rt.write(_replica(body), parsed))


async def read(request: web.Request) -> web.Response:
    _guard(request)
    rt = _rt(request)
    body = await read_body(request)
    hashes = _hashes(body, "hashes", rt)
    rt.saw(body.get("now"))
    answer, wait_s = rt.read(_replica(body), hashes)
    if wait_s > 0:
        await asyncio.sleep(min(wait_s, 30.0))
    return respond(request, answer)


async def kv_events(request: web.Request) -> web.Response:
    """The store's events, in a replica's feed format (see the module docstring)."""
    _guard(request)
    rt = _rt(request)
    return respond(request, await read_feed(request, rt.feed, rt.settings.store_id, rt.changed))


async def kv_resync(request: web.Request) -> web.Response:
    _guard(request)
    rt = _rt(request)
    rt.feed.request_resync()
    return web.json_response({"epoch": rt.feed.epoch, "next_seq": rt.feed.next_seq, "used_blocks": rt.store.used})


async def health(request: web.Request) -> web.Response:
    rt = _rt(request)
    return web.json_response({"status": "ok", "epoch": rt.feed.epoch, "used_blocks": rt.store.used,
                              **rt.settings.describe()})


async def stats(request: web.Request) -> web.Response:
    return respond(request, _rt(request).stats())


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[REGISTRY]), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def lifecycle_ctx(app: web.Application):
    rt = app[STORE]
    s = rt.settings
    log.warning("shared KV store %s: %d blocks (%d per chunk, %s, write %s), epoch %s", s.store_id, s.shared.blocks,
                s.shared.chunk_blocks, s.shared.eviction, s.shared.write, rt.feed.epoch)
    yield
    lost = rt.at_risk()
    log.warning("shared KV store %s stopping: loses everything it held (%d chunks, %d blocks, %d bytes); replicas"
                " carry on with their own levels", s.store_id, lost["chunks"], lost["blocks"], lost["bytes"])


async def index_ctx(app: web.Application):
    """With a Redis index: the store's events shipped there as a store's (declared before the first batch)."""
    rt = app[STORE]
    url = rt.settings.index
    if rt.index_feed is None or url is None:
        yield
        return
    from types import SimpleNamespace

    from replica.shipper import RedisShipper
    from shared.index.base import StoreScope

    s = rt.settings
    state = SimpleNamespace(feed=rt.index_feed, settings=SimpleNamespace(replica_id=s.store_id))
    shipper = RedisShipper(state, url, s.cluster, store=StoreScope(s.store_id, SHARED_LEVEL))
    task = asyncio.create_task(shipper.run(), name="store-index-shipper")
    yield
    shipper.stop()
    await shipper.flush(timeout=5.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await shipper.close()


def make_app(settings: StoreSettings) -> web.Application:
    app = web.Application(middlewares=[guard_middleware, errors_middleware],
                          client_max_size=settings.serving.max_body_bytes)
    http_server.install(app, settings.serving.conn_limits())
    rt = StoreRuntime(settings)
    app[STORE] = rt
    registry = CollectorRegistry()
    registry.register(StoreCollector(rt))
    app[REGISTRY] = registry
    app[BODY_LIMIT] = settings.serving.max_body_bytes
    app.cleanup_ctx.append(lifecycle_ctx)
    app.cleanup_ctx.append(index_ctx)
    app.router.add_post("/kv/write", write)
    app.router.add_post("/kv/read", read)
    app.router.add_get("/kv/events", kv_events)
    app.router.add_post("/kv/resync", kv_resync)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_get("/metrics", metrics)
    return app
