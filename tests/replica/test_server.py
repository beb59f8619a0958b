"""The replica as a real process on loopback, over real HTTP."""

import json
import signal
import threading
import time

import msgpack
import pytest

from tests.support.procs import cluster_auth, http, http_json, start_replica

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

ADMIN = {"Authorization": "Bearer secret"}


@pytest.fixture(scope="module")
def replica():
    proc = start_replica(capacity_blocks=64)
    yield proc
    assert proc.stop() == 0


def test_generate_json_then_cached(replica):
    body = {"token_ids": list(range(100)), "max_tokens": 4}
    status, first = http_json("POST", replica.url + "/generate", body)
    assert status == 200
    assert first["prompt_tokens"] == 100 and first["cached_tokens"] == 0 and first["prompt_blocks"] == 6
    status, again = http_json("POST", replica.url + "/generate", body)
    assert again["cached_tokens"] == 96  # 6 full blocks of 16; the 4-token tail is never reusable
    for key in ("queue_time_s", "ttft_s", "e2e_s", "wall_ttft_s", "wall_e2e_s"):
        assert again[key] >= 0
    assert again["e2e_s"] > again["ttft_s"]


def test_generate_msgpack_and_block_hashes(replica):
    raw = msgpack.packb({"block_hashes": [11, 12, 13], "input_tokens": 50, "max_tokens": 1})
    status, headers, data = http("POST", replica.url + "/generate", raw=raw,
                                 headers={"Content-Type": "application/msgpack"})
    assert status == 200 and headers["Content-Type"].startswith("application/msgpack")
    out = msgpack.unpackb(data)
    assert out["prompt_tokens"] == 50 and out["prompt_blocks"] == 3
    status, _, data = http("POST", replica.url + "/generate", raw=raw, headers={"Content-Type": "application/msgpack"})
    assert msgpack.unpackb(data)["cached_tokens"] == 48


def test_openai_completion_and_chat_usage(replica):
    prompt = "the quick brown fox jumps over the lazy dog " * 10
    status, out = http_json("POST", replica.url + "/v1/completions", {"prompt": prompt, "max_tokens": 3})
    assert status == 200 and out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] == 3
    status, out = http_json("POST", replica.url + "/v1/completions", {"prompt": prompt, "max_tokens": 3})
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == out["usage"]["prompt_tokens"] // 16 * 16 and cached > 0
    msgs = [{"role": "system", "content": "you are terse " * 20}, {"role": "user", "content": "hi"}]
    status, out = http_json("POST", replica.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2},
                            headers={"X-Session-Id": "s-1"})
    assert status == 200 and out["choices"][0]["message"]["role"] == "assistant"


def test_streaming_sends_sse_chunks_and_done(replica):
    status, headers, data = http("POST", replica.url + "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "stream please"}], "max_tokens": 5,
                                  "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [line[6:] for line in data.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert len(text.split(" ")) == 5  # pieces carry their spaces: five words, not one run-on


@pytest.mark.parametrize("body,field", [
    ({"token_ids": [1, 2], "max_tokens": -1}, "max_tokens"),
    ({"token_ids": "abc"}, "token_ids"),
    ({"token_ids": [1, 2.5]}, "token_ids[1]"),
    ({"block_hashes": [2**64]}, "block_hashes[0]"),
    ({"block_hashes": [1, 2, 1]}, "block_hashes"),
    ({"block_hashes": [1, 2], "input_tokens": 5}, "input_tokens"),
    ({"token_ids": [1], "block_hashes": [1]}, "token_ids"),
    ({"token_ids": [1], "max_tokens": 10**12}, "max_tokens"),
    ({"token_ids": [1], "stream": "yes"}, "stream"),
    ({"block_hashes": list(range(65))}, "prompt"),  # larger than the 64-block pool
])
def test_bad_generate_bodies_name_the_field(replica, body, field):
    status, out = http_json("POST", replica.url + "/generate", body)
    assert status == 400, out
    assert out["error"]["param"] == field


def test_malformed_bodies(replica):
    for raw, ctype in ((b"{nope", "application/json"), (b"\xc1\xff", "application/msgpack"), (b"", "application/json"),
                       (b"[1,2]", "application/json")):
        status, _, data = http("POST", replica.url + "/generate", raw=raw, headers={"Content-Type": ctype})
        assert status == 400 and json.loads(data)["error"]["param"] == "body"
    status, out = http_json("POST", replica.url + "/v1/chat/completions", {"messages": [{"role": "robot"}]})
    assert status == 400 and out["error"]["param"] == "messages[0].role"


def test_body_size_limit(replica):
    raw = b'{"token_ids": [' + b"1," * (5 * 1024 * 1024) + b"1]}"
    status, _, data = http("POST", replica.url + "/generate", raw=raw)
    assert status == 413 and json.loads(data)["error"]["param"] == "body"


def test_metrics_and_stats(replica):
    http_json("POST", replica.url + "/generate", {"token_ids": list(range(40)), "max_tokens": 1})
    status, _, data = http("GET", replica.url + "/metrics")
    text = data.decode()
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:kv_cache_usage_perc",
                 "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
                 "kvemu_csr", "kvemu_holes_total", "kvemu_evictions_total", "kvemu_lru_hit_ratio_at_capacity"):
        assert name in text, name
    status, st = http_json("GET", replica.url + "/stats")
    for key in ("policy", "capacity_blocks", "usage", "block_hit_ratio", "token_hit_ratio", "csr", "holes",
                "reuse", "top_sessions", "scheduler", "events", "one_hit_blocks"):
        assert key in st, key
    assert st["reuse"]["mrc"]


