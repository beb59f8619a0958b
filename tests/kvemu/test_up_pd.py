"""`kvemu up --prefill-replicas P --decode-replicas D`: a disaggregated cluster of real processes, driven
through the router by the official `openai` SDK and by `/generate` (what `kvemu replay` sends): requests go
through a remote prefill (counted), the hit a client reads is the prefill instance's, the pools report
their roles, and no block stays pinned anywhere afterwards. Bad topology flags are one line."""

from __future__ import annotations

import msgpack
import pytest

from tests.conftest import free_port
from tests.support.cluster import wait_for
from tests.support.kvemu_cli import Up, run_kvemu
from tests.support.procs import Listener, cluster_auth, http, http_json

pytestmark = pytest.mark.slow
MODEL = "qwen3-coder-30b-a3b"


@pytest.fixture(scope="module")
def pd_up():
    up = Up("--prefill-replicas", "1", "--decode-replicas", "2", "--capacity-blocks", "2000", "--time-scale", "0",
            "--port", str(free_port()), "--pd-decider", "always")
    try:
        yield up, up.ready()
    finally:
        up.cleanup()


def stats(url: str) -> dict:
    status, body = http_json("GET", url + "/stats?sessions=raw", headers=cluster_auth())
    assert status == 200, body
    return body


def idle(urls: dict) -> None:
    """Nothing in flight or held anywhere: no pinned block, no held prefill, nobody waiting for KV."""
    def quiet():
        every = {k: stats(u) for k, u in urls.items() if k.startswith(("prefill-", "decode-"))}
        ok = all(st["pinned_blocks"] == 0 and st.get("private_blocks", 0) == 0 and st["pd"]["held_requests"] == 0
                 and st["pd"]["waiting_for_kv"] == 0 for st in every.values())
        return every if ok else None

    wait_for(quiet, timeout=10.0, what="every replica idle, nothing pinned or held")


def test_up_prints_each_pool_and_the_router_knows_their_roles(pd_up):
    up, urls = pd_up
    assert sorted(k for k in urls if k.startswith(("prefill-", "decode-", "replica-"))) == \
        ["decode-0", "decode-1", "prefill-0"]
    for name in ("prefill-0", "decode-0", "decode-1"):
        _, health = http_json("GET", urls[name] + "/health")
        assert health["replica_id"] == name and health["role"] == name.split("-")[0]
    _, cluster = http_json("GET", urls["router"] + "/cluster")
    roles = {r["replica_id"]: r["role"] for r in cluster["replicas"]}
    assert roles == {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
    assert cluster["pd"]["pools"] == {"prefill": ["prefill-0"], "decode": ["decode-0", "decode-1"], "both": []}
    assert cluster["pd"]["decider"] == "always"


def test_openai_sdk_through_remote_prefill_reports_the_prefill_hit(pd_up):
    from openai import OpenAI

    _, urls = pd_up
    _, before = http_json("GET", urls["router"] + "/cluster")
    client = OpenAI(base_url=urls["router"] + "/v1", api_key="unused", max_retries=0, timeout=30)
    system = "You review pull requests with care and say what is wrong. " * 30
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Review change one."}]
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=4)
    reply = first.parse()
    assert first.headers["x-kvemu-pd"] == "remote" and first.headers["x-kvemu-prefill-replica"] == "prefill-0"
    assert first.headers["x-kvemu-replica"].startswith("decode-")
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # the prefill instance computed it all
    assert reply.usage.completion_tokens == 4 and reply.choices[0].message.content

    # the same prompt again: the prefill instance holds it (its hit, not the decoder's, is what counts)
    again = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=4)
    hit = again.parse().usage.prompt_tokens_details.cached_tokens
    assert again.headers["x-kvemu-pd"] == "remote" and hit > 0 and int(again.headers["x-kvemu-cached-tokens"]) == hit
    extra = again.parse().model_extra or {}
    assert extra["kvemu"]["pd"]["prefill_cached_tokens"] == hit
    # the time to first token the client saw includes the remote prefill
    assert extra["kvemu"]["ttft_s"] >= extra["kvemu"]["pd"]["prefill_e2e_s"] > 0

    # streamed, with usage asked for: the usage chunk carries the prefill's hit too
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert text and len(usage) == 1 and usage[0].completion_tokens == 5
    assert usage[0].prompt_tokens_details.cached_tokens == hit

    completion = client.completions.create(model=MODEL, prompt="word " * 300, max_tokens=3)
    assert completion.usage.completion_tokens == 3
    _, after = http_json("GET", urls["router"] + "/cluster")
    paths = {k: after["pd"]["paths"][k] - before["pd"]["paths"].get(k, 0) for k in after["pd"]["paths"]}
    assert paths == {"remote": 4, "local": 0, "colocated": 0, "fallback": 0}
    assert sum(after["pd"]["decisions"]["prefill"].values()) >= 4
    _, _, text_metrics = http("GET", urls["router"] + "/metrics")
    assert b'kvemu_router_pd_requests_total{path="remote"}' in text_metrics
    assert b"kvemu_router_pd_prefill_seconds_count" in text_metrics
    idle(urls)
    pstats = stats(urls["prefill-0"])["pd"]
    assert pstats["send"]["transfers"] >= 4 and pstats["send"]["bytes"] > 0


