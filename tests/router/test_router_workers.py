"""Issue 17, item 8: several router processes on one port; killing one loses at most the
requests it was serving, and its supervisor starts a new one."""

import os
import signal
import time

import pytest

from tests.support.cluster import run_load, start_load, start_router, stop_all, wait_for
from tests.support.kvemu_cli import children_of
from tests.support.procs import http_json, start_replica


def _workers(router) -> dict[int, str]:
    return {pid: cmd for pid, cmd in children_of(router.proc.pid).items() if "-m kvemu router" in cmd}


@pytest.mark.slow
def test_two_workers_share_the_port_and_a_killed_one_is_replaced():
    reps = [start_replica(time_scale=1.0, replica_id=f"w{i}") for i in range(2)]
    router = None
    try:
        router = start_router([r.url for r in reps], "--workers", "2")
        wait_for(lambda: len(_workers(router)) == 2, what="two workers")
        pids = set(_workers(router))
        seen: set[int] = set()

        def both_answered() -> bool:  # the kernel hands new connections to either accepting worker
            seen.add(http_json("GET", router.url + "/health")[1]["pid"])
            return seen == pids

        wait_for(both_answered, timeout=20, what="both workers answering")

        bodies = [{"token_ids": list(range(i * 100, i * 100 + 64)), "max_tokens": 20} for i in range(160)]
        thread, result = start_load(router.url, bodies, concurrency=6, timeout=10)
        wait_for(lambda: result.started >= 60, timeout=20, what="load under way")
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        thread.join(60)
        assert not thread.is_alive()
        lost = sum(v for k, v in result.outcomes.items() if k != "200")
        assert lost <= 6, (dict(result.outcomes), result.errors)  # at most what was in flight (6 clients)
        assert result.outcomes["200"] >= 154

        wait_for(lambda: len(_workers(router)) == 2 and victim not in _workers(router), timeout=10,
                 what="the supervisor restarted the killed worker")
        wait_for(lambda: http_json("GET", router.url + "/health")[1]["healthy_replicas"] == 2, timeout=10)
        after = run_load(router.url, bodies[:30], concurrency=3)
        assert dict(after.outcomes) == {"200": 30}
    finally:
        stop_all(router, *reps)
    if router is not None:
        assert router.proc.returncode == 0  # SIGTERM stopped the supervisor and its workers cleanly
        time.sleep(0.2)
        assert not _workers(router)


def _scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.support.procs import http

    status, _, body = http("GET", url + "/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def _requests_total(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("kvemu_router_requests_total"))


@pytest.mark.slow
def test_every_scrape_of_two_workers_counts_the_whole_router_and_survives_a_killed_worker():
    rep = start_replica(replica_id="only")
    router = None
    try:
        router = start_router([rep.url], "--workers", "2")
        wait_for(lambda: len(_workers(router)) == 2, what="two workers")
        bodies = [{"token_ids": list(range(i * 64, i * 64 + 64)), "max_tokens": 4} for i in range(100)]
        result = run_load(router.url, bodies, concurrency=4)
        assert dict(result.outcomes) == {"200": 100}
        # six scrapes, answered by either worker: the same whole-router count every time
        scrapes = [_scrape(router.url) for _ in range(6)]
        assert [_requests_total(m) for m in scrapes] == [100.0] * 6
        assert all(m["kvemu_router_routed_total,replica_id=only"] == 100 for m in scrapes)
        assert all(m["kvemu_router_decisions_total,reason=" + _reason(m) + ",strategy=cache_aware"] == 100
                   for m in scrapes)
        assert all(m["kvemu_router_replica_in_flight,replica_id=only"] == 0 for m in scrapes)
        views = [http_json("GET", router.url + "/cluster")[1] for _ in range(4)]
        assert all(v["replicas"][0]["routed"] == 100 and v["requests"] == {"ok": 100} and v["workers"] == 2
                   for v in views)
        # a worker killed and replaced: the counters it kept stay in the total (monotone)
        victim = min(_workers(router))
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(_workers(router)) == 2 and victim not in _workers(router), timeout=15,
                 what="the killed worker replaced")
        wait_for(lambda: http_json("GET", router.url + "/health")[1]["healthy_replicas"] == 1, timeout=10)
        more = run_load(router.url, bodies[:20], concurrency=2)
        assert dict(more.outcomes) == {"200": 20}
        assert [_requests_total(_scrape(router.url)) for _ in range(4)] == [120.0] * 4
        # the dashboard (sampled once a second by whichever worker answers) counts the whole router too
        wait_for(lambda: sum(http_json("GET", router.url + "/dashboard/data")[1]["decisions"].values()) == 120,
                 timeout=10, what="the dashboard's decisions")
    finally:
        stop_all(router, rep)


def _reason(metrics: dict[str, float]) -> str:
    [key] = [k for k in metrics if k.startswith("kvemu_router_decisions_total")]
    return key.split("reason=")[1].split(",")[0]
