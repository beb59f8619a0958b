"""Failures under load, all real: a replica SIGKILLed with requests in flight, restarted on
the same port; a Redis index that goes away and comes back. Nothing may be lost: every
request is answered 200, or 503 with Retry-After."""

import json
import os
import signal
import threading
import time
import uuid

import pytest

from shared.hashing import block_hashes
from tests.conftest import RedisServer, free_port
from tests.support.cluster import (
    cluster_row,
    generate,
    metric,
    redis_lookup,
    scrape,
    sse_events,
    start_load,
    start_router,
    stop_all,
    wait_for,
    wait_indexed,
)
from tests.support.procs import Proc, http, http_json, start_replica

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow


def ok_outcomes(result) -> None:
    """Every request answered 200 or 503+Retry-After; nothing else, no client-side error."""
    bad = {k: v for k, v in result.outcomes.items() if k not in ("200", "503+retry-after")}
    assert not bad, (dict(result.outcomes), result.errors)


@pytest.mark.parametrize("index", ["memory", "redis"])
def test_sigkill_a_replica_under_load_loses_nothing_and_it_rejoins_clean(index, redis_server):
    cluster = "fo" + uuid.uuid4().hex[:8]
    ids = ("fA", "fB", "fC")
    rep_args = ("--index", redis_server.url, "--cluster", cluster) if index == "redis" else ()
    reps, router = [], None
    try:
        for rid in ids:
            reps.append(start_replica(*rep_args, capacity_blocks=4000, time_scale=1.0, replica_id=rid))
        extra = ("--cluster", cluster) if index == "redis" else ()
        router = start_router([r.url for r in reps], *extra,
                              index="memory" if index == "memory" else redis_server.url)

        # A marker prompt served (and cached) by the replica we are going to kill.
        marker = list(range(900_000, 900_000 + 160))  # 10 full blocks
        marker_hashes = block_hashes(marker)
        status, headers, _ = generate(router.url, marker)
        assert status == 200
        victim_id = headers["X-Kvemu-Replica"]
        victim = reps[ids.index(victim_id)]
        if index == "redis":
            wait_for(lambda: redis_lookup(redis_server.url, cluster, marker_hashes).get(victim_id) == 10,
                     what="the marker in the Redis index")
        else:
            wait_indexed(router.url, [r.url for r in reps])
        status, headers, _ = generate(router.url, marker)
        assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == (victim_id, "cache_hit")

        # Load: 72 requests, 12 at a time, each ~25 decode steps (~0.4 s of wall time).
        bodies = [{"token_ids": list(range(i * 1000, i * 1000 + 64 + 16 * (i % 5))), "max_tokens": 25}
                  for i in range(1, 73)]
        m0 = scrape(router.url)
        thread, result = start_load(router.url, bodies, concurrency=12, timeout=60)
        # Kill only once the victim has requests in flight, mid-run.
        wait_for(lambda: result.started >= 24 and cluster_row(router.url, victim_id)["in_flight"] >= 2,
                 timeout=20, interval=0.02, what="requests in flight on the victim")
        in_flight_at_kill = cluster_row(router.url, victim_id)["in_flight"]
        victim.stop(signal.SIGKILL)
        thread.join(90)
        assert not thread.is_alive()
        ok_outcomes(result)
        assert sum(result.outcomes.values()) == len(bodies)
        m1 = scrape(router.url)
        retries = metric(m1, "kvemu_router_retries_total") - metric(m0, "kvemu_router_retries_total")
        print(f"\n[{index}] outcomes {dict(result.outcomes)}, by replica {dict(result.replicas)}, "
              f"in flight on {victim_id} at kill: {in_flight_at_kill}, retries: {retries}")
        assert retries >= 1  # the victim's in-flight requests were answered elsewhere
        assert metric(m1, "kvemu_router_replica_failures_total") >= 1

        # The router took it out, and forgot what it held.
        row = cluster_row(router.url, victim_id)
        assert row["healthy"] is False and row["in_flight"] == 0
        assert metric(m1, "kvemu_router_replica_healthy", replica_id=victim_id) == 0
        if index == "redis":
            assert victim_id not in redis_lookup(redis_server.url, cluster, marker_hashes)
        status, headers, out = generate(router.url, marker)  # served elsewhere, from scratch
        assert status == 200 and headers["X-Kvemu-Replica"] != victim_id and out["cached_tokens"] == 0
        assert headers["X-Kvemu-Route-Reason"] == "cache_miss_balance"
        survivor = headers["X-Kvemu-Replica"]

        # Restart on the same port with the same id: a new epoch, an empty cache.
        m2 = scrape(router.url)
        reps[ids.index(victim_id)] = start_replica(*rep_args, capacity_blocks=4000, time_scale=1.0,
                                                   replica_id=victim_id, port=victim.port)
        wait_for(lambda: cluster_row(router.url, victim_id)["healthy"], timeout=10, what="the victim rejoining")
        if index == "redis":
            assert victim_id not in redis_lookup(redis_server.url, cluster, marker_hashes)
        # Nothing predicts the marker on the restarted replica: only the survivor holds it.
        wait_for(lambda: cluster_row(router.url, survivor)["event_lag"] == 0, what="the survivor's events applied")
        m3 = scrape(router.url)
        assert metric(m3, "kvemu_router_replica_restarts_total") - metric(
            m2, "kvemu_router_replica_restarts_total") == 1  # the new epoch was noticed
        status, headers, out = generate(router.url, marker)
        assert status == 200
        assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == (survivor, "cache_hit")
        assert out["cached_tokens"] == 144  # all 10 blocks held; a prompt cached whole recomputes its last (vLLM)
        m4 = scrape(router.url)
        assert metric(m4, "kvemu_router_predicted_cached_tokens_total") - metric(
            m3, "kvemu_router_predicted_cached_tokens_total") == 144  # what the replica gives
        assert metric(m4, "kvemu_router_prediction_abs_error_tokens_total") == metric(
            m2, "kvemu_router_prediction_abs_error_tokens_total")
        # The rejoined replica takes traffic again (a prompt nobody holds, sent until it lands there).
        for i in range(30):
            status, headers, out = generate(router.url, list(range(5_000_000 + i * 100, 5_000_000 + i * 100 + 40)))
            assert status == 200
            if headers["X-Kvemu-Replica"] == victim_id:
                assert out["cached_tokens"] == 0
                break
        else:
            raise AssertionError("the restarted replica never got a request")
        assert http_json("GET", router.url + "/health")[1]["healthy_replicas"] == 3
    finally:
        stop_all(router, *reps)


