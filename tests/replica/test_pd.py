"""Live P/D on vLLM's wire (replica/pd.py, replica/pd_views.py): a prefill and a decode replica as real
processes on loopback, driven as vLLM's disaggregated proxy drives vLLM: the prefill leg with
``do_remote_decode`` and max_tokens 1, its answer's ``kv_transfer_params`` handed to the decode leg.

Hand-worked figures: the model's KV is 98,304 bytes a token (qwen3-coder-30b-a3b: 48 layers x 4 KV heads x
128 x 2 (K, V) x 2 bytes); an H200's NIC is 400 Gb/s = 5e10 bytes/s; the base latency 50 us. A prompt of 160
tokens (10 blocks) the decoder lacks crosses in 160 x 98,304 / 5e10 + 50e-6 = 364.5728 us."""

import json
import socket
import time

import pytest

from shared import protocol, tokenizer
from tests.conftest import free_port
from tests.support.cluster import metric, scrape, sse_events, stop_all, wait_for
from tests.support.procs import Listener, cluster_auth, http, http_json, start_replica

pytestmark = pytest.mark.slow

KV_BYTES = 98_304
NIC = 5e10
LATENCY = 50e-6
PROXY_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}  # what vLLM's proxy sends


def prompt(seed: int, blocks: int = 10) -> list[int]:
    return [1000 * seed + i for i in range(16 * blocks)]


@pytest.fixture(scope="module")
def pd():
    p = start_replica("--role", "prefill", capacity_blocks=500, replica_id="p0")
    d = start_replica("--role", "decode", capacity_blocks=500, replica_id="d0")
    yield p, d
    stop_all(p, d)


def prefill_leg(p, body: dict, path: str = "/v1/completions") -> dict:
    status, out = http_json("POST", p.url + path, {**body, "max_tokens": 1, "kv_transfer_params": PROXY_PREFILL})
    assert status == 200, out
    return out


def stats(proc) -> dict:
    return http_json("GET", proc.url + "/stats")[1]


def test_the_proxy_flow_gives_a_full_answer_and_releases_the_prefill_blocks(pd):
    p, d = pd
    tokens = prompt(1)
    before_p, before_d = stats(p)["pd"], stats(d)["pd"]
    first = prefill_leg(p, {"prompt": tokens})
    params = first["kv_transfer_params"]
    assert first["usage"]["completion_tokens"] == 1
    assert {k: v for k, v in params.items() if k not in ("remote_request_id", "kvemu_transfer_token")} == {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p0",
        "remote_block_ids": list(range(10)), "remote_host": "127.0.0.1", "remote_port": p.port, "tp_size": 1}
    assert params["remote_request_id"].startswith("pd-p0-")
    assert len(params["kvemu_transfer_token"]) == 32  # the hold's own credential: 24 random bytes, base64url
    held = stats(p)
    assert held["pinned_blocks"] == 10 and held["pd"]["held_requests"] == 1 and held["pd"]["held_blocks"] == 10

    status, out = http_json("POST", d.url + "/v1/completions",
                            {"prompt": tokens, "max_tokens": 20, "kv_transfer_params": params})
    assert status == 200, out
    spec = protocol.parse_openai({"prompt": tokens, "max_tokens": 20}, False, 16, (1 << 20, 4096), None)
    assert out["choices"][0]["text"] == tokenizer.filler_text(20, protocol.response_seed(spec.hashes, 160))
    assert out["usage"]["completion_tokens"] == 20
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 159  # all but the last token came over
    wire = 160 * KV_BYTES / NIC + LATENCY
    assert out["kvemu"]["kv_wait_s"] == pytest.approx(wire, abs=1e-9)

    after_p, after_d = stats(p), stats(d)
    assert after_p["pinned_blocks"] == 0 and after_p["pd"]["held_requests"] == 0
    assert after_p["pd"]["send"]["bytes"] - before_p["send"]["bytes"] == 160 * KV_BYTES
    assert after_p["pd"]["send"]["transfers"] - before_p["send"]["transfers"] == 1
    dpd = after_d["pd"]
    assert dpd["recv"]["bytes"] - before_d["recv"]["bytes"] == 160 * KV_BYTES
    assert dpd["ttft_split"]["kv_wait_s_last"] == pytest.approx(wire, abs=1e-9)
    assert dpd["remote_requests"] - before_d["remote_requests"] == 1 and dpd["waiting_for_kv"] == 0
    assert after_d["pinned_blocks"] == 0 and after_d["private_blocks"] == 0


