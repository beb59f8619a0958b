"""KV events leave the replica in numbered batches; serving never waits on them.

The pool appends ``stored`` / ``removed`` / ``cleared`` events; after each step the
engine hands them here. They are cut into batches (at most ``batch_max`` hashes) with
sequence numbers under this process's epoch, and kept in a bounded feed:

* embedded index: the router polls ``GET /kv/events?after=SEQ`` and applies the batches;
* Redis index: a background task ships batches to Redis (``shipper``).

When the feed overflows, or Redis refuses a batch, the lost batch is counted and the
next batch is a resync: ``cleared`` followed by ``stored`` for every resident block (per
memory level: host and SSD blocks as level-tagged ``stored`` events), so an index that noticed
the sequence gap rebuilds this replica's entries exactly.

Data-parallel ranks (``--data-parallel-size N``, replica/dp.py): each batch holds one rank's events and says
which (``dp_rank``), with the rank's own sequence number (``rank_seq``) beside the feed's: the index keeps each
rank as its own entry (``shared.index.base.dp_rank_key``), numbered without gaps, while a reader follows the one
feed by ``seq``. A resync republishes every rank.

KV cache groups (a model with sliding-window layers, replica/core/cache/group_events.py): the core's events
come per group; the feed carries the index group's alone (``index_group``, the first full-attention group),
as group 0's, so the index holds a block once whatever groups hold it. vLLM's wire carries every group's
(replica/vllm_events.py).
"""

from __future__ import annotations

import bisect
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from replica.core.cache.group_events import for_index
from replica.core.cache.pool import KvEvent
from shared.httpkit import query_int
from shared.index.base import event_to_wire

Snapshot = Callable[[], list[KvEvent]]


@dataclass(slots=True)
class FeedBatch:
    seq: int  # sequence number of the batch's first event; events are numbered consecutively
    events: list[KvEvent]
    dp_rank: int | None = None  # a data-parallel replica's batch: the rank whose events these are
    rank_seq: int = 0  # ... and that rank's own number of its first event (consecutive per rank)

    def to_wire(self) -> dict:
        out: dict = {"seq": self.seq, "events": [event_to_wire(e) for e in self.events]}
        if self.dp_rank is not None:
            out["dp_rank"], out["rank_seq"] = self.dp_rank, self.rank_seq
        return out