def test_redis_outage_routes_on_load_then_cache_aware_resumes():
    redis = RedisServer()
    redis.start()
    cluster = "out" + uuid.uuid4().hex[:8]
    reps, router = [], None
    try:
        for rid in ("oA", "oB"):
            reps.append(start_replica("--index", redis.url, "--cluster", cluster, capacity_blocks=2000,
                                      replica_id=rid))
        router = start_router([r.url for r in reps], "--cluster", cluster, index=redis.url)
        assert http_json("GET", router.url + "/health")[1]["index"] == "redis"

        prompt = list(range(700_000, 700_000 + 170))  # 10 full blocks
        hashes = block_hashes(prompt)
        status, headers, _ = generate(router.url, prompt)
        holder = headers["X-Kvemu-Replica"]
        wait_for(lambda: redis_lookup(redis.url, cluster, hashes).get(holder) == 10, what="the prompt indexed")
        status, headers, out = generate(router.url, prompt)
        assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == (holder, "cache_hit")
        assert out["cached_tokens"] == 160

        m0 = scrape(router.url)
        redis.stop()
        served = []
        for i in range(12):
            status, headers, out = generate(router.url, prompt if i % 3 == 0 else list(range(i * 500, i * 500 + 60)),
                                            timeout=10)
            assert status == 200, out
            served.append(headers["X-Kvemu-Route-Reason"])
        m1 = scrape(router.url)
        load_only = metric(m1, "kvemu_router_load_only_decisions_total") - metric(
            m0, "kvemu_router_load_only_decisions_total")
        errors = metric(m1, "kvemu_router_index_errors_total") - metric(m0, "kvemu_router_index_errors_total")
        print(f"\nduring the outage: reasons {served}, load-only decisions {load_only}, index errors {errors}")
        assert load_only == 12 and errors >= 12
        for name in ("kvemu_router_predicted_cached_tokens_total", "kvemu_router_actual_cached_tokens_total",
                     "kvemu_router_prediction_abs_error_tokens_total"):
            assert metric(m1, name) == metric(m0, name), name  # no lookup, no prediction to score
        assert "cache_hit" not in served  # no index, no cache-aware claim
        assert http_json("GET", router.url + "/health")[0] == 200

        redis.start()  # same port, empty: the replicas' resync must rebuild the index
        wait_for(lambda: redis_lookup(redis.url, cluster, hashes).get(holder) == 10, timeout=20,
                 what="the replicas' resync after the restart")

        def routed_cache_aware():
            before = metric(scrape(router.url), "kvemu_router_load_only_decisions_total")
            generate(router.url, list(range(9_000_000, 9_000_000 + 40)))
            return metric(scrape(router.url), "kvemu_router_load_only_decisions_total") == before

        wait_for(routed_cache_aware, timeout=10, what="index lookups working again")
        status, headers, out = generate(router.url, prompt)
        assert status == 200 and headers["X-Kvemu-Route-Reason"] == "cache_hit"
        holders = redis_lookup(redis.url, cluster, hashes)
        assert headers["X-Kvemu-Replica"] in holders and out["cached_tokens"] == 160
    finally:
        stop_all(router, *reps)
        redis.stop()