def test_generate_as_replay_sends_it_reads_the_prefill_hit_and_the_whole_ttft(pd_up):
    _, urls = pd_up
    tokens = list(range(5000, 5000 + 320))  # 20 blocks
    headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack", "X-Session-Id": "g1"}
    outs = []
    for _ in range(2):
        status, hdrs, raw = http("POST", urls["router"] + "/generate", raw=msgpack.packb(
            {"token_ids": tokens, "max_tokens": 3}), headers=headers)
        assert status == 200, raw
        assert hdrs["X-Kvemu-Pd"] == "remote"
        outs.append(msgpack.unpackb(raw))
    first, second = outs
    assert first["cached_tokens"] == 0 and first["cached_blocks"] == 0
    assert second["cached_tokens"] == 304 and second["cached_blocks"] == 20  # its last block recomputed, as vLLM does
    for out in outs:
        assert out["pd"]["prefill_replica_id"] == "prefill-0"
        assert out["ttft_s"] >= out["pd"]["prefill_e2e_s"] > 0 and out["e2e_s"] >= out["ttft_s"]
    idle(urls)


def test_a_client_may_not_steer_the_transfer(pd_up):
    _, urls = pd_up
    body = {"prompt": "word " * 40, "max_tokens": 2}
    for bad, words in (({"do_remote_decode": True}, "set by the router"), ("yes", "expected an object"),
                       ({"remote_engine_id": "x", "do_remote_prefill": True}, "set by the router")):
        status, out = http_json("POST", urls["router"] + "/v1/completions", {**body, "kv_transfer_params": bad})
        assert status == 400 and out["error"]["param"] == "kv_transfer_params" and words in out["error"]["message"]
    for harmless in (None, {}, {"do_remote_decode": False, "do_remote_prefill": False}):
        status, out = http_json("POST", urls["router"] + "/v1/completions", {**body, "kv_transfer_params": harmless})
        assert status == 200, out
    idle(urls)


