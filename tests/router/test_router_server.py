"""The router as a real process in front of real replica processes, over real HTTP.

Proxying (JSON, msgpack, OpenAI, SSE), session affinity, input validation at the router,
cache-aware routing with the embedded index and its metrics, graceful shutdown and the
command line. Failover and the Redis index: test_router_failover.py; hotspots:
test_router_hotspots.py.
"""

import itertools
import json
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from tests.support.cluster import (
    generate,
    metric,
    scrape,
    sse_events,
    start_router,
    stop_all,
    wait_for,
    wait_indexed,
)
from tests.support.procs import REPO, http, http_json, start_replica

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

IDS = ("pA", "pB", "pC")
_bases = itertools.count(1)


def fresh_tokens(n: int) -> list[int]:
    """Token ids no other test (or earlier request) has used: no accidental cache hits."""
    base = next(_bases) * 10_000_000
    return list(range(base, base + n))


@pytest.fixture(scope="module")
def replicas():
    procs = []
    try:
        for rid in IDS:
            procs.append(start_replica(capacity_blocks=2000, replica_id=rid))
        yield procs
    finally:
        stop_all(*procs)


@pytest.fixture(scope="module")
def router(replicas):
    proc = start_router([r.url for r in replicas], routing="cache_aware")
    yield proc
    assert proc.stop() == 0


def replica_totals(replicas) -> tuple[int, dict]:
    """Requests the replicas finished, and the fields they rejected, summed over all three."""
    finished, rejected = 0, {}
    for r in replicas:
        st = http_json("GET", r.url + "/stats")[1]
        finished += st["scheduler"]["finished"]
        for k, v in st["rejected_by_field"].items():
            rejected[k] = rejected.get(k, 0) + v
    return finished, rejected


# ---- proxying --------------------------------------------------------------------------------
def test_generate_json_and_msgpack_through_the_router(router):
    status, headers, out = generate(router.url, fresh_tokens(100), max_tokens=3)
    assert status == 200, out
    assert headers["X-Kvemu-Replica"] in IDS and out["replica_id"] == headers["X-Kvemu-Replica"]
    assert headers["X-Kvemu-Route-Reason"] == "cache_miss_balance"
    assert out["prompt_tokens"] == 100 and out["output_tokens"] == 3 and out["prompt_blocks"] == 6

    raw = msgpack.packb({"block_hashes": [7001, 7002, 7003], "input_tokens": 50, "max_tokens": 2})
    status, headers, data = http("POST", router.url + "/generate", raw=raw,
                                 headers={"Content-Type": "application/msgpack"})
    assert status == 200 and headers["Content-Type"].startswith("application/msgpack")
    out = msgpack.unpackb(data)
    assert out["prompt_tokens"] == 50 and out["prompt_blocks"] == 3 and out["output_tokens"] == 2
    assert headers["X-Kvemu-Replica"] == out["replica_id"]


def test_openai_completions_and_chat_through_the_router(router):
    prompt = "router test completion prompt " * 12
    status, headers, data = http("POST", router.url + "/v1/completions", {"prompt": prompt, "max_tokens": 4})
    out = json.loads(data)
    assert status == 200 and out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["text"]
    assert headers["X-Kvemu-Replica"] == out["kvemu"]["replica_id"]
    assert headers["X-Kvemu-Route-Reason"] in ("cache_miss_balance", "cache_hit")

    msgs = [{"role": "system", "content": "router chat system prompt " * 10}, {"role": "user", "content": "hi"}]
    status, headers, data = http("POST", router.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    out = json.loads(data)
    assert status == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] == 2
    assert headers["X-Kvemu-Replica"] == out["kvemu"]["replica_id"]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "stream me through the router " * 5, "max_tokens": 5, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "stream through the router"}],
                              "max_tokens": 5, "stream": True}),
])
def test_streaming_is_passed_through_as_sse(router, path, body):
    status, headers, data = http("POST", router.url + path, body)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["X-Kvemu-Replica"] in IDS and headers["X-Kvemu-Route-Reason"]
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-1]
    assert chunks[-1]["kvemu"]["replica_id"] == headers["X-Kvemu-Replica"]