def test_no_healthy_replica_is_a_503_with_retry_after_until_one_comes_up():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router_port = free_port()
    router = Proc(["-m", "kvemu", "router", "--port", str(router_port), "--replicas", url, "--health-interval", "0.2"],
                  router_port)
    replica = None
    try:
        # The router starts even though its only replica is not up yet; /health says so.
        wait_for(lambda: http("GET", router.url + "/health", timeout=1)[0] == 503, timeout=20,
                 what="the router answering /health")
        status, body = http_json("GET", router.url + "/health")
        assert status == 503 and body["healthy_replicas"] == 0
        for path, body in (("/generate", {"token_ids": [1, 2, 3]}), ("/v1/completions", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True})):
            status, headers, data = http("POST", router.url + path, body)
            assert status == 503 and int(headers["Retry-After"]) >= 1, (path, status, data)
            assert headers["Content-Type"].startswith("application/json")
        text = http("GET", router.url + "/metrics")[2].decode()
        assert 'kvemu_router_requests_total{outcome="unavailable"} 3.0' in text

        replica = start_replica(capacity_blocks=200, port=port, replica_id="late")
        wait_for(lambda: http_json("GET", router.url + "/health")[0] == 200, timeout=10, what="the replica joining")
        status, headers, out = generate(router.url, [1, 2, 3])
        assert status == 200 and headers["X-Kvemu-Replica"] == "late"

        replica.stop(signal.SIGKILL)  # the only replica dies: 503 again, never a hang or a 500
        status, headers, _ = generate(router.url, [4, 5, 6], timeout=10)
        assert status == 503 and headers["Retry-After"]
        wait_for(lambda: not cluster_row(router.url, "late")["healthy"], timeout=5, what="the replica taken out")
    finally:
        stop_all(router, replica)


def test_a_stream_cut_by_a_dying_replica_ends_with_an_in_band_error():
    # a dense 70B model decodes ~30 ms a token on an H200: 80 tokens take ~2.4 s, so the kill
    # lands mid-stream (the default MoE preset would finish them in ~0.15 s)
    reps = [start_replica("--model", "llama-3-70b", capacity_blocks=500, time_scale=1.0, replica_id=rid)
            for rid in ("sA", "sB")]
    router = None
    try:
        router = start_router([r.url for r in reps], routing="round_robin")
        results = {}

        def call(k):
            results[k] = http("POST", router.url + "/v1/completions",
                              {"prompt": "stream until the replica dies " * 4, "max_tokens": 80, "stream": True,
                               "stream_options": {"include_usage": True}},
                              timeout=30)

        threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: all(cluster_row(router.url, rid)["in_flight"] == 1 for rid in ("sA", "sB")), timeout=5,
                 interval=0.02, what="one stream on each replica")
        time.sleep(0.2)  # some chunks are out
        reps[0].stop(signal.SIGKILL)
        for t in threads:
            t.join(30)
        by_replica = {h["X-Kvemu-Replica"]: (s, sse_events(d)) for s, h, d in results.values()}
        status, events = by_replica["sA"]
        # the client is told, as OpenAI's API tells it, then [DONE]: an SDK raises the error, a reader stops
        assert status == 200 and json.loads(events[-2]) == CUT and events[-1] == "[DONE]"
        assert len(events) >= 4  # it had streamed some chunks before, each whole
        assert all(json.loads(e)["choices"][0]["text"] for e in events[:-2])
        status, events = by_replica["sB"]
        assert status == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 80
        text = http("GET", router.url + "/metrics")[2].decode()
        assert 'kvemu_router_requests_total{outcome="failed_mid_stream"} 1.0' in text
    finally:
        stop_all(router, *reps)