def test_what_the_decoder_holds_does_not_cross_again(pd):
    p, d = pd
    tokens = prompt(2)
    for expected_bytes in (160 * KV_BYTES, 0):  # the second time the decoder holds all 10 blocks
        params = prefill_leg(p, {"prompt": tokens})["kv_transfer_params"]
        before = stats(d)["pd"]["recv"]["bytes"]
        status, out = http_json("POST", d.url + "/v1/completions",
                                {"prompt": tokens, "max_tokens": 4, "kv_transfer_params": params})
        assert status == 200
        assert stats(d)["pd"]["recv"]["bytes"] - before == expected_bytes
        assert out["kvemu"]["kv_wait_s"] == pytest.approx(expected_bytes / NIC + LATENCY, abs=1e-9)
    assert stats(p)["pinned_blocks"] == 0 and stats(d)["pinned_blocks"] == 0


def test_native_generate_and_streamed_chat_legs(pd):
    p, d = pd
    out = prefill_leg(p, {"token_ids": prompt(3), "max_tokens": 50}, "/generate")
    assert out["output_tokens"] == 1 and out["kv_transfer_params"]["remote_block_ids"] == list(range(10))
    status, answer = http_json("POST", d.url + "/generate", {"token_ids": prompt(3), "max_tokens": 7,
                                                             "kv_transfer_params": out["kv_transfer_params"]})
    assert status == 200 and answer["output_tokens"] == 7 and answer["kv_wait_s"] > 0

    messages = [{"role": "user", "content": "tell me about disaggregated serving " * 20}]
    first = prefill_leg(p, {"messages": messages}, "/v1/chat/completions")
    status, _, data = http("POST", d.url + "/v1/chat/completions",
                           {"messages": messages, "max_tokens": 12, "stream": True,
                            "kv_transfer_params": first["kv_transfer_params"]})
    assert status == 200
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    plain = protocol.parse_openai({"messages": messages, "max_tokens": 12}, True, 16, (1 << 20, 4096), None)
    assert text == tokenizer.filler_text(12, protocol.response_seed(plain.hashes, plain.prompt_tokens))
    assert chunks[-1]["kvemu"]["kv_wait_s"] > 0
    assert stats(p)["pinned_blocks"] == 0 and stats(d)["pinned_blocks"] == 0


