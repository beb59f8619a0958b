"""Routers see a shared KV store (issue 45): ``kvemu router --shared-store URL[=ID,...]`` follows the store's event
feed into its embedded index (or, with a Redis index, reads what the store ships there), ``cache_aware`` prices a
block the store holds by ``shared_hit_cost`` (as ``kvemu sim`` does), ``/cluster`` and the dashboard show the
store. The store here is a stand-in speaking `kvemu store`'s wire (``/health`` with ``store_id``, ``/kv/events`` in
a replica's feed format with level-3 events, ``/kv/resync``, ``/stats`` with ``SharedStore.stats()``'s
fields), so that the router's side is tested on its own; the replicas and the router are real processes."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import msgpack
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from kvemu.options.router_flags import live_levels, routing_settings
from kvemu.router_cmd import configure, settings_from_args
from replica.core.tiers.shared import SharedSettings
from replica.core.tiers.stack import TierSettings
from router.metrics import MULTIPROC_ENV, RouterMetrics
from shared.errors import InputError
from shared.hashing import block_hashes
from shared.index import EventBatch, IndexEvent, RedisIndex, StoreScope
from tests.router.test_dashboard import (  # noqa: F401 - chromium is a fixture
    DRAWN_PIXELS_JS,
    _open,
    chromium,
    screenshot_panels,
)
from tests.support.cluster import generate, start_router, stop_all, wait_for
from tests.support.procs import free_port, http_json, start_replica

PROMPT = list(range(64))  # 4 full blocks of 16 tokens
BLOCK_BYTES = 1 << 20


class FakeStore:
    """A stand-in for `kvemu store` on a thread of its own: one store whose chunks are given by the test."""

    def __init__(self, store_id: str = "shared-store", blocks: int = 100) -> None:
        self.store_id, self.blocks, self.epoch = store_id, blocks, "ep" + uuid.uuid4().hex[:8]
        self.batches: list[dict] = []
        self.held: list[int] = []
        self.evictions = self.bytes_moved = 0
        self.resyncs = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def store(self, hashes) -> None:
        """The store writes ``hashes`` (one chunk each) and publishes them, level 3 as `kvemu store` does."""
        def go():
            seq = sum(len(b["events"]) for b in self.batches) + 1
            self.batches.append({"seq": seq, "events": [["stored", list(hashes), 3]]})
            self.held.extend(hashes)
            self.bytes_moved += len(hashes) * BLOCK_BYTES
        self._loop.call_soon_threadsafe(go)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/kv/events", self._events)
        app.router.add_post("/kv/resync", self._resync)
        app.router.add_get("/stats", self._stats)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()

    async def _health(self, request):
        return web.json_response({"status": "ok", "epoch": self.epoch, "store_id": self.store_id, "blocks": self.blocks,
                                  "used_blocks": len(self.held), "level": 3})

    async def _events(self, request):
        after = int(request.query.get("after", "0"))
        nxt = sum(len(b["events"]) for b in self.batches) + 1
        if nxt <= after + 1:
            await asyncio.sleep(min(int(request.query.get("wait", "0")), 200) / 1000)
        body = {"replica_id": self.store_id, "epoch": self.epoch, "oldest_seq": 1, "next_seq": nxt,
                "batches": [b for b in self.batches if b["seq"] > after]}
        return web.Response(body=msgpack.packb(body), content_type="application/msgpack")

    async def _resync(self, request):
        self.resyncs += 1
        return web.json_response({"epoch": self.epoch})

    async def _stats(self, request):
        used = len(self.held)
        return web.json_response({"store_id": self.store_id, "epoch": self.epoch, "blocks": self.blocks,
                                  "used_blocks": used, "chunks": used, "chunk_blocks": 1, "eviction": "mooncake",
                                  "write": "evict", "writes": used, "refused_writes": 0, "reads": 2,
                                  "evictions": self.evictions, "bytes_moved": self.bytes_moved,
                                  "used_bytes": used * BLOCK_BYTES, "nic_gbps": 400.0, "store_gbps": 640.0})

    def stop(self) -> None:
        async def down():
            await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def router_settings(*argv: str):
    import argparse

    p = argparse.ArgumentParser()
    configure(p)
    return settings_from_args(p.parse_args(["--replicas", "http://127.0.0.1:1", *argv]))


def test_the_live_routers_settings_price_the_shared_level_as_sim_does():
    """With a store, the router's RoutingSettings are those ``kvemu sim`` builds for a cluster with a shared store
    (its tiers' ``levels()``); ``--set shared_hit_cost=C`` sets it in both; without a store, as before."""
    sim_levels = TierSettings(shared=SharedSettings(blocks=1000, scope=2)).levels()
    live = router_settings("--shared-store", "http://127.0.0.1:9000")
    assert live.routing_settings == routing_settings(16, [], sim_levels)
    assert live.routing_settings.level_hit_costs == (0.1, 0.5, 0.3) and live.shared_level == len(sim_levels) == 3
    assert live.shared_stores == (("http://127.0.0.1:9000", ()),)
    live = router_settings("--shared-store", "http://127.0.0.1:9000/=r0,r1", "--shared-store", "http://127.0.0.1:9001=r2",
                           "--set", "shared_hit_cost=0.25")
    assert live.routing_settings == routing_settings(16, ["shared_hit_cost=0.25"], sim_levels)
    assert live.routing_settings.level_hit_costs == (0.1, 0.5, 0.25)
    assert live.shared_stores == (("http://127.0.0.1:9000", ("r0", "r1")), ("http://127.0.0.1:9001", ("r2",)))
    plain = router_settings()
    assert plain.routing_settings == routing_settings(16, [], TierSettings().levels()) and plain.shared_level == 0
    assert live_levels(False) == TierSettings().levels()


@pytest.mark.parametrize("argv, field", [
    (("--shared-store", "http://127.0.0.1:9000="), "--shared-store"),
    (("--shared-store", "ftp://x"), "shared_stores"),
    (("--shared-store", "http://127.0.0.1:9000", "--shared-store", "http://127.0.0.1:9000/"), "shared_stores"),
    (("--shared-store", "http://127.0.0.1:9000=a", "--shared-store", "http://127.0.0.1:9001=a,b"), "shared_stores"),
])
def test_bad_shared_store_flags_name_the_flag(argv, field):
    with pytest.raises(InputError) as e:
        router_settings(*argv)
    assert e.value.field == field


def test_a_store_taken_out_is_counted_under_its_name_and_until_next_release_its_old_one(monkeypatch):
    """``kvemu_router_store_failures_total`` (``Cluster.store_failed`` counts it), also written as
    ``kvemu_router_pool_failures_total`` for one release since scrapers may read it; other counters once."""
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    m = RouterMetrics()
    m.count("store_failures")
    m.count("store_failures", 2)
    m.count("replica_failures")
    values = {s.name: s.value for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}
    assert values["kvemu_router_store_failures_total"] == values["kvemu_router_pool_failures_total"] == 3
    assert values["kvemu_router_replica_failures_total"] == 1
    assert sorted(n for n in values if n.endswith("failures_total")) == [
        "kvemu_router_pool_failures_total", "kvemu_router_replica_failures_total", "kvemu_router_store_failures_total"]


async def _ship_to_redis(url: str, cluster: str, store_id: str, hashes) -> None:
    """What the store process does with a Redis index: declare itself a store, ship its batches (the shipper's)."""
    index = RedisIndex(url, cluster=cluster)
    try:
        await index.add_store(StoreScope(store_id, 3))
        await index.apply(EventBatch(store_id, "e1", 1, [IndexEvent("stored", tuple(hashes), 3)]))
    finally:
        await index.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_cache_aware_routes_to_the_replica_the_store_serves(backend, request):
    """b holds the prompt's first 2 blocks in HBM; the store, serving a only, holds all 4. cache_aware
    (shared_hit_cost 0.3): a costs 4 - 0.7 * 4 = 1.2 blocks, b costs 4 - 2 = 2, so a wins; a router blind to the
    store would send it to b."""
    store = FakeStore()
    extra: tuple[str, ...] = ()
    if backend == "redis":
        extra = ("--index", request.getfixturevalue("redis_server").url, "--cluster", f"t{uuid.uuid4().hex[:8]}")
    a = b = router = None
    try:
        a = start_replica(*extra, capacity_blocks=64, replica_id="a")
        b = start_replica(*extra, capacity_blocks=64, replica_id="b")
        assert generate(b.url, PROMPT[:32])[0] == 200
        hashes = block_hashes(PROMPT)
        store.store(hashes)
        if backend == "redis":
            asyncio.run(_ship_to_redis(extra[1], extra[3], store.store_id, hashes))
            router = start_router([a.url, b.url], "--cluster", extra[3], "--shared-store", f"{store.url}=a", index=extra[1])
        else:
            router = start_router([a.url, b.url], "--shared-store", f"{store.url}=a")

        def store_row():
            return http_json("GET", router.url + "/cluster", timeout=5.0)[1]["shared_stores"][0]
        wait_for(lambda: store_row()["healthy"] and (backend == "redis" or store_row()["index_blocks"] == 4),
                 what="the store followed")
        status, headers, out = generate(router.url, PROMPT)
        assert (status, headers["X-Kvemu-Replica"]) == (200, "a"), out
        row = store_row()
        assert (row["store_id"], row["serves"], row["level"], row["used_blocks"], row["blocks"]) == \
            ("shared-store", ["a"], 3, 4, 100)
        assert row["pool_id"] == "shared-store"  # its name until this release, kept for one more
        assert row["occupancy"] == 0.04 and row["event_lag"] == 0
        if backend == "memory":
            assert store.resyncs >= 1  # asked for a full republish when it was first seen
    finally:
        stop_all(router, a, b)
        store.stop()


@pytest.mark.slow
def test_shared_store_panel_in_headless_chromium(chromium, tmp_path):  # noqa: F811 - the imported fixture
    store = FakeStore(blocks=400)
    reps = [start_replica("--host-cache-gib", "0.05", capacity_blocks=200, replica_id=rid, time_scale=0.05)
            for rid in ("p-a", "p-b")]
    router = None
    try:
        router = start_router([r.url for r in reps], "--dashboard-interval", "0.3", "--shared-store", store.url)
        for i in range(8):  # the store fills over time; replicas serve a few prompts (hits by level)
            store.store([1000 * i + k for k in range(20)])
            generate(router.url, range(100 * i, 100 * i + 64))
            time.sleep(0.3)
        page, problems = _open(chromium, router.url, 1280, 1000)
        page.wait_for_selector("[data-panel=shared_stores]:not([hidden])", timeout=20_000)
        page.wait_for_function("() => Number(document.querySelector('[data-panel=shared_stores]').dataset.points || 0) > 3"
                               " && document.querySelectorAll('#shared_stores_table tbody tr').length === 1", timeout=30_000)
        page.evaluate(f"() => {{ window.drawnPixels = {DRAWN_PIXELS_JS}; }}")
        page.wait_for_function("() => window.drawnPixels('shared_stores') > 20 && window.drawnPixels('shared_store_bytes') > 20",
                               timeout=20_000)
        row = page.inner_text("#shared_stores_table tr[data-store='shared-store']").split("\t")
        assert row[:4] == ["shared-store", "up", "every replica", "40%"], row
        assert row[4].startswith("160 / 400 blocks") and "hbm" in row[10], row
        _, view = http_json("GET", router.url + "/dashboard/data?points=5")
        assert view["shared_stores"][0]["used_blocks"] == 160 and view["history"]["stores"]["shared-store"]["occupancy"][-1] == 0.4
        shots = screenshot_panels(page, tmp_path, {"shared_stores": "dashboard-shared-store.png",
                                                   "shared_store_bytes": "dashboard-shared-store-bytes.png"})
        assert (shots / "dashboard-shared-store.png").stat().st_size > 10_000
        assert problems == [], problems
    finally:
        stop_all(router, *reps)
        store.stop()
