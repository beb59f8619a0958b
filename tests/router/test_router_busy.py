"""Issue 17, item 2: a replica's own 503 + Retry-After (queue full) is overload, not failure."""

from tests.support.cluster import generate, metric, run_load, scrape, start_router, stop_all, wait_for, wait_indexed
from tests.support.procs import http_json, start_replica


def test_a_busy_replica_is_routed_around_not_taken_out():
    busy = start_replica("--max-running", "1", "--max-waiting", "1", time_scale=1.0, replica_id="busy")
    calm = start_replica(replica_id="calm")
    router = None
    try:
        router = start_router([busy.url, calm.url], routing="round_robin")
        marker = list(range(500_000, 500_160))  # 10 blocks, cached on the busy replica
        for _ in range(2):  # round robin: one of two lands there
            status, headers, _ = generate(router.url, marker)
            if headers["X-Kvemu-Replica"] == "busy":
                break
        assert headers["X-Kvemu-Replica"] == "busy"
        wait_indexed(router.url, [busy.url, calm.url])

        bodies = [{"token_ids": list(range(i * 1000, i * 1000 + 64)), "max_tokens": 40} for i in range(60)]
        result = run_load(router.url, bodies, concurrency=12)
        assert dict(result.outcomes) == {"200": 60}, result.errors
        m = scrape(router.url)
        assert metric(m, "kvemu_router_replica_busy_total") >= 1
        assert metric(m, "kvemu_router_replica_failures_total") == 0
        view = http_json("GET", router.url + "/cluster")[1]
        assert {r["replica_id"]: r["healthy"] for r in view["replicas"]} == {"busy": True, "calm": True}
        assert metric(m, "kvemu_router_event_gaps_total") == 0  # never cleared: its entries stayed
    finally:
        stop_all(router, busy, calm)


def test_when_every_replica_is_busy_the_client_gets_503_with_retry_after():
    rep = start_replica("--max-running", "1", "--max-waiting", "1", time_scale=1.0, replica_id="only")
    router = None
    try:
        router = start_router([rep.url])
        bodies = [{"token_ids": list(range(i * 1000, i * 1000 + 64)), "max_tokens": 200} for i in range(8)]
        result = run_load(router.url, bodies, concurrency=8)
        assert set(result.outcomes) <= {"200", "503+retry-after"}
        assert result.outcomes["503+retry-after"] >= 1 and result.outcomes["200"] >= 2
        m = scrape(router.url)
        assert metric(m, "kvemu_router_replica_failures_total") == 0
        assert metric(m, "kvemu_router_requests_total", outcome="busy") == result.outcomes["503+retry-after"]
        wait_for(lambda: http_json("GET", router.url + "/health")[1]["healthy_replicas"] == 1, timeout=2)
    finally:
        stop_all(router, rep)