@pytest.mark.parametrize("params, field", [
    ("yes", "kv_transfer_params"),
    ({"do_remote_prefill": "yes"}, "kv_transfer_params.do_remote_prefill"),
    ({"do_remote_prefill": True, "remote_port": 1, "remote_request_id": "x"}, "kv_transfer_params.remote_host"),
    ({"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_request_id": "x"},
     "kv_transfer_params.remote_port"),
    ({"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": "80", "remote_request_id": "x"},
     "kv_transfer_params.remote_port"),
    ({"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 80, "remote_request_id": 7},
     "kv_transfer_params.remote_request_id"),
    ({"do_remote_prefill": True, "remote_host": "h", "remote_port": 80, "remote_request_id": "x",
      "remote_block_ids": [1, "a"]}, "kv_transfer_params.remote_block_ids[1]"),
    ({"do_remote_prefill": True, "do_remote_decode": True}, "kv_transfer_params.do_remote_prefill"),
    ({"do_remote_decode": True}, "kv_transfer_params.do_remote_decode"),  # the decode replica prefills for none
])
def test_bad_kv_transfer_params_are_refused_naming_the_field(pd, params, field):
    _, d = pd
    status, out = http_json("POST", d.url + "/v1/completions",
                            {"prompt": prompt(4), "max_tokens": 3, "kv_transfer_params": params})
    assert status == 400 and out["error"]["param"] == field, out
    assert stats(d)["pinned_blocks"] == 0 and stats(d)["pd"]["waiting_for_kv"] == 0


def test_a_prefill_replica_decodes_nothing_remote_and_unknown_keys_are_ignored(pd):
    p, _ = pd
    remote = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 80, "remote_request_id": "x"}
    status, out = http_json("POST", p.url + "/v1/completions",
                            {"prompt": prompt(5), "max_tokens": 3, "kv_transfer_params": remote})
    assert status == 400 and out["error"]["param"] == "kv_transfer_params.do_remote_prefill"
    out = prefill_leg(p, {"prompt": prompt(5), "kv_transfer_params": {**PROXY_PREFILL, "nixl_extra": [1]}})
    assert out["kv_transfer_params"]["do_remote_prefill"] is True
    assert stats(p)["pinned_blocks"] == 10  # held until pulled: released here by the pull below
    pulled = http_json("POST", p.url + "/kv/pull", {"remote_request_id": out["kv_transfer_params"]
                                                    ["remote_request_id"], "bytes": 0, "decoder": "t"},
                       headers=cluster_auth())
    assert pulled == (200, {"ok": True, "send_s": pytest.approx(LATENCY), "replica_id": "p0"})
    assert stats(p)["pinned_blocks"] == 0


def closed_port() -> int:
    port = free_port()
    with socket.socket() as s:  # nothing listens there once this is closed
        s.bind(("127.0.0.1", port))
    return port


@pytest.mark.parametrize("reason", ["unknown_request", "unreachable"])
def test_a_failed_pull_falls_back_to_a_local_prefill_and_counts_it(pd, reason):
    p, d = pd
    params = {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_host": "127.0.0.1",
              "remote_port": p.port if reason == "unknown_request" else closed_port(),
              "remote_request_id": "pd-p0-never", "remote_block_ids": list(range(10)), "tp_size": 1}
    before = stats(d)["pd"]["failovers"][reason]
    unknown_before = stats(p)["pd"]["pulls_unknown"]
    status, out = http_json("POST", d.url + "/v1/completions",
                            {"prompt": prompt(6 if reason == "unknown_request" else 7), "max_tokens": 5,
                             "kv_transfer_params": params})
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # prefilled here, from nothing
    assert "kv_wait_s" not in out["kvemu"]
    assert stats(d)["pd"]["failovers"][reason] == before + 1
    assert stats(p)["pd"]["pulls_unknown"] == unknown_before + (reason == "unknown_request")
    samples = scrape(d.url)
    assert metric(samples, "kvemu:pd_failovers_total", reason=reason) == before + 1
    assert stats(d)["pinned_blocks"] == 0 and stats(d)["pd"]["waiting_for_kv"] == 0


