"""The router's view of its replicas: health, load, and (embedded index) their event feeds.

Each replica is known by the id it reports on ``/health``. A replica that fails its
checks (``unhealthy_after`` in a row, or a refused connection) is taken out of routing
and its index entries are cleared; it rejoins when a check passes again. A new epoch
on ``/health`` means the replica restarted with an empty cache: its entries are cleared.

Shared KV stores (``settings.shared_stores``, `kvemu store`): each is known by the id its ``/health``
reports (``store_id``; ``pool_id`` from a store of the release before), declared to the index as a store
serving its replicas (``StoreScope``), and,
with the embedded index, its ``/kv/events`` feed is followed as a replica's is (same batches, same
gap and resync rules). A store that fails its checks has its entries cleared (a store that dies loses
what it held); a new epoch (restarted, empty) clears them too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import aiohttp
import msgpack

from router.settings import RouterSettings
from router.strategies import ReplicaState
from router.upstream import ReplicaBusy, ReplicaFailed
from shared.index import EventBatch, IndexUnavailable, StoreScope
from shared.index.base import dp_rank_key

LONG_POLL_MS = 1000  # how long a replica holds a feed read with nothing new
PROBE_REUSE_S = 0.5  # a probe's answer serves every request that asks this soon after it was sent (Cluster.probe)
log = logging.getLogger("kvemu.router.cluster")


@dataclass(slots=True)
class ReplicaHandle:
    url: str
    state: ReplicaState  # what strategies read; replica_id is the URL until /health answers
    epoch: str = ""
    failures: int = 0
    last_check: float = 0.0
    health: dict = field(default_factory=dict)
    top_sessions: list = field(default_factory=list)
    feed_cursor: int = 0  # last event sequence number applied to the embedded index
    feed_lag_events: int = 0
    resync_asked_at: int = -1  # cursor+1 at which we last asked for a resync (one ask per gap)
    known: bool = False  # answered /health at least once
    busy_until: float = 0.0  # answered 503 + Retry-After (overloaded): routed around until then
    busy_strikes: int = 0  # busy answers in a row: the back-off doubles with each
    role: str = "both"  # P/D: both, prefill or decode (the command line's, else what /health says)
    role_given: bool = False  # the command line named it
    pd_stats: dict = field(default_factory=dict)  # the replica's /stats "pd" section (link, transfers), if any
    tier_stats: dict = field(default_factory=dict)  # its /stats "tiers" section (hits by level), if it has levels
    restarts: int = 0  # new epochs its /health reported: restarts with an empty cache (what /cluster shows)
    probe: asyncio.Task | None = None  # the /health probe requests waiting on it share (Cluster.probe)
    probe_at: float = 0.0  # when it was sent (loop time)
    # P/D: its /health says prefills held for remote decodes exhaust its pool (replica/pd_share.py): routed around
    # until they end, yet healthy, its index entries kept
    holds_exhausted: bool = False
    dp_size: int = 1  # data-parallel ranks (its /health's data_parallel_size): the index keeps one entry a rank
    # the requests this router sent naming a rank (X-data-parallel-rank), per rank, until their answers ended:
    # the load router.strategies.chosen_rank balances the ranks on
    rank_in_flight: dict[int, int] = field(default_factory=dict)

    @property
    def replica_id(self) -> str:
        return self.state.replica_id


def unexhausted(reps: list[ReplicaHandle]) -> list[ReplicaHandle]:
    """``reps`` less those whose pools holds for remote decodes exhaust, unless none healthy would be left:
    a request waiting there for room still beats no answer."""
    fresh = [r for r in reps if not r.holds_exhausted]
    return fresh if any(r.state.healthy for r in fresh) else reps


def _following(feed: ReplicaHandle | StoreHandle) -> bool:
    """Whether its feed is read now: a healthy replica, or a healthy store the index knows as one."""
    return feed.healthy and bool(feed.declared) if isinstance(feed, StoreHandle) else feed.state.healthy


def _feed_entry(rep: ReplicaHandle, batch: dict) -> tuple[str, str, int]:
    """A feed batch's place in the index: the replica's entry and the feed's number, or a data-parallel rank's
    (``dp_rank_key``) and the rank's own number, as the replica's Redis shipper writes it."""
    rank = batch.get("dp_rank")
    if rank is None:
        return rep.replica_id, rep.epoch, batch["seq"]
    if type(rank) is not int or not 0 <= rank < rep.dp_size:
        raise ValueError(f"dp_rank {rank!r} is no rank of {rep.replica_id} ({rep.dp_size})")
    return dp_rank_key(rep.replica_id, rank), rep.epoch, batch["rank_seq"]


@dataclass(slots=True)
class StoreHandle:
    """A shared KV store as the router sees it: its feed, like a replica's, and its last ``/stats``."""

    url: str
    serves: tuple[str, ...]  # replica ids of its scope group; (): every replica
    store_id: str = ""  # the id its feed publishes under (its /health's store_id); "" until it answered
    epoch: str = ""
    healthy: bool = False
    declared: str = ""  # the store id the index was told of (add_store)
    failures: int = 0
    feed_cursor: int = 0
    feed_lag_events: int = 0
    resync_asked_at: int = -1
    health: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)  # its last /stats (the dashboard's sampler reads it)
    restarts: int = 0  # new epochs its /health reported: restarted, what it held lost

    @property
    def name(self) -> str:
        return self.store_id or self.url