def test_session_affinity_from_header_and_openai_user(replicas):
    router = start_router([r.url for r in replicas], routing="session")
    try:
        seen: dict[str, set] = {}
        reasons: dict[str, list] = {}
        history = {s: fresh_tokens(100) for s in range(6)}  # each turn extends the session's prompt
        for turn in range(4):
            for s in range(6):
                sid = f"hdr-session-{s}"
                status, headers, out = generate(router.url, history[s][:40 + turn * 16], max_tokens=1,
                                                headers={"X-Session-Id": sid})
                assert status == 200
                assert out["cached_tokens"] == (0 if turn == 0 else (40 + (turn - 1) * 16) // 16 * 16)
                seen.setdefault(sid, set()).add(headers["X-Kvemu-Replica"])
                reasons.setdefault(sid, []).append(headers["X-Kvemu-Route-Reason"])
                user = f"openai-user-{s}"
                status, headers, _ = http("POST", router.url + "/v1/completions",
                                          {"prompt": f"turn {turn} of {user} " * 8, "max_tokens": 1, "user": user})
                assert status == 200
                seen.setdefault(user, set()).add(headers["X-Kvemu-Replica"])
                reasons.setdefault(user, []).append(headers["X-Kvemu-Route-Reason"])
        for sid, where in seen.items():
            assert len(where) == 1, (sid, where)  # every turn of a session on one replica
            assert reasons[sid] == ["session_new"] + ["session_sticky"] * 3, (sid, reasons[sid])
        # 12 sessions on a consistent-hash ring of 3 replicas do not all land on one
        assert len(set().union(*seen.values())) >= 2

        # the header wins over the body's user field
        status, headers, _ = http("POST", router.url + "/v1/completions",
                                  {"prompt": "header beats user", "max_tokens": 1, "user": "someone-else"},
                                  headers={"X-Session-Id": "hdr-session-0"})
        assert status == 200 and headers["X-Kvemu-Replica"] in seen["hdr-session-0"]
        assert headers["X-Kvemu-Route-Reason"] == "session_sticky"
        # without a session id the session strategy balances by load
        status, headers, _ = generate(router.url, fresh_tokens(20))
        assert status == 200 and headers["X-Kvemu-Route-Reason"] == "no_session"
        text = http("GET", router.url + "/metrics")[2].decode()
        assert 'kvemu_router_decisions_total{reason="session_sticky",strategy="session"}' in text
        # The session strategy never consults the index: no prediction is scored (sticky turns
        # do hit the cache, and used to count as 100% prediction error).
        m = scrape(router.url)
        for name in ("kvemu_router_predicted_cached_tokens_total", "kvemu_router_actual_cached_tokens_total",
                     "kvemu_router_prediction_abs_error_tokens_total", "kvemu_router_index_lookup_seconds_count"):
            assert metric(m, name) == 0, name
    finally:
        assert router.stop() == 0


# ---- bad input: a 4xx naming the field, decided at the router ---------------------------------
BAD = [
    ("/generate", b"{nope", "application/json", 400, "body"),
    ("/generate", b"", "application/json", 400, "body"),
    ("/generate", b"[1, 2]", "application/json", 400, "body"),
    ("/generate", b"\xc1\xff", "application/msgpack", 400, "body"),
    ("/generate", json.dumps({"token_ids": "abc"}).encode(), "application/json", 400, "token_ids"),
    ("/generate", json.dumps({"token_ids": [1, 2.5]}).encode(), "application/json", 400, "token_ids[1]"),
    ("/generate", json.dumps({"token_ids": [1], "max_tokens": "3"}).encode(), "application/json", 400, "max_tokens"),
    ("/generate", json.dumps({"token_ids": [1], "stream": "yes"}).encode(), "application/json", 400, "stream"),
    ("/generate", json.dumps({"block_hashes": [2**64]}).encode(), "application/json", 400, "block_hashes[0]"),
    ("/generate", msgpack.packb({"token_ids": [1], "max_tokens": -1}), "application/msgpack", 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": 5}).encode(), "application/json", 400, "prompt"),
    ("/v1/completions", json.dumps({"max_tokens": 2}).encode(), "application/json", 400, "prompt"),
    ("/v1/completions", json.dumps({"prompt": "x", "user": 12}).encode(), "application/json", 400, "user"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(),
     "application/json", 400, "messages[0].role"),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), "application/json", 400, "messages"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "stream_options": 3}).encode(),
     "application/json", 400, "stream_options"),
]