def test_the_pull_endpoint_needs_the_holds_credential_and_names_bad_fields(pd):
    p, _ = pd
    body = {"remote_request_id": "pd-p0-x", "bytes": 10, "decoder": "d0"}
    for bad, field in (({"bytes": "10"}, "bytes"), ({"bytes": -1}, "bytes"), ({"remote_request_id": None},
                       "remote_request_id"), ({"decoder": 3}, "decoder")):
        status, out = http_json("POST", p.url + "/kv/pull", {**body, **bad}, headers=cluster_auth())
        assert status == 400 and out["error"]["param"] == field
    status, out = http_json("POST", p.url + "/kv/pull", body)  # not held: nothing to open, whatever is presented
    assert status == 404 and out["error"]["param"] == "remote_request_id" and "pd-p0-x" in out["error"]["message"]
    params = prefill_leg(p, {"prompt": prompt(10)})["kv_transfer_params"]
    held = {**body, "remote_request_id": params["remote_request_id"], "bytes": 0}
    assert http("POST", p.url + "/kv/pull", held)[0] == 401
    assert http("POST", p.url + "/kv/pull", held, headers={"Authorization": "Bearer secret"})[0] == 401  # admin's
    other = prefill_leg(p, {"prompt": prompt(11)})["kv_transfer_params"]  # another hold's credential opens nothing
    assert http("POST", p.url + "/kv/pull", held,
                headers={"Authorization": f"Bearer {other['kvemu_transfer_token']}"})[0] == 401
    own = {"Authorization": f"Bearer {params['kvemu_transfer_token']}"}
    assert http_json("POST", p.url + "/kv/pull", held, headers=own)[0] == 200
    third = prefill_leg(p, {"prompt": prompt(17)})["kv_transfer_params"]  # a proxy letting go of its own hold
    release = {"remote_request_id": third["remote_request_id"]}
    assert http("POST", p.url + "/kv/release", release, headers=own)[0] == 401  # another hold's credential
    assert http_json("POST", p.url + "/kv/release", release,
                     headers={"Authorization": f"Bearer {third['kvemu_transfer_token']}"}) == (
        200, {"released": True, "blocks": 10, "replica_id": "p0"})
    assert http_json("POST", p.url + "/kv/pull", {**held, "remote_request_id": other["remote_request_id"]},
                     headers=cluster_auth())[0] == 200  # the cluster's own tools
    assert stats(p)["pinned_blocks"] == 0


def _secrets() -> list[bytes]:
    return [cluster_auth()["Authorization"].split()[1].encode(), b"secret"]  # the cluster and admin tokens


def test_no_request_has_a_replica_send_a_token_to_an_address_it_names(pd):
    """The probe's paths: kv_transfer_params and SGLang's bootstrap fields naming a listener. The decoder
    contacts it for a pull (no --pd-peers here) but presents only the credential the request carried."""
    p, d = pd
    listener = Listener()
    try:
        remote = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": listener.port,
                  "remote_request_id": "x"}
        for seed, params in ((12, remote), (16, {**remote, "kvemu_transfer_token": "client-chosen"})):
            status, out = http_json("POST", d.url + "/v1/completions",
                                    {"prompt": prompt(seed), "max_tokens": 2, "kv_transfer_params": params})
            assert status == 200 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # prefilled here
        sglang = {"prompt": prompt(13), "max_tokens": 2, "bootstrap_room": 777, "bootstrap_host": "127.0.0.1",
                  "bootstrap_port": listener.port}
        status, out = http_json("POST", d.url + "/v1/completions", sglang)
        assert status == 400 and out["error"]["param"] == "bootstrap_room" and "--pd-peers" in out["error"]["message"]
        wait_for(lambda: len(listener.received) == 2, timeout=5, what="the two pulls")
        heads = [r.lower() for r in listener.received]
        assert all(head.startswith(b"post /kv/pull ") for head in heads)
        assert b"authorization" not in heads[0] and b"authorization: bearer client-chosen" in heads[1]
        assert not any(token in r for r in listener.received for token in _secrets())
    finally:
        listener.close()
    assert stats(d)["pinned_blocks"] == 0


@pytest.mark.parametrize("role", ["decode", "both"])
def test_with_peers_a_replica_contacts_no_other_address(pd, role):
    p, _ = pd
    rep = start_replica("--role", role, "--pd-peers", f"http://127.0.0.1:{p.port}", capacity_blocks=100)
    listener = Listener()
    try:
        remote = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": listener.port,
                  "remote_request_id": "x"}
        status, out = http_json("POST", rep.url + "/v1/completions",
                                {"prompt": prompt(14), "max_tokens": 2, "kv_transfer_params": remote})
        assert status == 400 and out["error"]["param"] == "kv_transfer_params.remote_host", out
        assert f"127.0.0.1:{listener.port} is not a prefill instance" in out["error"]["message"]
        params = prefill_leg(p, {"prompt": prompt(15)})["kv_transfer_params"]  # a peer's hold: pulled as ever
        status, out = http_json("POST", rep.url + "/v1/completions",
                                {"prompt": prompt(15), "max_tokens": 2, "kv_transfer_params": params})
        assert status == 200 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 159
        time.sleep(0.3)
        assert listener.received == []
    finally:
        listener.close()
        rep.stop()


