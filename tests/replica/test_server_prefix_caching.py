"""--prefix-caching off on a real replica: a repeated prompt is a miss, at once or one after the other,
nothing stays cached, and its event feed gives a router's index nothing."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.procs import cluster_auth, http, http_json, start_replica

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "system", "content": "you are a helpful assistant " * 8},
                     {"role": "user", "content": "tell me about prefix caching " * 5}], "max_tokens": 20}


def cached(out: dict) -> int:
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("mode", ["off", "on"])
def test_a_repeated_prompt_is_a_miss_only_with_prefix_caching_off(mode):
    proc = start_replica("--prefix-caching", mode, capacity_blocks=500, time_scale=0.2)
    try:
        url = proc.url + "/v1/chat/completions"
        status, first = http_json("POST", url, CHAT)
        assert status == 200 and cached(first) == 0
        status, second = http_json("POST", url, CHAT)
        assert status == 200
        with ThreadPoolExecutor(2) as ex:  # two at once: with off, neither shares the other's blocks
            together = [out for status, out in ex.map(lambda _: http_json("POST", url, CHAT), range(2))]
        stats = http_json("GET", proc.url + "/stats")[1]
        assert stats["prefix_caching"] == mode and stats["requests"] == 4
        status, feed = http_json("GET", proc.url + "/kv/events?after=0", headers=cluster_auth())
        stored = [e for b in feed["batches"] for e in b["events"] if e[0] == "stored"]
        if mode == "off":
            assert cached(second) == 0 and [cached(x) for x in together] == [0, 0]
            assert stats["block_hits"] == 0 and stats["block_hit_ratio"] == 0.0
            assert stats["resident_blocks"] == 0 and stats["usage"] == 0.0 and stored == []
        else:
            assert cached(second) > 0 and stats["block_hits"] > 0 and stored
    finally:
        assert proc.stop() == 0


def test_off_with_a_tier_is_refused_in_one_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--capacity-blocks", "100", "--prefix-caching", "off",
                          "--host-cache-gib", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --prefix-caching: off keeps no KV"), out.stderr


def test_up_forwards_it_and_the_routers_index_sees_nothing():
    from tests.conftest import free_port
    from tests.support.kvemu_cli import Up

    up = Up("--replicas", "2", "--capacity-blocks", "400", "--routing", "cache_aware", "--time-scale", "0",
            "--port", str(free_port()), "--prefix-caching", "off")
    try:
        urls = up.ready()
        router = urls["router"]
        outs = []
        for _ in range(3):
            outs.append(http_json("POST", router + "/v1/chat/completions", CHAT)[1])
            time.sleep(0.5)  # the router polls the replicas' feeds in between
        assert [cached(x) for x in outs] == [0, 0, 0]
        for name in ("replica-0", "replica-1"):
            stats = http_json("GET", urls[name] + "/stats")[1]
            assert (stats["prefix_caching"], stats["block_hits"], stats["resident_blocks"]) == ("off", 0, 0), name
        status, _, data = http("GET", router + "/metrics")
        metrics = dict(line.rsplit(" ", 1) for line in data.decode().splitlines() if line.startswith("kvemu_router_"))
        # its index holds nothing (each replica's join resync is a bare "cleared"), so it predicts no hit
        assert float(metrics["kvemu_router_predicted_cached_tokens_total"]) == 0.0
        assert float(metrics["kvemu_router_actual_cached_tokens_total"]) == 0.0
    finally:
        up.cleanup()