def test_bad_input_gets_a_4xx_naming_the_field_and_never_reaches_a_replica(router, replicas):
    before = replica_totals(replicas)
    requests_before = metric(scrape(router.url), "kvemu_router_decisions_total")
    for path, raw, ctype, status_want, field in BAD:
        status, headers, data = http("POST", router.url + path, raw=raw, headers={"Content-Type": ctype})
        assert status == status_want, (path, raw, data)
        assert headers["Content-Type"].startswith("application/json")
        err = json.loads(data)["error"]
        assert err["param"] == field, (path, raw, err)
        assert err["code"] == status_want and err["message"]
        assert "X-Kvemu-Replica" not in headers
    # a session id longer than the limit, and a body over the router's size limit
    status, _, data = http("POST", router.url + "/generate", {"token_ids": [1]}, headers={"X-Session-Id": "s" * 300})
    assert status == 400 and json.loads(data)["error"]["param"] == "X-Session-Id"
    huge = b'{"token_ids": [' + b"1," * (4_500_000) + b"1]}"
    status, _, data = http("POST", router.url + "/generate", raw=huge, headers={"Content-Type": "application/json"})
    assert status == 413 and json.loads(data)["error"]["param"] == "body"
    # wrong method and unknown path: JSON errors too, not HTML
    status, _, data = http("GET", router.url + "/generate")
    assert status == 405 and json.loads(data)["error"]["code"] == 405
    status, _, data = http("POST", router.url + "/v2/nothing", {"x": 1})
    assert status == 404 and json.loads(data)["error"]["code"] == 404

    assert replica_totals(replicas) == before  # no replica served or rejected anything
    assert metric(scrape(router.url), "kvemu_router_decisions_total") == requests_before  # nothing was routed
    # and the router is still fine
    assert generate(router.url, fresh_tokens(30))[0] == 200


# ---- cache-aware routing with the embedded index ----------------------------------------------
def test_cache_aware_sends_a_repeat_and_its_extension_to_the_holder(router, replicas):
    tokens = fresh_tokens(200)  # 12 full blocks + an 8-token tail
    m0 = scrape(router.url)
    status, headers, first = generate(router.url, tokens)
    assert status == 200 and first["cached_tokens"] == 0
    assert headers["X-Kvemu-Route-Reason"] == "cache_miss_balance"
    holder = headers["X-Kvemu-Replica"]
    wait_indexed(router.url, [r.url for r in replicas])

    m1 = scrape(router.url)
    status, headers, again = generate(router.url, tokens)
    assert status == 200
    assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == (holder, "cache_hit")
    assert again["cached_tokens"] == 192 and again["cached_blocks"] == 12

    longer = tokens + fresh_tokens(100)  # 18 full blocks, the first 12 cached
    status, headers, ext = generate(router.url, longer)
    assert status == 200
    assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == (holder, "cache_hit")
    assert ext["cached_tokens"] == 192 and ext["prompt_blocks"] == 18

    m2 = scrape(router.url)
    predicted = metric(m2, "kvemu_router_predicted_cached_tokens_total") - metric(
        m1, "kvemu_router_predicted_cached_tokens_total")
    actual = metric(m2, "kvemu_router_actual_cached_tokens_total") - metric(
        m1, "kvemu_router_actual_cached_tokens_total")
    assert predicted == actual == 2 * 192
    assert metric(m2, "kvemu_router_prediction_abs_error_tokens_total") == metric(
        m1, "kvemu_router_prediction_abs_error_tokens_total")
    hits = metric(m2, "kvemu_router_decisions_total", strategy="cache_aware", reason="cache_hit") - metric(
        m1, "kvemu_router_decisions_total", strategy="cache_aware", reason="cache_hit")
    assert hits == 2
    assert metric(m2, "kvemu_router_decisions_total", strategy="cache_aware", reason="cache_miss_balance") >= 1
    lookups = metric(m2, "kvemu_router_index_lookup_seconds_count") - metric(
        m0, "kvemu_router_index_lookup_seconds_count")
    assert lookups == 3  # one per routed request, timed
    assert metric(m2, "kvemu_router_index_lookup_seconds_sum") > 0
    assert metric(m2, "kvemu_router_index_lookup_seconds_bucket", le="0.1") == metric(
        m2, "kvemu_router_index_lookup_seconds_count")
    assert metric(m2, "kvemu_router_events_applied_total") > metric(m0, "kvemu_router_events_applied_total")
    assert metric(m2, "kvemu_router_load_only_decisions_total") == 0
    assert metric(m2, "kvemu_router_replica_healthy") == 3