class Cluster:
    def __init__(self, settings: RouterSettings, index, metrics) -> None:
        self.settings = settings
        self.index = index
        self.metrics = metrics
        self.replicas = [ReplicaHandle(url.rstrip("/"), ReplicaState(url.rstrip("/"), healthy=False),
                                       role=settings.role_of(i) or "both", role_given=bool(settings.role_of(i)))
                         for i, url in enumerate(settings.replicas)]
        self.session: aiohttp.ClientSession = None  # type: ignore[assignment]  # opened in the app's cleanup_ctx
        token = settings.serving.cluster_token
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}  # for replicas' internal endpoints
        self._healthy_event = asyncio.Event()
        self.stores = [StoreHandle(url.rstrip("/"), serves) for url, serves in settings.shared_stores]

    def by_id(self, replica_id: str) -> ReplicaHandle | None:
        for r in self.replicas:
            if r.replica_id == replica_id:
                return r
        return None

    def states(self) -> list[ReplicaState]:
        return [r.state for r in self.replicas]

    def healthy(self) -> list[ReplicaHandle]:
        return [r for r in self.replicas if r.state.healthy]

    @property
    def disaggregated(self) -> bool:
        """A P/D cluster: some replica prefills for others (router/pd_legs.py routes its requests)."""
        return any(r.role == "prefill" for r in self.replicas)

    def pool(self, role: str) -> list[ReplicaHandle]:
        """``prefill``: the prefill instances; ``decode``: every replica that decodes (decode and both)."""
        return [r for r in self.replicas if (r.role == "prefill") == (role == "prefill")]

    # ---- health ---------------------------------------------------------------------
    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check(r) for r in self.replicas), *(self.check_store(p) for p in self.stores),
                                 return_exceptions=True)
            await asyncio.sleep(self.settings.health_interval_s)

    # ---- shared KV stores ------------------------------------------------------------------
    async def _health(self, url: str) -> tuple[dict | None, bool]:
        """A process's ``/health`` answer (None: none, or not a 200), and whether the connection was refused."""
        timeout = aiohttp.ClientTimeout(total=self.settings.health_timeout_s)
        try:
            async with self.session.get(url + "/health", timeout=timeout) as resp:
                body = await resp.json() if resp.status == 200 else None
        except (aiohttp.ClientConnectorError, ConnectionRefusedError):
            return None, True
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None, False
        return body if isinstance(body, dict) else None, False

    async def check_store(self, store: StoreHandle) -> None:
        body, refused = await self._health(store.url)
        if refused:
            await self.store_failed(store, "connection refused", immediate=True)
            return
        store_id = str(body.get("store_id") or body.get("pool_id") or body.get("replica_id") or "") if isinstance(body, dict) else ""
        if not body or body.get("status") != "ok" or not store_id:
            await self.store_failed(store, "health check failed")
            return
        epoch = str(body.get("epoch", ""))
        if store.store_id and (store_id != store.store_id or epoch != store.epoch):
            log.warning("shared store %s restarted (epoch %s -> %s): clearing its index entries", store_id, store.epoch,
                        epoch)
            await self._clear_store(store)
            store.restarts += 1
            self.metrics.restarted("shared_store", store_id)
        store.store_id, store.epoch, store.failures, store.health = store_id, epoch, 0, body
        level = body.get("level")
        if isinstance(level, int) and level != self.settings.shared_level and not store.healthy:
            log.warning("shared store %s publishes level %s but the router prices the shared level as %s: the router's"
                        " is used", store_id, level, self.settings.shared_level)
        if store.declared != store_id:
            try:
                await self.index.add_store(StoreScope(store_id, self.settings.shared_level, store.serves))
                store.declared = store_id
            except IndexUnavailable:
                self.metrics.count("index_errors")
        if not store.healthy:
            store.healthy = True
            log.info("shared store %s at %s is healthy", store_id, store.url)
            await self._post(store.url + "/kv/resync")  # the index may lack what it holds: a full republish
        self.metrics.store(store_id, healthy=1.0)

    async def store_failed(self, store: StoreHandle, reason: str, immediate: bool = False) -> None:
        store.failures += 1
        if store.healthy and (immediate or store.failures >= self.settings.unhealthy_after):
            log.warning("shared store %s at %s taken out: %s (what it held is lost to routing)", store.name, store.url,
                        reason)
            store.healthy = False
            self.metrics.count("store_failures")
            self.metrics.store(store.name, healthy=0.0)
            await self._clear_store(store)

    async def _clear_store(self, store: StoreHandle) -> None:
        store.feed_cursor = 0
        if store.store_id:
            try:
                await self.index.clear_replica(store.store_id)
            except IndexUnavailable:
                self.metrics.count("index_errors")

    def probe(self, rep: ReplicaHandle) -> asyncio.Task:
        """Whether ``rep`` answers ``/health`` now (True: status ok), for requests that have waited long on it
        (router.upstream.Watch): one probe per replica at a time, shared by every request that asks meanwhile.
        Not a health check: the request that gives up sets the replica aside (``set_aside``)."""
        loop = asyncio.get_running_loop()
        # one answered within PROBE_REUSE_S is as good as a new one: at most a few probes a second per replica,
        # however many requests wait on it
        if rep.probe is None or (rep.probe.done() and loop.time() - rep.probe_at > PROBE_REUSE_S):
            rep.probe, rep.probe_at = loop.create_task(self._answers(rep.url)), loop.time()
        return rep.probe

    async def _answers(self, url: str) -> bool:
        body, _ = await self._health(url)
        return body is not None and body.get("status") == "ok"

    async def _post(self, url: str) -> None:
        try:
            async with self.session.post(url, headers=self.auth,
                                         timeout=aiohttp.ClientTimeout(total=self.settings.health_timeout_s)):
                pass
        except (TimeoutError, aiohttp.ClientError):
            pass  # the next rejoin tries again; meanwhile the index only under-reports

    async def check(self, rep: ReplicaHandle) -> None:
        body, refused = await self._health(rep.url)
        if refused:
            await self.mark_failed(rep, "connection refused", immediate=True)
            return
        if not body or body.get("status") != "ok":
            await self.mark_failed(rep, "health check failed")
            return
        await self._mark_healthy(rep, body)

    async def _mark_healthy(self, rep: ReplicaHandle, body: dict) -> None:
        replica_id, epoch = str(body.get("replica_id", rep.url)), str(body.get("epoch", ""))
        if rep.known and (replica_id != rep.replica_id or epoch != rep.epoch):
            log.warning("replica %s restarted (epoch %s -> %s): clearing its index entries", replica_id, rep.epoch,
                        epoch)
            await self._clear(rep)
            self.metrics.count("replica_restarts")
            rep.restarts += 1
            self.metrics.restarted("replica", replica_id)
        if not rep.known or replica_id != rep.replica_id:
            rep.state.replica_id = replica_id
        rejoined = not rep.state.healthy
        rep.epoch, rep.known, rep.failures = epoch, True, 0
        self._learn_role(rep, body)
        rep.health, rep.last_check = body, time.monotonic()
        rep.state.kv_usage = float(body.get("kv_usage", 0.0))
        rep.state.capacity_blocks = int(body.get("capacity_blocks", 0))
        size = body.get("data_parallel_size", 1)
        rep.dp_size = size if isinstance(size, int) and 1 <= size <= 1024 else 1
        self._read_holds(rep, body)
        self.metrics.replica(replica_id, kv_usage=rep.state.kv_usage, healthy=1.0,
                             held_usage=float(body.get("held_usage", 0.0)))
        if rejoined:
            # First sight, or back after being taken out (its entries were cleared): the index
            # may lack blocks it still holds, so ask for a full republish. Healthy before the
            # ask, so a check running alongside (start-up, a feed poll) does not ask again.
            rep.state.healthy = True
            log.info("replica %s at %s is healthy", replica_id, rep.url)
            self._check_matching(rep, body)
            await self._request_resync(rep)
        self._healthy_event.set()

    def _read_holds(self, rep: ReplicaHandle, body: dict) -> None:
        """Whether prefills held for remote decodes exhaust its pool (``holds``): routed around while they do.
        Not a failure: it answers, and what it caches stays in the index."""
        exhausted = body.get("holds") == "exhausted"
        if exhausted != rep.holds_exhausted:
            log.warning("replica %s at %s: held prefills %s (held_usage %.3f)", rep.replica_id, rep.url,
                        "exhaust its KV pool: routing around it" if exhausted else "no longer exhaust its KV pool",
                        float(body.get("held_usage", 0.0)))
            self.metrics.count("holds_exhausted", int(exhausted))
        rep.holds_exhausted = exhausted

    @staticmethod
    def _learn_role(rep: ReplicaHandle, body: dict) -> None:
        """The role the replica reports wins: it is what it does (a command line that says otherwise is logged)."""
        said = body.get("role")
        if not isinstance(said, str) or said not in ("both", "prefill", "decode") or said == rep.role:
            return
        if rep.role_given:
            log.warning("replica %s at %s reports role %s but the router was told %s: routing it as %s",
                        rep.replica_id, rep.url, said, rep.role, said)
        rep.role = said

    async def _request_resync(self, rep: ReplicaHandle) -> None:
        await self._post(rep.url + "/kv/resync")

    def mark_busy(self, rep: ReplicaHandle) -> None:
        """Overloaded, not failed: keep it in the cluster and its entries in the index, back off."""
        rep.busy_strikes += 1
        backoff = min(self.settings.busy_backoff_s * 2 ** (rep.busy_strikes - 1), 2.0)
        rep.busy_until = time.monotonic() + backoff
        self.metrics.count("replica_busy")

    async def set_aside(self, rep: ReplicaHandle, exc: ReplicaBusy | ReplicaFailed) -> bool:
        """A replica that could not take a request: busy backs off, failed is taken out at once (a request
        path retries elsewhere). Returns whether it was busy."""
        if isinstance(exc, ReplicaBusy):
            self.mark_busy(rep)
            return True
        await self.mark_failed(rep, str(exc), immediate=True)
        return False

    async def mark_failed(self, rep: ReplicaHandle, reason: str, immediate: bool = False) -> None:
        rep.failures += 1
        if rep.state.healthy and (immediate or rep.failures >= self.settings.unhealthy_after):
            log.warning("replica %s at %s taken out: %s", rep.replica_id, rep.url, reason)
            rep.state.healthy = False
            self.metrics.count("replica_failures")
            self.metrics.replica(rep.replica_id, healthy=0.0)
            await self._clear(rep)

    async def _clear(self, rep: ReplicaHandle) -> None:
        rep.feed_cursor = 0
        try:
            await self.index.clear_replica(rep.replica_id)
            for rank in range(rep.dp_size if rep.dp_size > 1 else 0):  # each data-parallel rank's entry
                await self.index.clear_replica(dp_rank_key(rep.replica_id, rank))
        except IndexUnavailable:
            self.metrics.count("index_errors")  # a Redis index will see the epoch change or gap later

    def _check_matching(self, rep: ReplicaHandle, body: dict) -> None:
        """A replica that hashes prompts in other units than this router never matches its index: say so
        (it is still routed, on load)."""
        theirs = (str(body.get("matching", "blocks")), body.get("block_size", self.settings.block_size))
        ours = (self.settings.matching, self.settings.block_size)
        if theirs != ours:
            log.warning("replica %s matches by %s of %s tokens but this router hashes %s of %s: the index will not"
                        " see its cache; start the router with the replicas' --matching / --page-size / --block-size",
                        rep.replica_id, theirs[0], theirs[1], ours[0], ours[1])

    async def wait_healthy(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._healthy_event.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # ---- embedded index: poll each replica's event feed -----------------------------------
    async def feed_loop(self) -> None:
        """One long-polling reader per replica: a quiet replica is asked about once a second
        (``LONG_POLL_MS``), a busy one as soon as it has a new batch."""
        await asyncio.gather(*(self._feed_reader(r) for r in self.replicas), *(self._feed_reader(p) for p in self.stores))

    async def _feed_reader(self, rep: ReplicaHandle | StoreHandle) -> None:
        while True:
            if not _following(rep):
                await asyncio.sleep(self.settings.poll_interval_s)
                continue
            started = time.monotonic()
            try:
                more = await (self.poll_store_feed(rep, wait_ms=LONG_POLL_MS) if isinstance(rep, StoreHandle)
                              else self.poll_feed(rep, wait_ms=LONG_POLL_MS))
            except Exception:  # noqa: BLE001 - one replica's bad answer must not stop its reader for good
                log.warning("reading %s's event feed failed", rep.url, exc_info=True)
                more = False
            if not more and time.monotonic() - started < self.settings.poll_interval_s:
                # answered at once with nothing (an error, or a replica that does not long-poll): pace it
                await asyncio.sleep(self.settings.poll_interval_s)

    async def _read_feed(self, base: str, after: int, wait_ms: int) -> dict | None:
        """One read of a replica's or a store's ``/kv/events`` after ``after`` (msgpack); None: no usable answer."""
        url = f"{base}/kv/events?after={after}&limit=512" + (f"&wait={wait_ms}" if wait_ms else "")
        timeout = aiohttp.ClientTimeout(total=2.0 + wait_ms / 1000)
        try:
            async with self.session.get(url, headers={"Accept": "application/msgpack", **self.auth},
                                        timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                feed = msgpack.unpackb(await resp.read(), raw=False)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return feed if isinstance(feed, dict) else None

    async def poll_feed(self, rep: ReplicaHandle, wait_ms: int = 0) -> bool:
        """Apply new batches; True when the replica has more waiting. ``wait_ms``: a long poll."""
        feed = await self._read_feed(rep.url, rep.feed_cursor, wait_ms)
        if feed is None:
            return False
        if feed.get("epoch") != rep.epoch:
            # Restarted between health checks: check now so its stale entries go at once.
            await self.check(rep)
            return False
        applied_to = rep.feed_cursor
        if int(feed.get("oldest_seq", 1)) > applied_to + 1 and rep.resync_asked_at < applied_to + 1:
            # Batches we never read aged out of the replica's ring: the index will see the gap
            # and clear this replica; a resync then rebuilds it.
            rep.resync_asked_at = applied_to + 1
            self.metrics.count("event_gaps")
            await self._request_resync(rep)
        for b in feed.get("batches", []):
            batch = EventBatch(*_feed_entry(rep, b), b["events"])  # validated into IndexEvents
            result = self.index.apply_sync(batch)
            self.metrics.count("events_applied", result.applied)
            self.metrics.count("event_gaps", int(result.reset == "gap"))
            applied_to = max(applied_to, b["seq"] + len(batch.events) - 1)  # the feed's number (a rank's differs)
        rep.feed_cursor = applied_to
        lag = max(int(feed.get("next_seq", 1)) - 1 - applied_to, 0)
        if lag != rep.feed_lag_events or applied_to != rep.feed_cursor:
            self.metrics.replica(rep.replica_id, event_lag=lag)
        rep.feed_lag_events = lag
        return rep.feed_lag_events > 0

    async def poll_store_feed(self, store: StoreHandle, wait_ms: int = 0) -> bool:
        """A shared store's feed, as ``poll_feed`` reads a replica's (its batches apply to the store's set: the
        index was told the id is a store's before the first read)."""
        feed = await self._read_feed(store.url, store.feed_cursor, wait_ms)
        if feed is None:
            return False
        if feed.get("epoch") != store.epoch or feed.get("replica_id", store.store_id) != store.store_id:
            await self.check_store(store)  # restarted between health checks: its stale entries go at once
            return False
        applied_to = store.feed_cursor
        if int(feed.get("oldest_seq", 1)) > applied_to + 1 and store.resync_asked_at < applied_to + 1:
            store.resync_asked_at = applied_to + 1
            self.metrics.count("event_gaps")
            await self._post(store.url + "/kv/resync")
        for b in feed.get("batches", []):
            batch = EventBatch(store.store_id, store.epoch, b["seq"], b["events"])
            result = self.index.apply_sync(batch)
            self.metrics.count("events_applied", result.applied)
            self.metrics.count("event_gaps", int(result.reset == "gap"))
            applied_to = max(applied_to, batch.last_seq)
        store.feed_cursor = applied_to
        store.feed_lag_events = max(int(feed.get("next_seq", 1)) - 1 - applied_to, 0)
        self.metrics.store(store.store_id, event_lag=store.feed_lag_events)
        return store.feed_lag_events > 0
