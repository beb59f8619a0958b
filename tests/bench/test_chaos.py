"""The short resilience suite (``bench/chaos.py --short``) with what kvemu promises under each
fault (docs/reliability.md): nothing lost on a replica SIGKILL or a Redis restart, at most
the in-flight requests on a router worker kill, overload answered 503 + Retry-After without
taking replicas out, slow clients (senders and readers) cut at the deadline, huge prompts not stalling /health,
and replica RSS flat over the soak's last half."""

import json
import subprocess
import sys

import pytest

from tests.support.procs import REPO


@pytest.mark.slow
def test_short_chaos_suite_keeps_the_promises():
    out = subprocess.run([sys.executable, "bench/chaos.py", "--short"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)["scenarios"]
    for name in ("replica_kill_memory", "replica_kill_redis", "redis_restart", "slow_clients", "big_prompts"):
        assert s[name]["sent"] == 120 and s[name]["failed"] == 0, (name, s[name]["failed_by_cause"])
    assert s["replica_kill_memory"]["index_consistent_s"] < 2.0
    assert s["replica_kill_redis"]["index_consistent_s"] < 2.0
    assert s["router_kill"]["failed"] <= 8, s["router_kill"]["failed_by_cause"]  # in flight at 40 req/s
    busy = s["busy_replicas"]
    assert busy["router_replica_failures"] == 0 and busy["router_replica_busy"] > 0
    assert set(busy["failed_by_cause"]) <= {"http_503"}
    assert s["slow_clients"]["router_slow_connections"] == 100
    assert s["slow_clients"]["router_cut_within_s_max"] < 4.0 and s["slow_clients"]["replica_cut_within_s_max"] < 4.0
    # readers of long streams that read nothing: cut once the buffers are full and 2 s have passed (30 s: never)
    assert s["slow_clients"]["router_reader_cut_within_s_max"] < 20 and s["slow_clients"]["replica_reader_cut_within_s_max"] < 20
    assert s["big_prompts"]["health_ms_max"] < 300
    assert s["soak"]["failed"] == 0 and s["soak"]["replica_rss_flat"]
    # two router workers, one count: every scrape says every request, whichever worker answers it
    assert s["soak"]["workers"] == 2 and s["soak"]["router_requests_total"] == [s["soak"]["sent"]] * 3
