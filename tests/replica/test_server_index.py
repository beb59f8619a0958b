"""A replica publishing KV events to a real (private) Redis index; Redis outages lose nothing."""

import asyncio
import time
import uuid

import pytest

from shared.hashing import block_hashes
from shared.index import RedisIndex
from tests.conftest import RedisServer
from tests.support.procs import http_json, start_replica

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow


def lookup(url: str, cluster: str, hashes) -> dict:
    async def go():
        index = RedisIndex(url, cluster=cluster)
        try:
            return await index.lookup(hashes)
        finally:
            await index.close()

    return asyncio.run(go())


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_events_reach_redis_and_survive_an_outage():
    redis = RedisServer()
    redis.start()
    cluster = "t" + uuid.uuid4().hex[:8]
    replica = start_replica("--index", redis.url, "--cluster", cluster, capacity_blocks=500, replica_id="rA")
    try:
        tokens = list(range(160))
        hashes = block_hashes(tokens)
        assert http_json("POST", replica.url + "/generate", {"token_ids": tokens, "max_tokens": 1})[0] == 200
        assert wait_for(lambda: lookup(redis.url, cluster, hashes).get("rA") == 10)

        redis.stop()
        more = list(range(1000, 1320))
        status, out = http_json("POST", replica.url + "/generate", {"token_ids": more, "max_tokens": 1}, timeout=10)
        assert status == 200  # serving does not wait on the index
        time.sleep(0.5)
        stats = http_json("GET", replica.url + "/stats")[1]["index_shipper"]
        assert stats["failures"] >= 1 and "unavailable" in stats["last_error"]

        redis.start()  # same port, empty data: the resync must rebuild this replica's view
        assert wait_for(lambda: lookup(redis.url, cluster, block_hashes(more)).get("rA") == 20, timeout=15)
        assert lookup(redis.url, cluster, hashes).get("rA") == 10
    finally:
        replica.stop()
        redis.stop()


def test_an_idle_replica_rebuilds_an_index_that_restarted_empty():
    """No batch was lost (nothing was sent during the outage), yet Redis forgot everything:
    the heartbeat tells the replica the index is out of sync, and it resyncs."""
    redis = RedisServer()
    redis.start()
    cluster = "t" + uuid.uuid4().hex[:8]
    replica = start_replica("--index", redis.url, "--cluster", cluster, capacity_blocks=500, replica_id="rI")
    try:
        tokens = list(range(5000, 5160))
        hashes = block_hashes(tokens)
        assert http_json("POST", replica.url + "/generate", {"token_ids": tokens, "max_tokens": 1})[0] == 200
        assert wait_for(lambda: lookup(redis.url, cluster, hashes).get("rI") == 10)
        redis.stop()
        redis.start()  # immediately: the replica's shipper never sees a failure
        assert wait_for(lambda: lookup(redis.url, cluster, hashes).get("rI") == 10, timeout=15)
        stats = http_json("GET", replica.url + "/stats")[1]["index_shipper"]
        assert stats["index_resets"] + stats["failures"] >= 1
    finally:
        replica.stop()
        redis.stop()