def test_roles_show_in_health_server_info_and_metrics(pd):
    p, d = pd
    assert http_json("GET", p.url + "/health")[1]["role"] == "prefill"
    assert http_json("GET", d.url + "/server_info")[1]["disaggregation_mode"] == "decode"
    assert stats(p)["pd"]["response_kv"] == "drop" and stats(d)["pd"]["response_kv"] == "keep"
    assert metric(scrape(d.url), "kvemu:pd_role", role="decode") == 1
    assert metric(scrape(p.url), "kvemu:pd_role", role="decode") == 0


def test_an_unpulled_prefill_is_released_after_the_hold_timeout():
    p = start_replica("--role", "prefill", "--pd-hold-timeout-s", "0.5", capacity_blocks=100)
    try:
        params = prefill_leg(p, {"prompt": prompt(8)})["kv_transfer_params"]
        assert stats(p)["pinned_blocks"] == 10
        wait_for(lambda: stats(p)["pinned_blocks"] == 0, timeout=10, what="the hold timeout")
        assert stats(p)["pd"]["expired"] == 1
        assert metric(scrape(p.url), "vllm:nixl_num_kv_expired_reqs_total") == 1
        status, _ = http_json("POST", p.url + "/kv/pull", {"remote_request_id": params["remote_request_id"],
                                                           "bytes": 1, "decoder": "d"}, headers=cluster_auth())
        assert status == 404
    finally:
        assert p.stop() == 0


def test_a_client_that_leaves_while_its_kv_crosses_leaves_nothing_pinned(pd):
    p, _ = pd
    # 1 Mb/s per GPU at time scale 1: the 160-token prompt's 15.7 MB take about two minutes to arrive
    slow = start_replica("--role", "decode", "--pd-link-gbps", "0.001", time_scale=1.0, capacity_blocks=100)
    try:
        params = prefill_leg(p, {"prompt": prompt(9)})["kv_transfer_params"]
        with pytest.raises(OSError):  # TimeoutError: the client gives up and closes
            http("POST", slow.url + "/v1/completions",
                 {"prompt": prompt(9), "max_tokens": 5, "kv_transfer_params": params}, timeout=1.0)
        wait_for(lambda: stats(slow)["pd"]["waiting_for_kv"] == 0, timeout=10, what="the cancel")
        s = stats(slow)
        assert s["pinned_blocks"] == 0 and s["private_blocks"] == 0 and s["pd"]["remote_requests"] == 0
        assert stats(p)["pinned_blocks"] == 0  # the prefill side sent at its own pace and let go
        time.sleep(0.2)
        assert stats(slow)["scheduler"]["running"] == 0
    finally:
        assert slow.stop() == 0


def indexed(proc) -> set[int]:
    """The blocks a router's index holds for ``proc`` after reading its whole event feed."""
    out: set[int] = set()
    feed = http_json("GET", proc.url + "/kv/events?after=0&limit=4096", headers=cluster_auth())[1]
    for batch in feed["batches"]:
        for kind, hashes, *level in batch["events"]:
            if level:
                continue
            if kind == "cleared":
                out.clear()
            elif kind == "stored":
                out.update(hashes)
            elif kind == "removed":
                out.difference_update(hashes)
    return out


