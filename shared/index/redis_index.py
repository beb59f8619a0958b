"""Redis prefix index: every operation is one Lua call (one round trip, atomic).

Several router processes on several hosts share one view through it.  The key layout and
the generation trick that makes clearing O(1) are described in ``scripts.py``.  Every
Redis failure surfaces as ``IndexUnavailable`` naming the URL; the connection pool
reconnects by itself, so the same object works again once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from shared.errors import InputError
from shared.index import pipelined, scripts
from shared.index.base import (
    COUNTERS,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_REPLICAS,
    MAX_LEVEL,
    ApplyResult,
    EventBatch,
    IndexUnavailable,
    ReplicaIndexState,
    StoreScope,
    lower_counts,
)
from shared.validate import check_positive_int

_CLUSTER_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KIND_CODE = {"stored": "s", "removed": "r", "cleared": "c"}
# Retired entries each apply unlinks even when the index is not full, so garbage drains
# while traffic flows; clear_replica drains in chunks of _DRAIN_CHUNK.
GC_CHUNK = 256
_DRAIN_CHUNK = 4096


# The password of a Redis URL that has none, so that a process need not carry it on its command line,
# which every user of the host can read: `kvemu up` hands a given URL's password on so
# (split_password), and an operator may set it for `kvemu router` / `kvemu replica` alike.
PASSWORD_ENV = "KVEMU_REDIS_PASSWORD"


def split_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password, and the password (None where it has none)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment)), parts.password


class _SharedPools:
    """One connection pool per (URL, event loop) in a process, shared by every index on it.

    Pools are bound to the loop their connections were opened on, hence the loop in the
    key; the entry holds the loop itself so its id cannot be reused while the pool lives.
    """

    def __init__(self) -> None:
        self._pools: dict[tuple[str, int], list] = {}  # key -> [pool, loop, users]

    def acquire(self, url: str, size: int, timeout: float) -> aioredis.BlockingConnectionPool:
        loop = asyncio.get_running_loop()
        entry = self._pools.get((url, id(loop)))
        if entry is None:
            password = os.environ.get(PASSWORD_ENV) if urlsplit(url).password is None else None
            extra = {"password": password} if password else {}
            pool = aioredis.BlockingConnectionPool.from_url(
                # No socket_timeout: redis-py wraps every read and write in its own timer
                # (2.5x the cost of a PING under uvloop); _guard bounds each call instead.
                url, max_connections=size, timeout=timeout, decode_responses=True,
                socket_connect_timeout=min(timeout, 2.0),
                # A short retry rides out a dropped connection; a dead server fails fast.
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 2), **extra,
            )
            entry = self._pools[(url, id(loop))] = [pool, loop, 0]
        entry[2] += 1
        return entry[0]

    async def release(self, url: str, pool: aioredis.BlockingConnectionPool) -> None:
        for key, entry in list(self._pools.items()):
            if key[0] == url and entry[0] is pool:
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._pools[key]
                    await pool.aclose()
                return


POOLS = _SharedPools()


class RedisIndex:
    backend = "redis"

    def __init__(self, url: str, *, cluster: str = "default", max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_replicas: int = DEFAULT_MAX_REPLICAS, pool_size: int = 16, timeout: float = 5.0,
                 gc_chunk: int = GC_CHUNK) -> None:
        if not isinstance(cluster, str) or not _CLUSTER_RE.fullmatch(cluster):
            raise InputError("cluster", f"must be 1-64 of [A-Za-z0-9_.-], got {cluster!r}")
        check_positive_int("max_entries", max_entries)
        check_positive_int("max_replicas", max_replicas)
        if max_replicas > scripts.MAX_SLOTS:
            raise InputError("max_replicas", f"the Redis index supports at most {scripts.MAX_SLOTS}")
        check_positive_int("pool_size", pool_size)
        check_positive_int("gc_chunk", gc_chunk)
        _check_url(url)
        self.url = url
        self.safe_url = _redact(url)
        self.cluster = cluster
        self.prefix = f"kvemu:{cluster}:"
        self.max_entries = max_entries
        self.max_replicas = max_replicas
        self.pool_size = pool_size
        self.timeout = timeout
        self.gc_chunk = gc_chunk
        self._pool: aioredis.BlockingConnectionPool | None = None
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._fast: pipelined.PipelinedConnection | None = None  # lookups only (the hot path)
        self._lookups = 0
        self._stores: dict[str, StoreScope] = {}  # this process's shared stores, in the order declared
        self._store_args: list[Any] = []  # their scopes as the lookup script takes them

    # ---- protocol -----------------------------------------------------------------------
    async def apply(self, batch: EventBatch) -> ApplyResult:
        args: list[Any] = [self.prefix, self.max_entries, self.gc_chunk, self.max_replicas,
                           batch.replica_id, batch.epoch, batch.seq, len(batch.events)]
        for ev in batch.events:
            args.append(_KIND_CODE[ev.kind] + (f":{ev.level}" if ev.level else ""))
            args.append(_hex(ev.hashes))
        async with self._guard():
            status, applied, dropped, synced = await self._scripts["apply"](args=args)
        if status == "full":
            raise InputError("replica_id", f"index already tracks max_replicas={self.max_replicas} replicas; "
                                           f"clear_replica() ones that are gone")
        return ApplyResult(int(applied), status == "duplicate", status if status in ("epoch", "gap") else None,
                           int(dropped), bool(synced))

    async def lookup(self, hashes: Sequence[int]) -> dict[str, int]:
        self._lookups += 1
        if len(hashes) == 0:
            return {}
        try:
            blob = _hex(hashes)
        except (struct.error, TypeError):
            raise InputError("hashes", "must be 64-bit unsigned integers") from None
        if pipelined.supports(self.url):
            flat = await self._fast_lookup(blob)
        else:
            flat = await self._slow_lookup(blob)
        return {_text(flat[k]): int(flat[k + 1]) for k in range(0, len(flat), 2)}

    async def _slow_lookup(self, blob: str) -> list:
        async with self._guard():
            return await self._scripts["lookup"](args=[self.prefix, blob, *self._store_args])

    async def _fast_lookup(self, blob: str) -> list:
        """EVALSHA on the shared pipelined connection: the router's per-request round trip."""
        if self._client is None:
            self._connect()  # registers the scripts (their SHAs) on the redis-py side
        if self._fast is None:
            self._fast = pipelined.PipelinedConnection(self.url, min(self.timeout, 2.0))
        try:
            async with asyncio.timeout(self.timeout):
                reply = await self._fast.call("EVALSHA", self._scripts["lookup"].sha, 0, self.prefix, blob,
                                              *self._store_args)
                return reply  # type: ignore[return-value]  # the script returns a RESP array
        except pipelined.ReplyError as e:
            if "NOSCRIPT" in str(e):  # Redis restarted empty: redis-py's path loads the script
                return await self._slow_lookup(blob)
            raise IndexUnavailable(self.safe_url, str(e)) from None
        except TimeoutError:
            raise IndexUnavailable(self.safe_url, f"no reply within {self.timeout}s") from None
        except (OSError, ConnectionError) as e:
            raise IndexUnavailable(self.safe_url, f"{type(e).__name__}: {e}") from None

    async def add_store(self, scope: StoreScope) -> None:
        """Declare the store in Redis (its batches, whoever ships them, are a store's from now on) and answer
        its scope in this process's lookups (the scope travels with each lookup: a router's, from its flags)."""
        async with self._guard():
            await self._scripts["declare"](args=[self.prefix, scope.store_id])
        self._stores[scope.store_id] = scope
        self._store_args = [a for sc in self._stores.values() for a in (sc.store_id, str(sc.level), ",".join(sc.replicas))]

    async def clear_replica(self, replica_id: str) -> int:
        async with self._guard():
            blocks = await self._scripts["forget"](args=[self.prefix, replica_id])
        # Unlink the retired entries now, in bounded chunks between which other clients
        # run (each chunk with its own timeout), so memory is returned when this returns.
        while True:
            async with self._guard():
                done, queued = await self._scripts["collect"](args=[self.prefix, _DRAIN_CHUNK])
            if int(queued) == 0 or int(done) == 0:
                break
        return int(blocks)

    async def replicas(self) -> dict[str, ReplicaIndexState]:
        async with self._guard():
            flat = await self._scripts["state"](args=[self.prefix])
        width = 2 + MAX_LEVEL + len(scripts.STATE_FIELDS)
        out = {}
        for k in range(0, len(flat), width):
            rid, blocks = flat[k:k + 2]
            lower = [int(n) for n in flat[k + 2:k + 2 + MAX_LEVEL]]
            epoch, last_seq, synced, *counters = flat[k + 2 + MAX_LEVEL:k + width]
            out[rid] = ReplicaIndexState(epoch=epoch, last_seq=int(last_seq), blocks=int(blocks), synced=synced == "1",
                                         lower_blocks=lower_counts(lower),
                                         **dict(zip(scripts.STATE_FIELDS[3:], map(int, counters), strict=True)))
        return out

    async def stats(self) -> dict[str, Any]:
        p = self.prefix
        async with self._guard():
            assert self._client is not None  # _guard() connects
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hgetall(p + "stats").get(p + "entries").get(p + "garbage").hlen(p + "replicas")  # type: ignore[union-attr,attr-defined]
                counters, entries, garbage, replicas = await pipe.execute()
        garbage = int(garbage or 0)
        # The bound counts garbage too (it holds memory until unlinked); "entries" is
        # the live view, comparable with the memory backend.
        out: dict[str, Any] = {"backend": self.backend, "url": self.safe_url, "cluster": self.cluster,
                               "replicas": replicas, "entries": int(entries or 0) - garbage,
                               "gc_pending_entries": garbage,
                               "max_entries": self.max_entries, "max_replicas": self.max_replicas}
        out.update({name: int(counters.get(name, 0)) for name in COUNTERS})
        out["lookups"] = self._lookups  # this process's, not the cluster's
        return out

    async def close(self) -> None:
        if self._fast is not None:
            fast, self._fast = self._fast, None
            await fast.close()
        if self._pool is not None:
            pool, self._pool, self._client = self._pool, None, None
            await POOLS.release(self.url, pool)

    # ---- internals ------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        try:
            if self._client is None:
                self._connect()
            async with asyncio.timeout(self.timeout):
                yield
        except TimeoutError:  # asyncio's; redis-py's own TimeoutError is a RedisError
            raise IndexUnavailable(self.safe_url, f"no reply within {self.timeout}s") from None
        except (RedisError, OSError) as e:
            raise IndexUnavailable(self.safe_url, f"{type(e).__name__}: {e}") from e

    def _connect(self) -> None:
        self._pool = POOLS.acquire(self.url, self.pool_size, self.timeout)
        self._client = aioredis.Redis(connection_pool=self._pool)
        # register_script: EVALSHA, with SCRIPT LOAD on NOSCRIPT (e.g. after a restart).
        self._scripts = {name: self._client.register_script(getattr(scripts, name.upper()))
                         for name in ("apply", "lookup", "forget", "collect", "state", "declare")}


def _check_url(url: Any) -> None:
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        ok = parts is not None and parts.scheme in ("redis", "rediss", "unix")
        _ = ok and parts is not None and parts.port  # raises ValueError on a malformed port
    except ValueError:
        ok = False
    if not ok:
        raise InputError("url", f"expected redis://host:port/db, rediss:// or unix://, got {url!r}")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _hex(hashes) -> str:
    """Hashes as concatenated 16-hex-digit fields, the form the scripts split and use in keys."""
    return struct.pack(f">{len(hashes)}Q", *hashes).hex()


def _redact(url: str) -> str:
    """The URL without its password, for messages and stats."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))