def test_no_request_has_any_process_send_anything_to_an_address_it_names(pd_up):
    """The probe's four paths against `kvemu up`'s cluster: through the router, SGLang's bootstrap fields;
    straight to a decode replica, those and kv_transfer_params naming a listener. The router refuses the
    fields; each replica knows its cluster's roster (--pd-peers) and refuses any other address."""
    _, urls = pd_up
    listener = Listener()
    try:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        sglang = {"bootstrap_room": 777, "bootstrap_host": "127.0.0.1", "bootstrap_port": listener.port}
        status, out = http_json("POST", urls["router"] + "/v1/chat/completions", {**chat, **sglang})
        assert status == 400 and out["error"]["param"] == "bootstrap_host", out
        remote = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": listener.port,
                  "remote_request_id": "x"}
        for extra, field in ((sglang, "bootstrap_host"), ({"kv_transfer_params": remote},
                                                           "kv_transfer_params.remote_host")):
            status, out = http_json("POST", urls["decode-0"] + "/v1/chat/completions", {**chat, **extra})
            assert status == 400 and out["error"]["param"] == field, out
        status, out = http_json("POST", urls["router"] + "/v1/chat/completions", chat)  # the cluster's own path
        assert status == 200, out
        assert listener.received == []
    finally:
        listener.close()
    idle(urls)


@pytest.mark.parametrize("flags, words", [
    (["--prefill-replicas", "1"], "error: --decode-replicas: a P/D cluster needs both pools"),
    (["--decode-replicas", "2"], "error: --prefill-replicas: a P/D cluster needs both pools"),
    (["--prefill-gpu", "h100"], "error: --prefill-gpu: "),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--pd-link-gbps", "0"], "error: --pd-link-gbps: "),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--prefill-capacity-gib", "-1"],
     "error: --prefill-capacity-gib: "),
    (["--replicas", "0"], "error: --replicas: the cluster has no replica"),
])
def test_bad_topology_flags_are_one_line(flags, words):
    res = run_kvemu("up", "--port", str(free_port()), *flags)
    assert res.returncode == 2, (flags, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(words), res.stderr
    assert res.stdout == ""


def test_each_pool_gets_its_shape_role_and_link_flags_on_its_command_lines():
    import argparse

    from kvemu import up
    from shared.costmodel import CostModel

    p = argparse.ArgumentParser()
    up.configure(p)
    a = p.parse_args(["--prefill-replicas", "1", "--decode-replicas", "2", "--capacity-blocks", "4000",
                      "--model", "llama-3-8b", "--prefill-gpu", "h200", "--prefill-tp", "2", "--decode-capacity-gib", "2",
                      "--pd-link-gbps", "100", "--pd-decider", "prefix", "--pd-threshold-tokens", "64"])
    plan = up.validate(a)
    assert plan.topology.colocated == 0 and plan.members() == [("prefill-0", "prefill"), ("decode-0", "decode"),
                                                                   ("decode-1", "decode")]

    def flag(args: list[str], name: str) -> str | None:
        return args[args.index(name) + 1] if name in args else None

    pre = up.replica_args(0, 9000, plan, None, "prefill-0", "prefill")
    dec = up.replica_args(1, 9001, plan, None, "decode-0", "decode")
    assert (flag(pre, "--role"), flag(pre, "--gpu"), flag(pre, "--capacity-blocks")) == ("prefill", "h200@tp2", "4000")
    assert (flag(dec, "--role"), flag(dec, "--gpu"), flag(dec, "--replica-id")) == ("decode", plan.flags.gpu, "decode-0")
    assert int(flag(dec, "--capacity-blocks")) == CostModel.from_names("llama-3-8b", plan.flags.gpu).gib_to_blocks(2, 16)
    assert float(flag(pre, "--pd-link-gbps")) == float(flag(dec, "--pd-link-gbps")) == 100
    router = up.router_args(8000, plan, ["http://127.0.0.1:9000", "http://127.0.0.1:9001"], "memory",
                            ["prefill", "decode"])
    assert flag(router, "--replicas") == "prefill=http://127.0.0.1:9000,decode=http://127.0.0.1:9001"
    assert (flag(router, "--pd-decider"), flag(router, "--pd-threshold-tokens")) == ("prefix", "64")
    colocated = p.parse_args(["--capacity-blocks", "100"])
    plan = up.validate(colocated)
    assert plan.topology.colocated == 4 and "--role" not in up.replica_args(0, 9000, plan, None)
    assert "--pd-decider" not in up.router_args(8000, plan, ["http://127.0.0.1:9000"], "memory")