def test_both_instances_publish_what_they_store_on_their_own_feeds(pd):
    from shared.hashing import block_hashes

    p, d = pd
    tokens = prompt(11)
    status, _, data = http("POST", p.url + "/v1/completions", {"prompt": tokens, "max_tokens": 1, "stream": True,
                                                              "kv_transfer_params": PROXY_PREFILL})
    assert status == 200
    chunks = [json.loads(e) for e in sse_events(data)[:-1]]
    params = chunks[-1]["kv_transfer_params"]  # a streamed prefill leg: on the last chunk, with the finish
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and params["do_remote_prefill"] is True
    status, _ = http_json("POST", d.url + "/v1/completions",
                          {"prompt": tokens, "max_tokens": 3, "kv_transfer_params": params})
    assert status == 200
    hashes = set(block_hashes(tokens, 16))
    wait_for(lambda: hashes <= indexed(p) and hashes <= indexed(d), what="both feeds")
    # a failed pull: the reservation's blocks leave the feed, the local prefill's come back
    lost = prompt(12)
    params = {**params, "remote_request_id": "pd-p0-gone"}
    assert http_json("POST", d.url + "/v1/completions",
                     {"prompt": lost, "max_tokens": 3, "kv_transfer_params": params})[0] == 200
    wait_for(lambda: set(block_hashes(lost, 16)) <= indexed(d), what="the local prefill's blocks")
    assert not set(block_hashes(lost, 16)) & indexed(p)


def test_two_transfers_at_once_share_the_decoders_nic(pd):
    """One 160-token prompt's KV (15,728,640 bytes) takes 0.5 s on a 0.25165824 Gb/s NIC; two started
    together share it and both arrive after 1 s (processor sharing: each at half the bandwidth)."""
    from concurrent.futures import ThreadPoolExecutor

    p, _ = pd
    d = start_replica("--role", "decode", "--pd-link-gbps", "0.25165824", time_scale=1.0, capacity_blocks=100)
    try:
        alone = prefill_leg(p, {"prompt": prompt(13)})["kv_transfer_params"]
        out = http_json("POST", d.url + "/v1/completions", {"prompt": prompt(13), "max_tokens": 2,
                                                           "kv_transfer_params": alone})[1]
        assert out["kvemu"]["kv_wait_s"] == pytest.approx(0.5 + LATENCY, abs=0.02)
        legs = [(prompt(s), prefill_leg(p, {"prompt": prompt(s)})["kv_transfer_params"]) for s in (14, 15)]
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda leg: http_json("POST", d.url + "/v1/completions", {
                "prompt": leg[0], "max_tokens": 2, "kv_transfer_params": leg[1]})[1], legs))
        for o in outs:
            assert o["kvemu"]["kv_wait_s"] == pytest.approx(1.0 + LATENCY, abs=0.05)
        assert stats(d)["pd"]["recv"]["transfers"] == 3 and stats(d)["pinned_blocks"] == 0
        assert stats(p)["pinned_blocks"] == 0
    finally:
        assert d.stop() == 0


