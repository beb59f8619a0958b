"""A replica's async side of the shared KV store (``--shared-store-url``): follows the store's event feed into
the ``MirrorStore`` and ships the writes and reads the engine's steps queued there.

Three background tasks (``replica/app.py``'s ``shared_store_ctx``), one ``aiohttp`` session:

* **follow**: ``GET /kv/events?after=SEQ&wait=1000`` on the store, as a router follows a replica: a new
  epoch (the store restarted: an empty store) or a gap clears the mirror and rebuilds it (a resync);
* **writes** and **reads**: woken by the mirror when a step queued something, one ``POST /kv/write`` /
  ``POST /kv/read`` per wake-up with everything queued (reads may take as long as their transfer on the
  store's aggregate link, so they do not hold up writes).

Faults: a store that does not answer, answers an error status, or answers garbage (not the JSON expected) is
*unreachable*: the mirror is cleared and takes no writes (nothing is planned from the store), what was queued
is dropped and counted, the replica serves from its own levels, ``/health`` says ``"shared_store":
"unreachable"`` and its log says so once. The follower keeps trying (0.2 s, doubling to 2 s); when the store
answers again the mirror resyncs from its feed. Nothing in HBM depends on the store: a fetch planned from the
mirror was priced and counted at plan time (the data is emulated), so a read the store can no longer serve
(evicted, or the store died) is only counted (``read_missing_blocks``, ``read_failures``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass

import aiohttp

from replica.core.tiers.shared import SharedSettings
from replica.kvstore.mirror import MirrorStore
from shared.auth import bearer_header
from shared.errors import KvemuError

log = logging.getLogger("kvemu.replica.shared_store")

POLL_WAIT_MS = 1000
BACKOFF_S = (0.2, 2.0)
TIMEOUT_S = 10.0


class Garbage(Exception):
    """The store answered something that is not what the protocol says."""


@dataclass(slots=True)
class ClientCounters:
    failures: int = 0  # requests to the store that failed (down, error status or garbage)
    garbage: int = 0  # ... of which answers that were not what the protocol says
    outages: int = 0  # times the store became unreachable
    resyncs: int = 0  # mirror rebuilt (new epoch or a gap)
    polls: int = 0
    write_requests: int = 0
    written_chunks: int = 0
    refused_chunks: int = 0
    dropped_write_chunks: int = 0  # queued while or when the store was unreachable
    read_requests: int = 0
    read_blocks: int = 0
    read_missing_blocks: int = 0  # read from the mirror, no longer in the store
    read_failures: int = 0  # blocks whose read failed (the store went away)
    read_wait_s: float = 0.0  # wall seconds reads took, in all


def _int(body: dict, name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Garbage(f"{name} is not an integer")
    return value


class StoreClient:
    def __init__(self, url: str, mirror: MirrorStore, replica_id: str, token: str | None,
                 clock: Callable[[], float]) -> None:
        self.url = url.rstrip("/")
        self.mirror = mirror
        self.replica_id = replica_id
        self.headers = bearer_header(token)
        self.clock = clock
        self.state = "connecting"  # ok | unreachable
        self.epoch = ""
        self.cursor = 0
        self.last_error = ""
        self.counters = ClientCounters()
        self.session: aiohttp.ClientSession | None = None
        self._writes = asyncio.Event()
        self._reads = asyncio.Event()
        mirror.notify = self._wake

    def _wake(self) -> None:
        if self.mirror.writes:
            self._writes.set()
        if self.mirror.reads:
            self._reads.set()

    # ---- state ---------------------------------------------------------------------
    def down(self, reason: str, garbage: bool = False) -> None:
        """A failed request: the store is unreachable (or talks nonsense) until the feed answers again."""
        c = self.counters
        c.failures += 1
        c.garbage += garbage
        self.last_error = reason
        if self.state != "unreachable":
            c.outages += 1
            log.warning("shared KV store %s unreachable (%s): serving from this replica's own levels, %d mirrored"
                        " blocks forgotten; retrying", self.url, reason, self.mirror.used)
        self.state = "unreachable"
        self.mirror.available = False
        self.mirror.clear()
        writes, reads = self.mirror.take()
        c.dropped_write_chunks += len(writes)
        c.read_failures += len(reads)
        self.epoch, self.cursor = "", 0  # back up: a resync, whatever epoch it has

    async def _json(self, method: str, path: str, body: dict | None = None) -> dict:
        assert self.session is not None
        try:
            async with self.session.request(method, self.url + path, json=body, headers=self.headers,
                                            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as resp:
                if resp.status != 200:
                    raise Garbage(f"{path} answered HTTP {resp.status}")
                try:
                    out = json.loads(await resp.read())
                except ValueError:
                    raise Garbage(f"{path} answered something that is not JSON") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ConnectionError(f"{path}: {type(exc).__name__}: {exc}"[:200]) from None
        if not isinstance(out, dict):
            raise Garbage(f"{path} answered JSON that is not an object")
        return out

    # ---- the feed ------------------------------------------------------------------
    async def follow(self) -> None:
        delay = BACKOFF_S[0]
        while True:
            try:
                await self.poll(POLL_WAIT_MS)
                delay = BACKOFF_S[0]
            except Garbage as exc:
                self.down(str(exc), garbage=True)
            except ConnectionError as exc:
                self.down(str(exc))
            if self.state == "unreachable":
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_S[1])

    async def poll(self, wait_ms: int = 0) -> None:
        """One read of the store's feed into the mirror."""
        self.counters.polls += 1
        feed = await self._json("GET", f"/kv/events?after={self.cursor}&limit=1024"
                                       + (f"&wait={wait_ms}" if wait_ms and self.state == "ok" else ""))
        epoch, oldest, batches = feed.get("epoch"), _int(feed, "oldest_seq"), feed.get("batches")
        if not isinstance(epoch, str) or not isinstance(batches, list):
            raise Garbage("/kv/events: no epoch or batches")
        mirror = self.mirror
        if epoch != self.epoch:  # a new store (or the first sight of it): rebuild from its start
            mirror.clear()
            self.counters.resyncs += 1
            if self.state == "unreachable":
                log.warning("shared KV store %s answers again (epoch %s): mirror resyncing", self.url, epoch)
            self.epoch = epoch
            if self.cursor != 0:  # these batches follow another epoch's cursor: read this one from its start
                self.cursor = 0
                return
            if oldest > 1:  # its first events are gone from the ring: a resync (cleared + every chunk) comes
                await self._json("POST", "/kv/resync")
        elif oldest > self.cursor + 1:  # events we never saw: forget, and read on until the resync comes
            mirror.clear()
            self.counters.resyncs += 1
            await self._json("POST", "/kv/resync")
        for b in batches:
            if not isinstance(b, dict):
                raise Garbage("/kv/events: a batch is not an object")
            seq, events = _int(b, "seq"), b.get("events")
            if not isinstance(events, list):
                raise Garbage("/kv/events: a batch without events")
            for i, ev in enumerate(events):
                if seq + i <= self.cursor:
                    continue
                if not (isinstance(ev, list) and len(ev) >= 2 and isinstance(ev[0], str) and isinstance(ev[1], list)):
                    raise Garbage("/kv/events: an event is not [kind, hashes, level]")
                mirror.apply(ev[0], ev[1])
            self.cursor = max(self.cursor, seq + len(events) - 1)
        if self.state != "ok":
            self.state = "ok"
            mirror.available = True

    # ---- shipping --------------------------------------------------------------------
    async def ship_writes(self) -> None:
        while True:
            await self._writes.wait()
            self._writes.clear()
            writes = self.mirror.writes
            if not writes:
                continue
            self.mirror.writes = []
            try:
                await self.write(writes)
            except Garbage as exc:
                self.counters.dropped_write_chunks += len(writes)
                self.down(str(exc), garbage=True)
            except ConnectionError as exc:
                self.counters.dropped_write_chunks += len(writes)
                self.down(str(exc))

    async def write(self, chunks: list[tuple[int, ...]]) -> None:
        if self.state != "ok":
            self.counters.dropped_write_chunks += len(chunks)
            return
        c = self.counters
        c.write_requests += 1
        ans = await self._json("POST", "/kv/write", {"replica_id": self.replica_id, "now": self.clock(),
                                                     "chunks": [list(ch) for ch in chunks]})
        refused = ans.get("refused")
        if not isinstance(refused, list) or not all(isinstance(k, int) for k in refused):
            raise Garbage("/kv/write: no list of refused chunks")
        c.written_chunks += _int(ans, "written")
        c.refused_chunks += len(refused)
        self.mirror.refused(refused)

    async def ship_reads(self) -> None:
        while True:
            await self._reads.wait()
            self._reads.clear()
            reads = self.mirror.reads
            if not reads:
                continue
            self.mirror.reads = []
            try:
                await self.read(reads)
            except Garbage as exc:
                self.counters.read_failures += len(reads)
                self.down(str(exc), garbage=True)
            except ConnectionError as exc:
                self.counters.read_failures += len(reads)
                self.down(str(exc))

    async def read(self, hashes: list[int]) -> None:
        if self.state != "ok":
            self.counters.read_failures += len(hashes)
            return
        c = self.counters
        c.read_requests += 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ans = await self._json("POST", "/kv/read", {"replica_id": self.replica_id, "now": self.clock(),
                                                    "hashes": hashes})
        c.read_wait_s += loop.time() - t0
        c.read_blocks += _int(ans, "held")
        c.read_missing_blocks += _int(ans, "missing")

    # ---- lifecycle -------------------------------------------------------------------
    async def run(self) -> None:
        """The three tasks, until cancelled."""
        async with aiohttp.ClientSession() as session:
            self.session = session
            tasks = [asyncio.create_task(coro, name=name) for coro, name in (
                (self.follow(), "shared-store-feed"), (self.ship_writes(), "shared-store-writes"),
                (self.ship_reads(), "shared-store-reads"))]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> dict:
        return {"url": self.url, "state": self.state, "epoch": self.epoch, "cursor": self.cursor,
                "last_error": self.last_error, **asdict(self.counters), "mirror": self.mirror.stats()}


def check_store(url: str, shared: SharedSettings, block_bytes: int, timeout: float = 5.0) -> dict:
    """At a replica's start: the store answers ``/health`` and holds what this replica's flags say (capacity,
    chunks, writes, the model's block bytes); else one line naming it. A store that is down at start is an
    error (``kvemu up`` starts the stores first); one that goes down later is a fault the replica survives."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
            body = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KvemuError(f"--shared-store-url: no shared KV store answers at {url} ({reason}); start `kvemu store`"
                         " first (kvemu up --shared-cache-gib does)") from None
    if not isinstance(body, dict):
        raise KvemuError(f"--shared-store-url: {url}/health answered something that is not a kvemu store")
    want = {"blocks": shared.blocks, "chunk_blocks": shared.chunk_blocks, "write": shared.write,
            "block_bytes": block_bytes}
    for key, value in want.items():
        if body.get(key) != value:
            raise KvemuError(f"--shared-store-url: the store at {url} has {key} {body.get(key)!r}, this replica's"
                             f" flags say {value!r}; give both the same --shared-* flags, --model and --block-size")
    return body
