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
    return {pid: cmd for pid, cmd in children_of(router.proc.pid).items() if "-m router" in cmd}


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
