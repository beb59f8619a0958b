"""Ships the replica's KV event batches to a Redis prefix index, off the serving path.

Serving never waits: the engine appends to the bounded feed and this task drains it.
If Redis refuses or is unreachable, the popped batches are lost on purpose (counted), the
feed queues a resync (``cleared`` + ``stored`` of every resident block) and the task
backs off; the index notices the sequence gap, clears this replica and rebuilds it from
the resync once Redis is back. A heartbeat carrying the next sequence number lets the
index notice a gap even when no events flow.

A shared KV store's process ships its store's feed the same way, with ``store`` (its ``StoreScope``): the
shipper declares the id a store's (``RedisIndex.add_store``) before its first batch, so the index keeps its
blocks as the store's one set; ``state`` is anything with ``feed`` (an ``EventFeed`` in ``push`` mode) and
``settings.replica_id`` (the store's id).
"""

from __future__ import annotations

import asyncio
import logging
import time

from replica.events import EventFeed, FeedBatch
from shared.histogram import LogHistogram
from shared.index import EventBatch, IndexUnavailable, RedisIndex, StoreScope
from shared.index.base import dp_rank_key

log = logging.getLogger("kvemu.replica.shipper")


class RedisShipper:
    def __init__(self, state, url: str, cluster: str, heartbeat_s: float = 1.0, store: StoreScope | None = None) -> None:
        self.feed: EventFeed = state.feed
        self.store = store  # a shared store's feed: declared to the index before its first batch
        self._declared = store is None
        self.replica_id = state.settings.replica_id
        self.index = RedisIndex(url, cluster=cluster)
        self.url = url
        self.heartbeat_s = heartbeat_s
        self._wake = asyncio.Event()
        self.feed.listener = self._wake.set
        self.shipped_batches = 0
        self.shipped_events = 0
        self.failures = 0
        self.lost_batches = 0
        self.index_resets = 0
        self.last_error = ""
        self.apply_latency = LogHistogram()
        self._backoff = 0.0
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        last_beat = 0.0
        while not self._stopping:
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that races
                # its own timeout, which left replicas hanging on SIGTERM.
                async with asyncio.timeout(self.heartbeat_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            batches = self.feed.pop_ready()
            if not batches and time.monotonic() - last_beat >= self.heartbeat_s:
                batches = self.feed.heartbeats()
                last_beat = time.monotonic()
            if batches and not await self._ship(batches):
                await asyncio.sleep(self._backoff)

    async def _ship(self, batches: list[FeedBatch]) -> bool:
        if not self._declared and self.store is not None:
            try:
                await self.index.add_store(self.store)
            except IndexUnavailable as exc:
                self._failed(str(exc), lost=len(batches))
                return False
            self._declared = True
        for i, b in enumerate(batches):
            feed_id, seq = index_position(self.replica_id, b)
            batch = EventBatch(feed_id, self.feed.epoch, seq, b.events)  # validates the (kind, hashes) pairs
            t0 = time.perf_counter()
            try:
                result = await self.index.apply(batch)
            except IndexUnavailable as exc:
                self._failed(str(exc), lost=len(batches) - i)
                return False
            if not result.synced and not self.feed.resync_pending:
                # The index lacks some of our blocks without us having lost a batch: Redis
                # restarted empty, or it cleared us. Republish everything once.
                self.index_resets += 1
                self.feed.request_resync()
            self.apply_latency.add(time.perf_counter() - t0)
            self.shipped_batches += 1
            self.shipped_events += len(b.events)
        self._backoff = 0.0
        return True

    def _failed(self, reason: str, lost: int) -> None:
        self.failures += 1
        self.last_error = reason
        self.lost_batches += lost
        self._backoff = min(max(self._backoff * 2, 0.1), 5.0)
        log.warning("index unavailable, %d batch(es) dropped, resync queued: %s", lost, reason)
        self.feed.dropped_batches += lost  # every batch popped and not applied, not one per failure
        self.feed.request_resync()  # queued now, so it leaves as soon as Redis answers

    async def flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.feed.batches and time.monotonic() < deadline:
            if not await self._ship(self.feed.pop_ready()):
                return

    async def close(self) -> None:
        await self.index.close()

    def stats(self) -> dict:
        return {"url": self.url, "shipped_batches": self.shipped_batches, "shipped_events": self.shipped_events,
                "failures": self.failures, "lost_batches": self.lost_batches, "index_resets": self.index_resets,
                "last_error": self.last_error,
                "apply_latency_s": self.apply_latency.summary()}


def index_position(replica_id: str, batch: FeedBatch) -> tuple[str, int]:
    """Where a feed batch goes in the index: the replica's entry and the feed's number, or a data-parallel rank's
    entry (``dp_rank_key``) and the rank's own number."""
    if batch.dp_rank is None:
        return replica_id, batch.seq
    return dp_rank_key(replica_id, batch.dp_rank), batch.rank_seq