CUT = {"error": {"message": "the replica serving this stream failed before it ended; the answer is incomplete: send"
                            " the request again", "type": "server_error", "param": None, "code": 502}}


def test_a_frozen_replica_is_given_up_after_the_first_byte_timeout_and_a_slow_one_is_not():
    # a dense 70B model decodes ~30 ms a token on an H200 (time scale 1): 60 tokens take ~1.8 s
    reps = [start_replica("--model", "llama-3-70b", capacity_blocks=500, time_scale=1.0, replica_id=rid)
            for rid in ("zA", "zB")]
    router = None
    try:
        router = start_router([r.url for r in reps], "--upstream-first-byte-timeout", "0.4")
        marker = list(range(600_000, 600_000 + 160))
        m0 = scrape(router.url)
        t0 = time.monotonic()
        status, headers, out = generate(router.url, marker, max_tokens=60)
        took = time.monotonic() - t0
        # slower than the timeout, but its replica answers /health all along: waited for, not retried
        assert status == 200 and out["output_tokens"] == 60 and took > 3 * 0.4, took
        victim_id = headers["X-Kvemu-Replica"]
        victim, other = (reps[0], reps[1]) if victim_id == "zA" else (reps[1], reps[0])
        wait_indexed(router.url, [r.url for r in reps])  # the marker routes to the victim (cache_hit)
        assert metric(scrape(router.url), "kvemu_router_retries_total") == metric(m0, "kvemu_router_retries_total")

        os.kill(victim.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        status, headers, out = generate(router.url, marker, max_tokens=1, timeout=10)
        took = time.monotonic() - t0
        print(f"\nfrozen replica: answered by {headers.get('X-Kvemu-Replica')} after {took:.2f} s")
        assert status == 200 and headers["X-Kvemu-Replica"] != victim_id
        # the timeout, then a probe of /health that times out (1 s), then the other replica: nothing near the freeze
        assert 0.4 + 1.0 <= took < 0.4 + 1.0 + 1.5, took
        assert metric(scrape(router.url), "kvemu_router_retries_total") == metric(m0, "kvemu_router_retries_total") + 1
        assert cluster_row(router.url, victim_id)["healthy"] is False  # set aside
    finally:
        for r in reps:
            os.kill(r.proc.pid, signal.SIGCONT)
        stop_all(router, *reps)


def test_a_stream_whose_replica_freezes_ends_with_an_error_the_openai_sdk_raises():
    import openai

    reps = [start_replica("--model", "llama-3-70b", capacity_blocks=500, time_scale=1.0, replica_id=rid)
            for rid in ("yA", "yB")]
    router = None
    try:
        router = start_router([r.url for r in reps], "--upstream-first-byte-timeout", "0.4", routing="round_robin")
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        stream = client.completions.create(model="m", prompt="stream until the replica freezes " * 4, max_tokens=150,
                                           stream=True)
        texts = [next(iter(stream)).choices[0].text]  # its first token: the stream is on a replica
        victim_id = next(rid for rid in ("yA", "yB") if cluster_row(router.url, rid)["in_flight"] == 1)
        os.kill(reps[("yA", "yB").index(victim_id)].proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                texts.append(chunk.choices[0].text)
        took = time.monotonic() - frozen
        assert err.value.message == CUT["error"]["message"] and err.value.body == CUT["error"]
        assert all(texts) and len(texts) < 150
        assert took < 0.4 + 1.0 + 1.5, took  # the timeout, a /health probe's, a little: not the 600 s total
        text = http("GET", router.url + "/metrics")[2].decode()
        assert 'kvemu_router_requests_total{outcome="failed_mid_stream"} 1.0' in text
    finally:
        for r in reps:
            os.kill(r.proc.pid, signal.SIGCONT)
        stop_all(router, *reps)


def test_router_start_asks_each_replica_for_one_resync():
    """Issue 17: the start-up check and the first health round both saw the replica as new."""
    rep = start_replica()
    try:
        router = start_router([rep.url], health_interval=0.05)
        try:
            time.sleep(0.5)  # ten health rounds
            status, st = http_json("GET", rep.url + "/stats")
            assert status == 200 and st["events"]["resync_requests"] == 1
        finally:
            router.stop()
    finally:
        rep.stop()
