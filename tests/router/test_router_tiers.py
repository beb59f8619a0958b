"""Tier-aware routing live: a replica ships its host tier's blocks to the router's index, and
``cache_aware`` prices a host hit by its fetch cost, as the simulator does (real processes)."""

from __future__ import annotations

import uuid

import pytest

from shared.hashing import block_hashes
from tests.support.cluster import generate, redis_lookup, start_router, stop_all, wait_for, wait_indexed
from tests.support.procs import start_replica

pytestmark = pytest.mark.slow

# qwen3-coder-30b-a3b: 1.5 MiB per 16-token block; 0.01 GiB of host = 6 blocks
HOST = ("--host-cache-gib", "0.01", "--tier-policy", "host=lru", "--fetch", "always")
PROMPT = list(range(64))  # 4 full blocks


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_block_demoted_to_host_is_a_host_hit_the_router_prices(backend, request):
    """a holds the prompt's 4 blocks in host only (demoted), b holds its first 3 in HBM.
    cache_aware (host_hit_cost 0.1): a costs 4 - 0.9 * 4 = 0.4 blocks, b costs 4 - 3 = 1, so a
    wins; an index blind to tiers would see a miss on a (cost 4) and send it to b."""
    extra: tuple[str, ...] = ()
    if backend == "redis":
        extra = ("--index", request.getfixturevalue("redis_server").url, "--cluster", f"t{uuid.uuid4().hex[:8]}")
    a = b = router = None
    try:
        a = start_replica(*HOST, *extra, capacity_blocks=8, replica_id="a")  # 4 blocks + a token fit
        b = start_replica(*extra, capacity_blocks=64, replica_id="b")
        assert generate(a.url, PROMPT)[0] == 200
        assert generate(a.url, range(1000, 1064))[0] == 200  # the pool is full
        assert generate(a.url, range(2000, 2064))[0] == 200  # evicts the prompt from a's HBM: demoted to host
        assert generate(b.url, PROMPT[:48])[0] == 200
        want = {"a#1": 4, "b": 3}
        if backend == "redis":
            router = start_router([a.url, b.url], "--cluster", extra[3], index=extra[1])
            wait_for(lambda: redis_lookup(extra[1], extra[3], block_hashes(PROMPT)) == want, what="tiers indexed")
        else:
            router = start_router([a.url, b.url])  # it polls both feeds from the start (and asks a resync)
            wait_indexed(router.url, [a.url, b.url])
        status, headers, out = generate(router.url, PROMPT)
        assert status == 200, out
        assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == ("a", "load_over_cache")
        assert out["cached_tokens"] == 48  # restored from host, but for the last block: a prompt cached whole recomputes it (vLLM)
    finally:
        stop_all(router, a, b)