def test_admin_needs_the_token_and_switches_policy_keeping_blocks(replica):
    status, out = http_json("POST", replica.url + "/admin/policy", {"policy": "s3fifo"})
    assert status == 401
    status, out = http_json("POST", replica.url + "/admin/policy", {"policy": "mru"}, headers=ADMIN)
    assert status == 400 and "lru" in out["error"]["message"]
    status, out = http_json("POST", replica.url + "/admin/policy", {"policy": "belady"}, headers=ADMIN)
    assert status == 400 and out["error"]["param"] == "policy"
    before = http_json("GET", replica.url + "/stats")[1]["resident_blocks"]
    status, out = http_json("POST", replica.url + "/admin/policy", {"policy": "s3fifo"}, headers=ADMIN)
    assert status == 200 and out["resident_blocks"] == before and out["policy"]["name"] == "s3fifo"
    status, out = http_json("POST", replica.url + "/admin/reset", {}, headers=ADMIN)
    assert status == 200 and out["resident_blocks"] == 0
    http_json("POST", replica.url + "/admin/policy", {"policy": "lru"}, headers=ADMIN)


def test_event_feed_numbers_batches(replica):
    status, feed = http_json("GET", replica.url + "/kv/events?after=0", headers=cluster_auth())
    assert status == 200 and feed["batches"]
    seqs = [b["seq"] for b in feed["batches"]]
    assert seqs == sorted(seqs)
    status, _ = http_json("GET", replica.url + "/kv/events?after=-3", headers=cluster_auth())
    assert status == 400


def test_sigterm_finishes_in_flight_requests():
    proc = start_replica(capacity_blocks=200, time_scale=1.0)
    result = {}

    def call():
        result["out"] = http_json("POST", proc.url + "/generate", {"token_ids": list(range(64)), "max_tokens": 60})

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.3)  # 60 decode steps of ~16 ms emulated each take about a second of wall time
    proc.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert result["out"][0] == 200 and result["out"][1]["output_tokens"] == 60
    assert proc.proc.wait(30) == 0


def test_bad_command_line_exits_2_with_a_clear_error():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--capacity-blocks", "10", "--policy", "nope"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "unknown policy 'nope'" in res.stderr and "Traceback" not in res.stderr


def test_reorder_scheduler_lends_idle_memory_and_preempts_for_the_head():
    # 100 blocks: A (6 blocks, 600 tokens out, about 1 emulated s; its KV grows to 44 blocks) runs;
    # H (92 blocks) does not fit beside it; S (4 blocks, 1200 tokens out) behind H borrows the
    # idle blocks (A and S's decode KV stay under 80 of them while A runs) and is preempted when A
    # ends, since only S then stands between H and the memory it needs.
    proc = start_replica("--scheduler", "reorder", capacity_blocks=100, time_scale=1.0)
    try:
        bodies = [{"token_ids": list(range(96)), "max_tokens": 600},
                  {"token_ids": list(range(1000, 1000 + 92 * 16)), "max_tokens": 1},
                  {"token_ids": list(range(5000, 5064)), "max_tokens": 1200}]
        out: dict[int, tuple] = {}

        def send(i):
            out[i] = http_json("POST", proc.url + "/generate", bodies[i])

        threads = []
        for i in range(3):
            threads.append(threading.Thread(target=send, args=(i,)))
            threads[-1].start()
            time.sleep(0.1)
        for t in threads:
            t.join(30)
        assert [out[i][0] for i in range(3)] == [200, 200, 200]
        assert out[1][1]["e2e_s"] < out[2][1]["e2e_s"]  # S ends after H: preempted, recomputed, resumed
        _, st = http_json("GET", proc.url + "/stats")
        sched = st["scheduler"]
        assert (sched["policy"], sched["promotions"], sched["preemptions"]) == ("reorder", 1, 1)
        _, _, data = http("GET", proc.url + "/metrics")
        line = next(x for x in data.decode().splitlines() if x.startswith("vllm:num_preemptions_total"))
        assert line.endswith(" 1.0")
        # 100 blocks hold 1600 tokens, the limit where the model's window is larger (vLLM's max_model_len):
        # 1584 + 16 tokens are within it, one more is refused
        prompt = list(range(9000, 9000 + 99 * 16))
        assert http_json("POST", proc.url + "/generate", {"token_ids": prompt, "max_tokens": 16})[0] == 200
        status, err = http_json("POST", proc.url + "/generate", {"token_ids": prompt, "max_tokens": 17})
        assert status == 400 and err["error"]["param"] == "max_tokens", err
        assert "(max_model_len) is 1600 tokens" in str(err) and "asks for 1601" in str(err), err
    finally:
        assert proc.stop() == 0
