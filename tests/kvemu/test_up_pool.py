"""`kvemu up --shared-cache-gib G [--shared-scope K]`: the pools start first, every replica points at its
group's pool, and the router is told each pool and whom it serves (its /cluster shows them healthy)."""

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


@pytest.mark.parametrize("scope,expected", [("0", [("shared-pool", "all")]),
                                            ("1", [("shared-pool-0", ["replica-0"]),
                                                   ("shared-pool-1", ["replica-1"])])])
def test_up_tells_the_router_each_pool_and_whom_it_serves(scope, expected):
    up = Up("--replicas", "2", "--capacity-blocks", "2000", "--shared-cache-gib", "2", "--shared-scope", scope,
            "--port", str(free_port()))
    try:
        urls = up.ready()
        pools = _cluster(urls["router"])["shared_pools"]
    finally:
        up.cleanup()
    assert sorted((p["pool_id"], p["serves"]) for p in pools) == expected
    assert all(p["healthy"] and p["level"] == 3 for p in pools)
