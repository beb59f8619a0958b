"""The adaptive policy on a live replica: chosen over /admin/policy or on the command line, its
decisions visible in /stats and counted in /metrics."""

import pytest

from tests.support.procs import http, http_json, start_replica

pytestmark = pytest.mark.slow  # real processes on loopback

ADMIN = {"Authorization": "Bearer secret"}


def _traffic(url: str, n: int) -> None:
    for k in range(n):
        http_json("POST", url + "/generate", {"token_ids": list(range(k % 3 * 1000, k % 3 * 1000 + 64)),
                                              "max_tokens": 2})


def test_admin_policy_to_adaptive_then_stats_and_metrics_show_decisions():
    proc = start_replica(capacity_blocks=64)
    try:
        _traffic(proc.url, 3)
        before = http_json("GET", proc.url + "/stats")[1]["resident_blocks"]
        status, out = http_json("POST", proc.url + "/admin/policy",
                                {"policy": "adaptive", "params": {"interval_s": 1e-6, "candidates": "lru,s3fifo,arc"}},
                                headers=ADMIN)
        assert status == 200 and out["policy"]["name"] == "adaptive" and out["resident_blocks"] == before
        status, out = http_json("POST", proc.url + "/admin/policy",
                                {"policy": "adaptive", "params": {"margin": -1}}, headers=ADMIN)
        assert status == 400 and out["error"]["param"] == "margin"
        _traffic(proc.url, 8)
        pol = http_json("GET", proc.url + "/stats")[1]["policy"]
        assert pol["name"] == "adaptive" and pol["decisions"]
        dec = pol["decisions"][-1]
        assert set(dec["hit_ratio"]) == {"lru", "s3fifo", "arc"} and dec["winner"] in dec["hit_ratio"]
        assert sum(pol["decision_counts"].values()) == len(pol["decisions"])
        text = http("GET", proc.url + "/metrics")[2].decode()
        assert "kvemu_policy_switches_total{model_name=" in text
        for name in ("lru", "s3fifo", "arc"):
            assert f'kvemu_policy_decisions_total{{chosen="{name}",' in text
    finally:
        assert proc.stop() == 0


def test_replica_starts_on_adaptive_from_the_command_line():
    proc = start_replica("--policy", "adaptive", "--policy-param", "interval_s=0.000001",
                         "--policy-param", "adapt_interval=true", capacity_blocks=64)
    try:
        _traffic(proc.url, 5)
        pol = http_json("GET", proc.url + "/stats")[1]["policy"]
        assert pol["adapt_interval"] is True and pol["current"] in ("lru", "s3fifo") and pol["decisions"]
    finally:
        assert proc.stop() == 0