def test_a_client_without_the_token_holds_at_most_its_share_and_the_release_endpoint_ends_holds():
    """A pool of 100 blocks at --pd-hold-share 0.25: a client without the cluster token may hold 25 blocks,
    two 10-block prefill legs; a third is refused (30 > 25), one with the token is not. /health counts what
    holds pin: 90 of 100 blocks is exhausted."""
    p = start_replica("--role", "prefill", "--pd-hold-share", "0.25", capacity_blocks=100, replica_id="p1")
    try:
        first, _ = (prefill_leg(p, {"prompt": prompt(s)})["kv_transfer_params"] for s in (20, 21))
        status, out = http_json("POST", p.url + "/v1/completions", {"prompt": prompt(22), "max_tokens": 1,
                                                                   "kv_transfer_params": PROXY_PREFILL})
        assert status == 429 and out["error"]["param"] == "pd_hold_share", out
        assert "holds 20 blocks" in out["error"]["message"] and "--pd-hold-share 0.25" in out["error"]["message"]
        status, out = http_json("POST", p.url + "/v1/completions", {"prompt": prompt(22), "max_tokens": 1,
                                                                   "kv_transfer_params": PROXY_PREFILL},
                                headers=cluster_auth())
        assert status == 200 and out["kv_transfer_params"]["do_remote_prefill"] is True  # the router's way
        health = http_json("GET", p.url + "/health")[1]
        assert (health["held_blocks"], health["held_usage"], health["holds"]) == (30, 0.3, "ok")

        release = {"remote_request_id": first["remote_request_id"]}
        assert http("POST", p.url + "/kv/release", release)[0] == 401
        status, out = http_json("POST", p.url + "/kv/release", {"remote_request_id": 7}, headers=cluster_auth())
        assert status == 400 and out["error"]["param"] == "remote_request_id"
        assert http_json("POST", p.url + "/kv/release", release, headers=cluster_auth()) == (
            200, {"released": True, "blocks": 10, "replica_id": "p1"})
        assert http_json("POST", p.url + "/kv/release", release, headers=cluster_auth()) == (
            200, {"released": False, "blocks": 0, "replica_id": "p1"})
        prefill_leg(p, {"prompt": prompt(23)})  # 20 of 25 again: admitted
        for s in range(24, 30):  # with the token: 30 + 60 blocks held
            assert http_json("POST", p.url + "/generate", {"token_ids": prompt(s), "kv_transfer_params":
                                                          PROXY_PREFILL}, headers=cluster_auth())[0] == 200
        health = http_json("GET", p.url + "/health")[1]
        assert (health["status"], health["held_blocks"], health["held_usage"], health["holds"]) == (
            "ok", 90, 0.9, "exhausted")
        pd_stats = stats(p)["pd"]
        assert pd_stats["released"] == 1 and pd_stats["hold_share"]["refused"] == 1
        assert pd_stats["held_requests"] == 9 and stats(p)["pinned_blocks"] == 90
    finally:
        assert p.stop() == 0


def test_kvemu_routers_named_legs_are_released_by_name_wherever_they_are():
    """A leg the router named (X-Kvemu-Hold-Id) is released by that name: held (its blocks back), still
    computing (aborted), or not arrived yet (refused when it does)."""
    from concurrent.futures import ThreadPoolExecutor

    p = start_replica("--role", "prefill", capacity_blocks=4000, replica_id="p2", time_scale=1.0)
    try:
        def leg(name: str, tokens: list[int], timeout: float = 30.0):
            return http_json("POST", p.url + "/generate", {"token_ids": tokens, "kv_transfer_params": PROXY_PREFILL},
                             headers={**cluster_auth(), "X-Kvemu-Hold-Id": name}, timeout=timeout)

        def release(name: str):
            return http_json("POST", p.url + "/kv/release", {"hold_id": name}, headers=cluster_auth())

        assert leg("held", prompt(30))[0] == 200 and stats(p)["pd"]["held_blocks"] == 10
        assert release("held") == (200, {"released": True, "blocks": 10, "replica_id": "p2"})
        assert stats(p)["pd"]["held_blocks"] == 0 and stats(p)["pinned_blocks"] == 0

        assert release("early") == (200, {"released": False, "blocks": 0, "replica_id": "p2"})
        status, out = leg("early", prompt(31))
        assert status == 400 and out["error"]["param"] == "X-Kvemu-Hold-Id"
        status, out = leg("no spaces", prompt(31))
        assert status == 400 and out["error"]["param"] == "X-Kvemu-Hold-Id"

        long = prompt(32, blocks=2000)  # 32,000 tokens: emulated seconds of prefill at time scale 1
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(lambda: leg("computing", long, timeout=1.0))
            wait_for(lambda: stats(p)["scheduler"]["running"] == 1, what="the long prefill running")
            status, out = release("computing")
            assert status == 200 and out["released"] is True and out["blocks"] > 0
            with pytest.raises(OSError):  # aborted: no answer (kvemu's router had left it already)
                waiting.result()
        wait_for(lambda: stats(p)["scheduler"]["running"] == 0, what="the abort")
        s = stats(p)
        assert s["scheduler"]["aborted"] == 1 and s["pinned_blocks"] == 0 and s["pd"]["held_requests"] == 0
        assert s["pd"]["released"] == 2
    finally:
        assert p.stop() == 0