def test_cache_aware_openai_usage_shows_cached_tokens(router, replicas):
    msgs = [{"role": "system", "content": "a long shared system prompt for cache reuse " * 12},
            {"role": "user", "content": "question one"}]
    status, headers, data = http("POST", router.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    assert status == 200
    holder = headers["X-Kvemu-Replica"]
    wait_indexed(router.url, [r.url for r in replicas])
    status, headers, data = http("POST", router.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    out = json.loads(data)
    assert (headers["X-Kvemu-Replica"], headers["X-Kvemu-Route-Reason"]) == (holder, "cache_hit")
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == out["usage"]["prompt_tokens"] // 16 * 16 > 0


def test_cluster_view(router):
    status, view = http_json("GET", router.url + "/cluster")
    assert status == 200 and view["routing"] == "cache_aware" and view["healthy"] == 3
    assert {r["replica_id"] for r in view["replicas"]} == set(IDS)
    for row in view["replicas"]:
        assert row["healthy"] and row["in_flight"] == 0 and row["hotspot"] is False
    assert set(view["imbalance"]) == {"in_flight", "kv_usage", "routed"}
    assert view["hotspots"] == []
    status, health = http_json("GET", router.url + "/health")
    assert status == 200 and health["healthy_replicas"] == 3 and health["index"] == "memory"


# ---- graceful shutdown and the command line ---------------------------------------------------
def test_sigterm_lets_the_request_in_flight_finish_and_exits_0():
    replica = start_replica(capacity_blocks=500, time_scale=1.0, replica_id="slow")
    router = None
    try:
        router = start_router([replica.url])
        result = {}

        def call():
            result["out"] = generate(router.url, list(range(64)), max_tokens=60, timeout=30)

        t = threading.Thread(target=call)
        t.start()
        wait_for(lambda: http_json("GET", router.url + "/cluster")[1]["replicas"][0]["in_flight"] == 1,
                 timeout=5, interval=0.01, what="the request in flight")
        t0 = time.monotonic()
        router.proc.send_signal(signal.SIGTERM)
        t.join(30)
        status, headers, out = result["out"]
        assert status == 200 and out["output_tokens"] == 60 and headers["X-Kvemu-Replica"] == "slow"
        assert router.proc.wait(30) == 0
        assert time.monotonic() - t0 < 20
        # a request after the shutdown is refused at the socket, not half-answered
        with pytest.raises(OSError):
            http("POST", router.url + "/generate", {"token_ids": [1], "max_tokens": 1}, timeout=2)
    finally:
        stop_all(router, replica)


BAD_COMMAND_LINES = [
    (["--replicas", ""], "replicas"),
    (["--replicas", "http://127.0.0.1:9,http://127.0.0.1:9"], "replicas"),
    (["--replicas", "http://127.0.0.1:9", "--routing", "nope"], "routing strategy 'nope'"),
    (["--replicas", "http://127.0.0.1:9", "--index", "mongodb://x"], "index"),
    (["--replicas", "http://127.0.0.1:9", "--index", "redis://127.0.0.1:9/0?bogus=1"], "bogus"),
    (["--replicas", "http://127.0.0.1:9", "--set", "bounded_load_factor=0.5"], "bounded_load_factor"),
    ([], "--replicas"),
]


def test_bad_command_lines_exit_2_with_one_error_line():
    # all at once: each is a Python start-up, and they do not interfere
    procs = [(args, needle, subprocess.Popen([sys.executable, "-m", "kvemu", "router", *args], cwd=REPO, text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE))
             for args, needle in BAD_COMMAND_LINES]
    for args, needle, proc in procs:
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 2, (args, err)
        assert "Traceback" not in err, (args, err)
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and needle in errors[0], (args, err)
