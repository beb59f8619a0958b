"""A KV level shared by the replicas of a cluster (or of a group of them): Mooncake's store, LMCache's
remote level, SGLang's HiCache storage. Pure and synchronous, like every level.

It is the last level of every replica's hierarchy (``TierStack``), below its own host DRAM and SSD,
and one ``SharedStore`` object serves every replica of its scope: what one replica writes, every
other one reads. What differs from a replica's own level:

* **Objects, not blocks.** The store holds chunks of ``chunk_blocks`` consecutive blocks of a prompt
  (LMCache's 256-token chunks, a Mooncake trace's 512-token ids; 1: one block each), keyed by the
  hash of the chunk's last block (the chained hash names the whole prefix up to it). A block counts as
  held only inside a resident chunk, so a lookup reuses whole chunks.
* **Writes**: ``evict`` (the default) writes what a replica evicts from its last own level (blocks,
  one chunk each: evictions come a block at a time, so chunks of several blocks need ``through``);
  ``through`` writes every full chunk a replica computes, at prefill, as LMCache stores.
* **Eviction**: ``mooncake``, Mooncake's store: once a write lifts the store above its high watermark
  (90% of its capacity), it evicts 5% of its objects in approximate-LRU order (least recently
  written or read first), skipping objects under a read lease (10 s after a lookup that read them;
  one re-enters the order when its lease ends, as if read then) and those the write itself stored;
  a write that finds no room even so is refused (counted), as Mooncake's put fails when full.
  ``lru``: the least recently used unleased object goes, one at a time, until the write fits.
* **Never removed on a fetch**: a read leaves the object where it is (the other replicas want it).
* **Its links**: each replica's NIC (the level's own link in the replica's stack) and the store's
  aggregate bandwidth (``link``: one ``Link`` shared by every replica's transfers), both shared by
  the transfers in flight; a read starts with a metadata round trip to the store's master (``ttfb_s``).

Defaults (``SharedSettings``): 400 Gb/s per replica (a ConnectX-7, as a P/D link), 80 GB/s aggregate
and 0.1 ms to first byte (NVIDIA's aisimulate's cluster-shared host level, its own modelling
assumptions), chunks of one block.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from replica.core.cache.pool import Allocation, BlockPool, KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.levels import Level, LevelPool
from replica.core.tiers.link import Link
from shared.errors import InputError
from shared.validate import check_int, check_number

SHARED_EVICTIONS = ("mooncake", "lru")
SHARED_WRITES = ("evict", "through")
DEFAULT_NIC_GBPS = 400.0  # Gb/s per replica
DEFAULT_STORE_GBPS = 640.0  # Gb/s aggregate (80 GB/s)
DEFAULT_TTFB_S = 1e-4
HIGH_WATERMARK = 0.9
EVICT_FRACTION = 0.05
LEASE_S = 10.0


@dataclass(frozen=True, slots=True)
class SharedSettings:
    """The shared level: capacity in blocks, its objects, writes, eviction and links."""

    blocks: int
    chunk_blocks: int = 1
    eviction: str = "mooncake"
    write: str = "evict"
    nic_gbps: float = DEFAULT_NIC_GBPS  # each replica's link to the store, Gb/s per direction
    store_gbps: float = DEFAULT_STORE_GBPS  # the store's aggregate, Gb/s per direction
    ttfb_s: float = DEFAULT_TTFB_S
    scope: int = 0  # replicas per store: 0, one store for the whole cluster; k, one per k replicas in id order

    def __post_init__(self) -> None:
        check_int("shared_blocks", self.blocks, minimum=1)
        check_int("shared_chunk_blocks", self.chunk_blocks, minimum=1)
        check_int("shared_scope", self.scope, minimum=0)
        if self.eviction not in SHARED_EVICTIONS:
            raise InputError("shared_eviction", f"must be one of {', '.join(SHARED_EVICTIONS)}, got {self.eviction!r}")
        if self.write not in SHARED_WRITES:
            raise InputError("shared_write", f"must be one of {', '.join(SHARED_WRITES)}, got {self.write!r}")
        if self.chunk_blocks > 1 and self.write == "evict":
            raise InputError("shared_write", "chunks of several blocks are written whole, at prefill: use write"
                                             " 'through' (evictions come a block at a time)")
        if self.chunk_blocks > self.blocks:
            raise InputError("shared_blocks", f"{self.blocks} blocks hold no chunk of {self.chunk_blocks} blocks")
        check_number("shared_nic_gbps", self.nic_gbps, above=0)
        check_number("shared_store_gbps", self.store_gbps, above=0)
        check_number("shared_ttfb_s", self.ttfb_s, minimum=0)

    def groups(self, replicas: int) -> list[range]:
        """The replicas each store serves, by position in id order (the one grouping the simulator and
        ``kvemu up`` share): one store for all ``replicas`` (scope 0), or one per ``scope`` of them, the
        last group the rest."""
        per = self._group_size(replicas)
        return [range(first, min(first + per, replicas)) for first in range(0, replicas, per)]

    def group_of(self, replica: int, replicas: int) -> int:
        """The store (its index in ``groups``) that the replica at position ``replica`` uses."""
        return replica // self._group_size(replicas)

    def _group_size(self, replicas: int) -> int:
        return self.scope or max(replicas, 1)


@dataclass(slots=True)
class SharedCounters:
    writes: int = 0  # chunks written (new)
    refused: int = 0  # chunks a write found no room for
    reads: int = 0  # chunks read by a fetch
    evictions: int = 0  # chunks evicted


@dataclass(eq=False)
class SharedStore:
    """One shared store (see the module docstring); a ``LevelPool`` for every replica's ``TierStack``."""

    settings: SharedSettings
    link: Link = field(init=False)  # the aggregate bandwidth every replica's transfers share
    emit_events: bool = True
    chunks: OrderedDict[int, tuple[int, ...]] = field(default_factory=OrderedDict)  # key -> blocks, as written
    held: dict[int, int] = field(default_factory=dict)  # block hash -> its chunk's key
    leases: dict[int, float] = field(default_factory=dict)  # chunk key -> lease end
    # The chunks eviction may take, least recently used first. A chunk under a read lease leaves it (an
    # eviction never walks past leased chunks) and re-enters at the most recent end when its lease ends,
    # as if read then: ``_parked`` holds (lease end, key), stale entries skipped.
    _order: OrderedDict[int, None] = field(default_factory=OrderedDict)
    _parked: list[tuple[float, int]] = field(default_factory=list)
    events: list[KvEvent] = field(default_factory=list)
    counters: SharedCounters = field(default_factory=SharedCounters)

    def __post_init__(self) -> None:
        s = self.settings
        self.link = Link("shared_store", s.store_gbps * 1e9 / 8, latency_s=0.0)

    # ---- the LevelPool protocol ------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.settings.blocks

    @property
    def pinned(self) -> int:
        return 0  # a read lease protects from eviction but holds no room

    @property
    def used(self) -> int:
        return len(self.held)

    def absent(self, hashes: Sequence[int]) -> list[int]:
        return [h for h in hashes if h not in self.held]

    def admit(self, hashes: Sequence[int], now: float = 0.0) -> None:
        self.admit_absent(hashes, now)

    def admit_absent(self, hashes: Sequence[int], now: float = 0.0) -> list[int]:
        """A write of ``hashes`` (a prompt's blocks from depth 0 for chunks of several blocks): the full
        chunks not held are stored where room is made; returns the blocks newly written (what crosses)."""
        n = self.settings.chunk_blocks
        written: list[int] = []
        keys: set[int] = set()  # the chunks this write stored: never its own victims (their bytes crossed to stay)
        for i in range(0, len(hashes) - n + 1, n):
            chunk = tuple(hashes[i:i + n])
            key = chunk[-1]
            if key in self.chunks:
                self.touch(key)
                continue
            if any(h in self.held for h in chunk):  # cut elsewhere than a held chunk: never re-key a block
                continue
            if not self._room_for(n, now, keys):
                self.counters.refused += 1
                continue
            self.chunks[key] = chunk
            self._order[key] = None
            keys.add(key)
            for h in chunk:
                self.held[h] = key
            written.extend(chunk)
            self.counters.writes += 1
            if self.emit_events:
                self.events.append(KvEvent("stored", chunk))
        if written and self.settings.eviction == "mooncake" and self.used > HIGH_WATERMARK * self.capacity:
            self._evict(max(1, int(EVICT_FRACTION * len(self.chunks))), now, keys)
        return written

    def acquire(self, lookup: Lookup) -> Allocation:
        """A fetch of ``lookup.hashes`` (all held): their chunks are read, each under a lease."""
        until = lookup.now + LEASE_S
        keys = dict.fromkeys(self.held[h] for h in lookup.hashes if h in self.held)
        for key in keys:
            self._order.pop(key, None)
            self.leases[key] = until
            heapq.heappush(self._parked, (until, key))
        self.counters.reads += len(keys)
        return Allocation(lookup.hashes, [], [], [], lookup.session)

    def eviction_order(self) -> list[int]:
        """The chunks eviction may take, least recently used first (leased ones are not among them)."""
        return list(self._order)

    def touch(self, key: int) -> None:
        """A write of a chunk the store holds: it becomes the most recently used (a leased one stays parked)."""
        if key in self._order:
            self._order.move_to_end(key)

    def _unpark(self, now: float) -> None:
        """Chunks whose lease ended by ``now`` re-enter the eviction order, in the order their leases end."""
        parked = self._parked
        while parked and parked[0][0] <= now:
            until, key = heapq.heappop(parked)
            if self.leases.get(key) == until and key in self.chunks:  # not renewed since, still held
                del self.leases[key]
                self._order[key] = None

    def release(self, alloc: Allocation, now: float = 0.0) -> None:
        """Nothing to give back: a lease ends with time (Mooncake's), not with the read."""

    def remove(self, hashes: Sequence[int], computed: bool = True) -> None:
        """A fetched block stays in the shared store: other replicas read it too."""

    def settle(self) -> SharedStore:
        return self

    def drain_events(self) -> list[KvEvent]:
        out, self.events = self.events, []
        return out

    # ---- eviction ------------------------------------------------------------------
    def _room_for(self, blocks: int, now: float, protect: set[int]) -> bool:
        over = self.used + blocks - self.capacity
        if over > 0:
            self._evict(-(-over // self.settings.chunk_blocks), now, protect)
        return self.used + blocks <= self.capacity

    def _evict(self, chunks: int, now: float, protect: set[int]) -> None:
        """Evict up to ``chunks`` objects, least recently used first, skipping those under a lease (and the
        chunks whose key is in ``protect``)."""
        self._unpark(now)
        gone: list[int] = []
        victims: list[int] = []
        for key in self._order:  # from the least recently used; leased chunks are not here
            if len(victims) >= chunks:
                break
            if key in protect:  # this write's own: the most recent, at the end
                break
            victims.append(key)
        for key in victims:
            del self._order[key]
            blocks = self.chunks.pop(key, ())
            for h in blocks:
                del self.held[h]
            gone.extend(blocks)
            self.counters.evictions += 1
        if gone and self.emit_events:
            self.events.append(KvEvent("removed", tuple(gone)))

    def stats(self) -> dict:
        c = self.counters
        return {"blocks": self.capacity, "used_blocks": self.used, "chunks": len(self.chunks),
                "chunk_blocks": self.settings.chunk_blocks, "eviction": self.settings.eviction,
                "write": self.settings.write, "writes": c.writes, "refused_writes": c.refused, "reads": c.reads,
                "evictions": c.evictions, "bytes_moved": self.link.bytes_moved,
                "nic_gbps": self.settings.nic_gbps, "store_gbps": self.settings.store_gbps,
                # its name until this release, kept for one more: scripts read it
                "pool_gbps": self.settings.store_gbps}


@dataclass(slots=True)
class SharedLevel(Level):
    """The shared store as the last level of one replica's stack (``TierStack``): ``serving`` is the store
    every replica of its scope shares, ``link`` this replica's NIC to it. What it does otherwise than a
    replica's own level: it is read at admission over both its links (the NIC and the store's aggregate),
    never staged; written through (``write`` 'through') it takes what a finished request computed and no
    evictions; its own evictions leave the cluster; it has no compiled twin; its events and figures are
    the store's to publish (``SharedStore.stats``), not each replica's."""

    store_link: Link  # the store's aggregate link, which every replica's transfers to it cross too
    settings: SharedSettings
    shared: ClassVar[bool] = True

    @property
    def writes_through(self) -> bool:
        return self.settings.write == "through"

    @property
    def staged_link(self) -> Link | None:
        return None

    def read_links(self) -> tuple[Link, ...]:
        return (*Level.read_links(self), self.store_link)

    def write(self, now: float, nbytes: int) -> None:
        Level.write(self, now, nbytes)
        self.store_link.start(now, nbytes)

    def spill_into(self, sink: Callable[[Sequence[int]], None]) -> None:
        return None

    def through(self, hashes: Sequence[int], stored: Sequence[int]) -> Sequence[int]:
        """LMCache's write-through: what the request computed, in chunks from depth 0 (its response's
        blocks only where a chunk is one block: a longer chunk of them would be partial)."""
        return [*hashes, *stored] if self.settings.chunk_blocks == 1 else hashes

    def serve_with(self, twin: Callable[[str, BlockPool], LevelPool | None]) -> LevelPool | None:
        return None  # one store for many replicas: no twin of its own

    def drain_events(self) -> list[KvEvent]:
        return []

    def snapshot_events(self) -> list[KvEvent]:
        return []

    def report(self, out: dict) -> None:
        out[f"{self.name}_blocks"] = self.serving.capacity
