"""A replica as a drop-in worker behind SGLang's router: the endpoints sglang-router reads
(replica/compat_views.py), each in-process, then two real replicas behind the real router."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time

import pytest
import xxhash
from aiohttp.test_utils import TestClient, TestServer

from replica import compat_views
from replica.app import make_app
from replica.core.build import EngineKnobs
from replica.runtime import RUNTIME
from replica.settings import ReplicaSettings
from shared import tokenizer
from shared.serving import ServingSettings
from tests.conftest import free_port
from tests.support.procs import Proc, http, http_json
from tests.support.sglang_router import SglangRouter

MODEL = "qwen3-coder-30b-a3b"  # the replica's default --model


def served(settings: ReplicaSettings, *steps):
    """Run ``steps`` (async functions of an aiohttp test client) against ``make_app(settings)``."""

    async def go():
        async with TestClient(TestServer(make_app(settings))) as client:
            for step in steps:
                await step(client)

    asyncio.run(go())


def settings(**kw) -> ReplicaSettings:
    knobs = {name: kw.pop(name) for name in ("max_running",) if name in kw}
    return ReplicaSettings(**{"capacity_blocks": 256, "time_scale": 0.0, "knobs": EngineKnobs(**knobs), **kw})


# ---- SGLang's worker endpoints -------------------------------------------------------------------
def test_server_info_names_the_model_as_v1_models_does_with_the_fields_the_router_reads():
    s = settings(port=8123)

    async def check(c):
        listed = (await (await c.get("/v1/models")).json())["data"][0]["id"]
        assert listed == MODEL
        r = await c.get("/server_info")
        assert r.status == 200
        info = await r.json()
        assert info == await (await c.get("/get_server_info")).json()  # the router falls back to the old name
        assert info["model_path"] == info["served_model_name"] == listed
        # sglang-router deserializes these as Option<usize> / Option<String>: one wrong type and it
        # drops the whole answer (the model would be "unknown" again)
        for key in ("tp_size", "dp_size", "max_total_num_tokens", "max_prefill_tokens", "max_running_requests"):
            assert isinstance(info[key], int) and not isinstance(info[key], bool) and info[key] >= 1, key
        for key in ("model_path", "served_model_name", "version", "load_balance_method", "disaggregation_mode"):
            assert isinstance(info[key], str), key
        assert info["tp_size"] == 1 and info["dp_size"] == 1 and info["disaggregation_mode"] == "null"
        assert info["context_length"] == s.resolved_max_model_len() == 256 * 16  # the pool bounds it here
        assert info["max_total_num_tokens"] == 256 * 16 and info["page_size"] == 16 and info["port"] == 8123
        assert info["max_running_requests"] == s.knobs.max_running and info["max_prefill_tokens"] == s.knobs.token_budget
        assert info["kvemu"]["capacity_blocks"] == 256 and info["kvemu"]["model_preset"] == MODEL

    served(s, check)


def test_model_info_is_a_generation_model_with_the_replicas_context_length():
    s = settings(capacity_blocks=20_000, max_model_len=32_768, model="qwen3-coder-30b")  # an alias of the preset

    async def check(c):
        info = await (await c.get("/model_info")).json()
        assert info == await (await c.get("/get_model_info")).json()
        listed = (await (await c.get("/v1/models")).json())["data"][0]["id"]
        assert info["model_path"] == info["served_model_name"] == listed == "qwen3-coder-30b"
        assert info["is_generation"] is True and info["tokenizer_path"] is None
        assert info["model_type"] is None and info["architectures"] is None  # no checkpoint to name
        assert info["context_length"] == info["max_context_length"] == 32_768
        assert info["max_req_input_len"] == 32_767 and info["vocab_size"] == tokenizer.VOCAB_SIZE
        assert info["kvemu"]["model_preset"] == MODEL and info["kvemu"]["layers"] == 48
        served_info = await (await c.get("/server_info")).json()
        assert served_info["served_model_name"] == "qwen3-coder-30b" and served_info["tp_size"] == 1

    served(s, check)


def test_get_load_counts_running_and_waiting_requests_and_their_tokens():
    # one request runs at a time, in real time (400 tokens take about 0.65 s), so a second one waits
    s = settings(max_running=1, time_scale=1.0)

    async def check(c):
        idle = await (await c.get("/get_load")).json()
        assert isinstance(idle, list) and len(idle) == 1
        assert {k: idle[0][k] for k in ("num_reqs", "num_waiting_reqs", "num_tokens")} == \
               {"num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        first = asyncio.create_task(c.post("/generate", json={"token_ids": list(range(100)), "max_tokens": 400}))
        second = asyncio.create_task(c.post("/generate", json={"token_ids": list(range(1000, 1050)), "max_tokens": 1}))
        load = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            load = (await (await c.get("/get_load")).json())[0]
            if load["num_reqs"] == 2:
                break
            await asyncio.sleep(0.005)
        assert load is not None and load["num_reqs"] == 2, load
        assert load["num_running_reqs"] == 1 and load["num_waiting_reqs"] == 1
        assert load["num_waiting_tokens"] == 50
        assert load["num_used_tokens"] >= 112  # 100 prompt tokens take 7 blocks of 16, and decoding adds more
        assert load["num_tokens"] == load["num_used_tokens"] + 50
        assert 0 < load["token_usage"] <= load["kv_usage"] <= 1
        assert load["max_total_num_tokens"] == 256 * 16
        assert all(r.status == 200 for r in await asyncio.gather(first, second))
        done = (await (await c.get("/get_load")).json())[0]
        assert done["num_reqs"] == 0 and done["num_tokens"] == 0
        assert done["num_cached_tokens"] > 0  # the prompts' blocks stay cached, held by nobody

    served(s, check)


def test_health_generate_runs_one_token_through_the_engine():
    s = settings()

    async def check(c):
        app = c.server.app
        assert app is not None
        engine = app[RUNTIME].engine
        before = engine.counters.finished
        r = await c.get("/health_generate")
        assert r.status == 200
        body = await r.json()
        assert body["status"] == "ok" and body["output_tokens"] == 1 and body["e2e_s"] > 0
        assert engine.counters.finished == before + 1  # a real generation, not a canned answer

    served(s, check)


def test_health_generate_is_503_when_the_engine_cannot_finish_it(monkeypatch):
    monkeypatch.setattr(compat_views, "HEALTH_GENERATE_TIMEOUT_S", 0.3)
    s = settings(max_running=1, max_waiting=2, time_scale=1.0)  # 900 tokens take about 1.5 s

    async def check(c):
        busy = [asyncio.create_task(c.post("/generate", json={"token_ids": list(range(40)), "max_tokens": 900}))]
        while (await (await c.get("/get_load")).json())[0]["num_running_reqs"] < 1:
            await asyncio.sleep(0.005)
        r = await c.get("/health_generate")  # queued behind a long request: does not finish in time
        assert r.status == 503 and "did not finish within 0.3 s" in (await r.json())["error"]["message"]
        busy.append(asyncio.create_task(c.post("/generate", json={"token_ids": [1, 2], "max_tokens": 1})))
        while (await (await c.get("/get_load")).json())[0]["num_waiting_reqs"] < 2:
            await asyncio.sleep(0.005)
        r = await c.get("/health_generate")  # the waiting queue is full: refused at once
        assert r.status == 503 and "refused" in (await r.json())["error"]["message"]
        assert r.headers["Retry-After"] == "1"
        await asyncio.gather(*busy)

    served(s, check)


# ---- vLLM's tokenizer endpoints ------------------------------------------------------------------
TEXT = "Hello, world!  The quick brown fox -- jumps over 1234567890 lazy dogs.\n\tdef f(x): return x  "


def test_tokenize_gives_the_ids_completions_count_and_detokenize_inverts_them():
    async def check(c):
        r = await c.post("/tokenize", json={"model": MODEL, "prompt": TEXT})
        assert r.status == 200
        out = await r.json()
        assert out["tokens"] == tokenizer.encode(TEXT) and out["count"] == len(out["tokens"])
        assert out["max_model_len"] == 256 * 16 and out["token_strs"] is None
        usage = (await (await c.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 1})).json())["usage"]
        assert usage["prompt_tokens"] == out["count"]
        strs = (await (await c.post("/tokenize", json={"prompt": TEXT, "return_token_strs": True})).json())["token_strs"]
        assert "".join(strs) == TEXT.rstrip()  # pieces carry their leading whitespace; trailing is no token
        back = await (await c.post("/detokenize", json={"model": MODEL, "tokens": out["tokens"]})).json()
        assert back["prompt"] == back["text"] == TEXT.rstrip()
        assert back["kvemu"]["ambiguous"] == 0
        empty = await (await c.post("/tokenize", json={"prompt": ""})).json()
        assert empty["count"] == 0 and empty["tokens"] == []
        assert (await (await c.post("/detokenize", json={"tokens": []})).json())["prompt"] == ""

    served(settings(), check)


def test_tokenize_messages_counts_what_chat_completions_counts():
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primes."}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

    async def check(c):
        for extra in ({}, {"tools": tools}):
            out = await (await c.post("/tokenize", json={"messages": messages, **extra})).json()
            chat = await (await c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, **extra})).json()
            assert out["count"] == chat["usage"]["prompt_tokens"] > 0
        bare = await (await c.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})).json()
        text = tokenizer.chat_template(messages)
        assert text.endswith("<|im_start|>assistant\n")
        assert bare["tokens"] == tokenizer.encode(text[:-len("<|im_start|>assistant\n")])

    served(settings(), check)


def test_tokenize_a_batch_of_prompts_as_sglang_does():
    async def check(c):
        out = await (await c.post("/tokenize", json={"prompt": ["one two", "three"]})).json()
        assert out["tokens"] == [tokenizer.encode("one two"), tokenizer.encode("three")]
        assert out["count"] == [2, 1]

    served(settings(), check)


def _colliding_pieces() -> tuple[str, str]:
    """Two words the tokenizer folds to one id (a birthday search: a few hundred words suffice)."""
    seen: dict[int, str] = {}
    for i in range(100_000):
        word = f"w{i}"
        tid = xxhash.xxh3_64_intdigest(f" {word}".encode()) % tokenizer.VOCAB_SIZE  # as a piece after a space
        if tid in seen:
            return seen[tid], word
        seen[tid] = word
    raise AssertionError("no collision")


def test_detokenize_says_where_two_pieces_share_an_id_and_refuses_ids_it_never_gave():
    a, b = _colliding_pieces()
    assert len(a) <= 8 and len(b) <= 8  # each one token

    async def check(c):
        ids = (await (await c.post("/tokenize", json={"prompt": f"x {a} {b}"})).json())["tokens"]
        assert len(ids) == 3 and ids[1] == ids[2]
        back = await (await c.post("/detokenize", json={"tokens": ids})).json()
        assert back["prompt"] == f"x {b} {b}"  # the latest piece with that id wins, at both positions
        assert back["kvemu"] == {"ambiguous": 2, "ambiguous_positions": [1, 2]}
        unseen = next(t for t in range(tokenizer.VOCAB_SIZE) if tokenizer.decode([t])[1])
        r = await c.post("/detokenize", json={"tokens": [ids[0], unseen]})
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["param"] == "tokens[1]" and f"id {unseen} was never given" in err["message"]
        r = await c.post("/detokenize", json={"tokens": [tokenizer.VOCAB_SIZE]})
        assert r.status == 400 and "outside the vocabulary" in (await r.json())["error"]["message"]

    served(settings(), check)


def test_version():
    async def check(c):
        body = await (await c.get("/version")).json()
        assert isinstance(body["version"], str) and body["version"]

    served(settings(), check)


BAD = [
    ("/tokenize", b'{"prompt": "abc"', "body", "malformed JSON"),
    ("/tokenize", b'{"prompt": "a" "b"}', "body", "delimiter"),  # a 400, not the 413 of a body over the limit
    ("/tokenize", b"[1, 2]", "body", "expected an object"),
    ("/tokenize", b"", "body", "empty"),
    ("/tokenize", b"{}", "prompt", "exactly one of prompt or messages"),
    ("/tokenize", b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "prompt", "exactly one"),
    ("/tokenize", b'{"prompt": 5}', "prompt", "expected a string"),
    ("/tokenize", b'{"prompt": []}', "prompt", "non-empty list"),
    ("/tokenize", b'{"prompt": [1, 2]}', "prompt", "expected a string"),
    ("/tokenize", b'{"prompt": "\\ud800"}', "prompt", "lone surrogate"),
    ("/tokenize", b'{"prompt": "a", "model": 5}', "model", "expected a string"),
    ("/tokenize", b'{"prompt": "a", "return_token_strs": "yes"}', "return_token_strs", "true or false"),
    ("/tokenize", b'{"prompt": "a", "add_special_tokens": 1}', "add_special_tokens", "true or false"),
    ("/tokenize", b'{"messages": "hi"}', "messages", "non-empty list"),
    ("/tokenize", b'{"messages": [{"role": "bogus", "content": "x"}]}', "messages[0].role", "unknown role"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": 7}]}', "messages[0].content", "expected a string"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "no"}',
     "add_generation_prompt", "true or false"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}',
     "continue_final_message", "not emulated"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "x"}], "chat_template": "{{x}}"}', "chat_template",
     "not emulated"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "x"}], "tools": {}}', "tools", "expected a list"),
    ("/detokenize", b"{}", "tokens", "missing"),
    ("/detokenize", b'{"tokens": "abc"}', "tokens", "expected a list of integers"),
    ("/detokenize", b'{"tokens": [1.5]}', "tokens[0]", "token id"),
    ("/detokenize", b'{"tokens": [-1]}', "tokens[0]", "token id"),
    ("/detokenize", b'{"tokens": [true]}', "tokens[0]", "token id"),
    ("/detokenize", b'{"tokens": [1099511627776]}', "tokens[0]", "token id"),
    ("/detokenize", b'{"tokens": [1], "model": ["m"]}', "model", "expected a string"),
]


@pytest.mark.parametrize("path,raw,field,words", BAD, ids=[f"{p}:{f}:{i}" for i, (p, _, f, _) in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_field(path, raw, field, words):
    async def check(c):
        r = await c.post(path, data=raw, headers={"Content-Type": "application/json"})
        assert r.status == 400, await r.text()
        err = (await r.json())["error"]
        assert err["param"] == field and words in err["message"], err

    served(settings(), check)


def test_huge_inputs_are_refused_with_a_4xx():
    s = settings(serving=ServingSettings(max_prompt_tokens=100, max_output_tokens=20, max_body_bytes=64 * 1024))

    async def check(c):
        r = await c.post("/tokenize", json={"prompt": "word " * 101})
        assert r.status == 400 and (await r.json())["error"]["param"] == "prompt"
        assert "limit is 100" in (await r.json())["error"]["message"]
        assert (await c.post("/tokenize", json={"prompt": "word " * 100})).status == 200
        r = await c.post("/tokenize", json={"prompt": ["word " * 60, "word " * 41]})  # the batch shares the limit
        assert r.status == 400 and (await r.json())["error"]["param"] == "prompt[1]"
        r = await c.post("/tokenize", json={"messages": [{"role": "user", "content": "word " * 100}]})
        assert r.status == 400 and (await r.json())["error"]["param"] == "messages"
        r = await c.post("/detokenize", json={"tokens": [1] * 121})  # prompt plus output limits
        assert r.status == 400 and "limit is 120" in (await r.json())["error"]["message"]
        r = await c.post("/tokenize", json={"prompt": "x" * 70_000})
        assert r.status == 413 and (await r.json())["error"]["param"] == "body"

    served(s, check)


def test_the_get_endpoints_refuse_other_methods_and_the_post_ones_gets():
    async def check(c):
        assert (await c.post("/server_info")).status == 405
        assert (await c.post("/health_generate")).status == 405
        r = await c.get("/tokenize")
        assert r.status == 405 and (await r.json())["error"]["code"] == 405

    served(settings(), check)


def test_an_http2_probe_is_one_line_in_the_log_not_a_traceback(caplog):
    async def check(c):
        reader, writer = await asyncio.open_connection("127.0.0.1", c.server.port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # what a gRPC client opens with
        await writer.drain()
        assert (await reader.read(12))[8:] == b" 400"  # aiohttp answers it as HTTP/1.0
        writer.close()

    with caplog.at_level(logging.INFO):
        served(settings(), check)
    assert not [r for r in caplog.records if r.name == "aiohttp.server" and r.levelno >= logging.ERROR]
    assert [r for r in caplog.records if r.name == "replica.compat" and "HTTP/2" in r.getMessage()]


# ---- the real sglang-router in front of two real replicas ---------------------------------------
def _replica(stack: contextlib.ExitStack, replica_id: str) -> Proc:
    port = free_port()
    proc = Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "4000", "--time-scale", "0",
                 "--replica-id", replica_id], port)
    stack.callback(proc.stop, timeout=10.0)  # registered before waiting: a replica that hangs is stopped too
    proc.wait_healthy()
    return proc


@pytest.fixture(scope="module")
def sglang_cluster():
    pytest.importorskip("sglang_router", reason="the dev extra installs sglang-router")
    # every process is stopped (the stack unwinds) before its log folder goes, pass or fail
    with tempfile.TemporaryDirectory(prefix="kvemu-sglang-") as log_dir, contextlib.ExitStack() as stack:
        replicas = [_replica(stack, f"r{i}") for i in range(2)]
        router = SglangRouter(["--worker-urls", *[r.url for r in replicas], "--policy", "cache_aware"], log_dir)
        stack.callback(router.stop)
        router.wait_workers(2, MODEL)
        yield router, replicas


def test_sglang_router_names_the_model_keeps_sessions_and_exports_metrics(sglang_cluster):
    from openai import OpenAI
    from prometheus_client.parser import text_string_to_metric_families

    router, replicas = sglang_cluster
    # what it learned from /server_info: the model id and its labels
    _, workers = http_json("GET", router.url + "/workers")
    for w in workers["workers"]:
        assert w["model_id"] == MODEL and w["metadata"]["served_model_name"] == MODEL, w

    client = OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == [MODEL]  # not "unknown"

    # multi-turn sessions: each turn repeats the conversation so far and adds to it
    chats = 0
    for s in range(3):
        messages = [{"role": "system", "content": f"Session {s}. " + "You review pull requests carefully. " * 40},
                    {"role": "user", "content": f"Review change number {s}."}]
        served_by, cached = [], []
        for turn in range(3):
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=8)
            reply = raw.parse()
            chats += 1
            served_by.append(raw.headers["x-kvemu-replica"])
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"And what about part {turn + 2}?"}]
        assert cached[0] == 0, (s, cached)
        assert all(c > 0 for c in cached[1:]), (s, cached, served_by)  # turn 2 on: the session's replica kept it
        assert len(set(served_by)) == 1, (s, served_by)

    # the router proxies its /get_model_info and /health_generate to a worker, and reads /get_load
    status, info = http_json("GET", router.url + "/get_model_info")
    assert status == 200 and info["model_path"] == MODEL and info["is_generation"] is True
    assert http("GET", router.url + "/health_generate")[0] == 200
    status, loads = http_json("GET", router.url + "/get_loads")
    assert status == 200 and sorted(x["worker"] for x in loads["workers"]) == sorted(r.url for r in replicas)
    assert all(x["load"] >= 0 for x in loads["workers"]), loads  # -1 is what it gives for a worker without /get_load

    # its Prometheus metrics (on their own loopback port) parse, with its request counters
    status, _, text = http("GET", router.metrics_url)
    assert status == 200
    samples = [s for fam in text_string_to_metric_families(text.decode()) for s in fam.samples]

    def total(name: str, **labels) -> float:
        return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    assert total("smg_http_requests_total", path="/v1/chat/completions") == chats
    assert total("smg_router_requests_total", endpoint="chat", model=MODEL) == chats
    assert total("smg_worker_pool_size", model=MODEL) == 2
    assert total("smg_worker_health") == 2
