"""`kvemu up --shared-cache-gib G [--shared-scope K]`: the stores start first, every replica points at its
group's store, and the router is told each store and whom it serves (its /cluster shows them healthy)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.conftest import free_port
from tests.support.kvemu_cli import Up

pytestmark = pytest.mark.slow


def _cluster(router: str) -> dict:
    with urllib.request.urlopen(router + "/cluster", timeout=10) as resp:
        return json.load(resp)


@pytest.mark.parametrize("scope,expected", [("0", [("shared-store", "all")]),
                                            ("1", [("shared-store-0", ["replica-0"]),
                                                   ("shared-store-1", ["replica-1"])])])
def test_up_tells_the_router_each_store_and_whom_it_serves(scope, expected):
    up = Up("--replicas", "2", "--capacity-blocks", "2000", "--shared-cache-gib", "2", "--shared-scope", scope,
            "--port", str(free_port()))
    try:
        urls = up.ready()
        stores = _cluster(urls["router"])["shared_stores"]
    finally:
        up.cleanup()
    assert sorted((p["store_id"], p["serves"]) for p in stores) == expected
    assert all(p["healthy"] and p["level"] == 3 for p in stores)


def test_with_a_redis_index_the_store_ships_what_it_holds_there(tmp_path):
    """`--index redis`: routers read Redis, so the store ships its feed there as a store's, as replicas ship
    theirs. A prompt one replica's HBM evicted (written to the store) answers every replica at the shared
    level in the Redis index."""
    import asyncio
    import time

    from shared.index.base import StoreScope
    from shared.index.redis_index import RedisIndex
    from tests.support.procs import http_json

    up = Up("--replicas", "2", "--capacity-blocks", "60", "--index", "redis", "--shared-cache-gib", "2",
            "--routing", "round_robin", "--port", str(free_port()))
    try:
        urls = up.ready()
        first = list(range(1000, 1050))
        for k, hashes in enumerate((first, list(range(2000, 2050)), list(range(3000, 3050)))):
            status, _ = http_json("POST", urls["replica-0"] + "/generate",
                                  {"block_hashes": hashes, "max_tokens": 1, "session": f"s{k}"})
            assert status == 200
        async def lookup() -> dict:
            idx = RedisIndex(urls["redis"], cluster="default")
            try:
                await idx.add_store(StoreScope("shared-store", 3))
                return await idx.lookup(first)
            finally:
                await idx.close()
        deadline, got = time.monotonic() + 15, {}
        while time.monotonic() < deadline:
            got = asyncio.run(lookup())
            if got.get("replica-1#3"):
                break
            time.sleep(0.2)
    finally:
        up.cleanup()
    assert got.get("replica-1#3", 0) > 0 and got.get("replica-0#3", 0) > 0, got