class EventFeed:
    """Numbered batches under this process's epoch, in a bounded deque.

    Two consumers, two overflow rules. ``poll`` (the embedded index): batches stay after being
    read, the oldest simply fall off, and a poller whose cursor is older than ``oldest_seq``
    sees the gap itself and asks for ``/kv/resync``. ``push`` (the Redis shipper pops them):
    an overflow loses unshipped batches, so the next publish starts with a resync.
    """

    def __init__(self, replica_id: str, snapshot: Snapshot, batch_max: int = 512,
                 max_batches: int = 4096, mode: str = "poll", max_hashes: int = 1 << 18,
                 rank_snapshots: Sequence[Snapshot] = (), index_group: int | None = None) -> None:
        self.replica_id = replica_id
        self.index_group = index_group  # a model of several KV cache groups: the one group the feed carries
        self.epoch = uuid.uuid4().hex[:16]
        self._snapshot = snapshot  # ``stored`` events of every block held (ReplicaCore.snapshot_events)
        # a data-parallel replica: each rank's snapshot; its batches carry their rank and the rank's numbers
        self._rank_snapshots = list(rank_snapshots)
        self.rank_next_seq = [1] * len(self._rank_snapshots)
        self.batch_max = batch_max
        self.max_batches = max_batches
        # Memory is bounded by hashes held, not only by batches: under load one batch holds
        # hundreds of hashes, and 4096 of them grew a replica by ~70 MB (issue 17).
        self.max_hashes = max_hashes
        self.held_hashes = 0
        self.mode = mode
        self.batches: deque[FeedBatch] = deque()
        self.next_seq = 1
        self.published_events = 0
        self.dropped_batches = 0  # unshipped batches lost (push mode)
        self.expired_batches = 0  # read batches aged out of the ring (poll mode)
        self.resyncs = 0
        self.resync_requests = 0  # asks through /kv/resync (coalesced into ``resyncs``)
        self.reads = 0  # GET /kv/events answered (a router's poll, long or not)
        self._needs_resync = False
        self._resync_end = 0  # next_seq just after the last resync: equal to next_seq = it is still the newest
        self.listener: Callable[[], None] | None = None  # woken after each publish (the Redis shipper)

    def publish(self, events: list[KvEvent], rank: int | None = None) -> None:
        """One step's events (of data-parallel ``rank``, in a replica of several ranks)."""
        if self._needs_resync:
            self._needs_resync = False
            self.resyncs += 1
            # The events of this call are already reflected in the resident set.
            for part, snapshot in self._resync_parts():
                self._append([KvEvent("cleared", ()), *snapshot()], part)
            self._resync_end = self.next_seq
        else:
            self._append(events, rank)
        overflow = 0
        while len(self.batches) > 1 and (len(self.batches) > self.max_batches or self.held_hashes > self.max_hashes):
            self.held_hashes -= _hashes_in(self.batches.popleft().events)
            overflow += 1
        if overflow > 0:
            if self.mode == "push":
                self.dropped_batches += overflow
                self._needs_resync = True  # on the next publish: never recursively from here
            else:
                self.expired_batches += overflow
        if self.listener is not None and self.batches:
            self.listener()

    def _resync_parts(self) -> list[tuple[int | None, Snapshot]]:
        if not self._rank_snapshots:
            return [(None, self._snapshot)]
        return list(enumerate(self._rank_snapshots))

    def _append(self, events: list[KvEvent], rank: int | None) -> None:
        if self._rank_snapshots and rank is None:
            raise ValueError("a data-parallel replica's events name their rank")
        if self.index_group is not None:
            events = for_index(events, self.index_group)
        for chunk in _chunks(events, self.batch_max):
            batch = FeedBatch(self.next_seq, chunk)
            if rank is not None:
                batch.dp_rank, batch.rank_seq = rank, self.rank_next_seq[rank]
                self.rank_next_seq[rank] += len(chunk)
            self.batches.append(batch)
            self.next_seq += len(chunk)
            self.published_events += len(chunk)
            self.held_hashes += _hashes_in(chunk)

    def heartbeats(self) -> list[FeedBatch]:
        """Empty batches carrying the next numbers (the feed's, or each rank's): an index sees a gap from them."""
        if not self._rank_snapshots:
            return [FeedBatch(self.next_seq, [])]
        return [FeedBatch(self.next_seq, [], rank, n) for rank, n in enumerate(self.rank_next_seq)]

    @property
    def resync_pending(self) -> bool:
        """A resync is queued (or scheduled) but not yet taken by a consumer."""
        if self._needs_resync:
            return True
        return any(b.events and b.events[0].kind == "cleared" for b in self.batches)

    def request_resync(self) -> None:
        """A consumer lost its view (a router restarted, cleared us, or fell behind): republish,
        unless the newest batches in the ring already are a resync (many asks in a row cost one)."""
        self.resync_requests += 1
        if self.mode == "poll" and self._resync_end == self.next_seq:  # push: it may have been lost
            return
        self._needs_resync = True
        self.publish([])

    def since(self, after: int, limit: int = 256) -> list[FeedBatch]:
        """Batches whose events come after sequence number ``after`` (oldest first); a binary
        search, not a scan of the ring (pollers ask every 20 ms)."""
        batches = self.batches
        first = bisect.bisect_right(batches, after, key=lambda b: b.seq + len(b.events) - 1)
        return [batches[i] for i in range(first, min(first + limit, len(batches)))]

    def pop_ready(self) -> list[FeedBatch]:
        """For a pushing shipper: take every queued batch."""
        out = list(self.batches)
        self.batches.clear()
        self.held_hashes = 0
        return out

    @property
    def oldest_seq(self) -> int:
        return self.batches[0].seq if self.batches else self.next_seq

    def stats(self) -> dict:
        return {"epoch": self.epoch, "mode": self.mode, "next_seq": self.next_seq,
                "queued_batches": len(self.batches), "held_hashes": self.held_hashes,
                "published_events": self.published_events,
                "dropped_batches": self.dropped_batches, "expired_batches": self.expired_batches,
                "resyncs": self.resyncs, "resync_requests": self.resync_requests, "reads": self.reads}


def _hashes_in(events: list[KvEvent]) -> int:
    return sum(len(e.hashes) for e in events) + len(events)  # an empty ``cleared`` still costs


def _chunks(events: list[KvEvent], batch_max: int) -> Iterable[list[KvEvent]]:
    """Split into batches holding at most ``batch_max`` hashes (big events are split too)."""
    batch: list[KvEvent] = []
    size = 0
    for ev in events:
        hashes = ev.hashes
        if len(hashes) > batch_max:
            for i in range(0, len(hashes), batch_max):
                if batch:
                    yield batch
                    batch, size = [], 0
                yield [KvEvent(ev.kind, hashes[i : i + batch_max], ev.level)]
            continue
        if size + len(hashes) > batch_max and batch:
            yield batch
            batch, size = [], 0
        batch.append(ev)
        size += max(len(hashes), 1)
    if batch:
        yield batch


async def read_feed(request, feed: EventFeed, feed_id: str, changed: Callable[[float], Awaitable[None]]) -> dict:
    """One read of a feed over HTTP (``GET /kv/events``, a replica's or a shared store's): the batches after
    ``after`` (at most ``limit``); with ``wait=MS`` a long poll that answers when a batch comes or after MS
    (``changed``), so a follower asks about once a second while nothing happens instead of every 20 ms."""
    after = query_int(request, "after", 0, 0, 2**62)
    limit = query_int(request, "limit", 256, 1, 4096)
    wait_ms = query_int(request, "wait", 0, 0, 10_000)
    feed.reads += 1
    batches = feed.since(after, limit)
    if not batches and wait_ms and feed.next_seq <= after + 1:
        await changed(wait_ms / 1000)
        batches = feed.since(after, limit)
    return {"replica_id": feed_id, "epoch": feed.epoch, "oldest_seq": feed.oldest_seq, "next_seq": feed.next_seq,
            "batches": [b.to_wire() for b in batches]}
