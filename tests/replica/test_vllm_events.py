"""vLLM's KV events from a replica: the hash, the translation, the config, and the wire as real consumers read it.

The live tests subscribe with a ZMQ SUB socket written from vLLM's documented format
(``vllm/distributed/kv_events.py``) and run NVIDIA Dynamo's standalone KV indexer
(``python -m dynamo.indexer``, PyPI ``ai-dynamo-runtime``), which recomputes block hashes
from the published token ids."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
import uuid

import msgpack
import pytest
import zmq

from kvemu.options.kv_events import kv_events_argv
from replica.core.cache.pool import KvEvent
from replica.vllm_events import EventTranslator, binds
from shared import tokenizer, vllm_hashing
from shared.errors import InputError
from shared.hashing import block_hashes
from shared.kv_events_config import KvEventsConfig, offset_port
from tests.conftest import free_port
from tests.support.procs import REPO, http_json, start_replica


# ---- vLLM's block hash ------------------------------------------------------------------
def test_sha256_cbor_is_sha256_of_the_canonical_cbor_of_parent_tokens_and_no_extra_keys():
    parent = bytes(range(32))
    # canonical CBOR by hand: array(3) [bytes(32), array(4) [1, 2, 3, 24], null]
    encoded = b"\x83" + b"\x58\x20" + parent + b"\x84\x01\x02\x03\x18\x18" + b"\xf6"
    assert vllm_hashing.block_hash(vllm_hashing.sha256_cbor, parent, [1, 2, 3, 24]) == hashlib.sha256(encoded).digest()


def test_block_hashes_chain_from_the_seed_and_skip_the_partial_tail():
    seed_digest = vllm_hashing.none_hash("sha256_cbor", "vllm-none-hash")
    # the seed string in canonical CBOR: text(14) "vllm-none-hash"
    assert seed_digest == hashlib.sha256(b"\x6e" + b"vllm-none-hash").digest()
    tokens = list(range(10))
    hashes = vllm_hashing.block_hashes(tokens, 4, "sha256_cbor")
    assert len(hashes) == 2  # 10 tokens: two full blocks of 4, the last 2 unhashed
    first = vllm_hashing.block_hash(vllm_hashing.sha256_cbor, seed_digest, [0, 1, 2, 3])
    assert hashes == [first, vllm_hashing.block_hash(vllm_hashing.sha256_cbor, first, [4, 5, 6, 7])]
    assert vllm_hashing.external(first) == int.from_bytes(first[-8:], "big")  # the low 64 bits
    assert vllm_hashing.block_hashes(tokens, 4, "sha256", "other") != vllm_hashing.block_hashes(tokens, 4, "sha256")


# ---- translation: pool events -> vLLM's events ---------------------------------------------
def _chat_blocks(bs: int = 4, n: int = 3):
    tokens = list(range(100, 100 + bs * n + 2))
    return tokens, block_hashes(tokens, bs)


def test_a_stored_prompt_is_one_block_stored_with_its_tokens_and_vllm_hashes():
    tokens, hashes = _chat_blocks()
    t = EventTranslator(4, "map", "sha256_cbor")
    t.register(hashes, tokens)
    [ev] = t.translate([KvEvent("stored", tuple(hashes))])
    expected = [vllm_hashing.external(d) for d in vllm_hashing.block_hashes(tokens, 4, "sha256_cbor")]
    assert ev == {"type": "BlockStored", "block_hashes": expected, "parent_block_hash": None,
                  "token_ids": tokens[:12], "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None}
    # the next turn extends it: its new blocks name the last one as their parent
    more = tokens + [7, 7, 7, 7, 7, 7]
    longer = block_hashes(more, 4)
    t.register(longer, more)
    [ev2] = t.translate([KvEvent("stored", tuple(longer[3:]))])
    assert ev2["parent_block_hash"] == expected[-1] and ev2["token_ids"] == more[12:20]
    # removal names the same hashes, and a tier's events carry its medium
    [removed] = t.translate([KvEvent("removed", (hashes[0],))])
    assert removed == {"type": "BlockRemoved", "block_hashes": [expected[0]], "medium": "GPU"}


def test_array_encoding_leads_with_the_tag_and_keeps_field_order():
    tokens, hashes = _chat_blocks(n=1)
    t = EventTranslator(4, "array", "sha256", level_names=("host", "ssd"))
    t.register(hashes, tokens)
    stored, demoted, cleared = t.translate([KvEvent("stored", tuple(hashes)), KvEvent("stored", tuple(hashes), 1),
                                            KvEvent("cleared", ())])
    h = vllm_hashing.external(vllm_hashing.block_hashes(tokens, 4, "sha256")[0])
    assert stored == ["BlockStored", [h], None, tokens[:4], 4, None, "GPU", None]
    assert demoted[0] == "BlockStored" and demoted[6] == "CPU"
    assert cleared == ["AllBlocksCleared"]


def test_hash_only_requests_publish_their_hashes_without_tokens_and_runs_split_at_gaps():
    t = EventTranslator(16)
    t.register([11, 12, 13])  # a trace client: hashes, no tokens
    t.register([11, 12, 99])  # another branch after 12
    a, b = t.translate([KvEvent("stored", (11, 12, 13, 99), 2)])  # 99's parent is 12, not 13: two runs
    assert a["block_hashes"] == [11, 12, 13] and a["token_ids"] == [] and a["parent_block_hash"] is None
    assert b["block_hashes"] == [99] and b["parent_block_hash"] == 12 and a["medium"] == b["medium"] == "DISK"


def test_a_block_held_by_two_levels_keeps_its_hash_until_both_drop_it():
    tokens, hashes = _chat_blocks(n=1)
    t = EventTranslator(4, pending_max=1)
    t.register(hashes, tokens)
    ext = t.translate([KvEvent("stored", tuple(hashes))])[0]["block_hashes"]
    t.translate([KvEvent("stored", tuple(hashes), 1)])
    t.register([1, 2, 3])  # the bounded table of blocks not held forgets nothing held
    assert t.translate([KvEvent("removed", tuple(hashes))])[0]["block_hashes"] == ext
    assert t.translate([KvEvent("removed", tuple(hashes), 1)])[0]["block_hashes"] == ext


# ---- the config ----------------------------------------------------------------------
@pytest.mark.parametrize("text, words", [
    ("{", "is not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"enable_kv_cache_events": false}', "nothing would be published"),
    ('{"enable_kv_cache_events": true, "publisher": "null"}', "publishes nothing"),
    ('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}', "unknown key 'endpont'"),
    ('{"enable_kv_cache_events": true, "endpoint": 5557}', "endpoint must be a ZMQ address"),
    ('{"enable_kv_cache_events": true, "hwm": -1}', "hwm must be an integer"),
    ('{"enable_kv_cache_events": true, "buffer_steps": null}', "buffer_steps must be an integer"),
    ('{"enable_kv_cache_events": true, "event_encoding": "tuple"}', "event_encoding must be one of map, array"),
    ('{"enable_kv_cache_events": true, "hash_algo": "md5"}', "hash_algo must be one of sha256, sha256_cbor"),
    ("[" * 100000 + "]" * 100000, "is not JSON"),
])
def test_bad_configs_name_the_problem(text, words):
    with pytest.raises(InputError, match="--kv-events-config") as err:
        KvEventsConfig.parse(text)
    assert words in str(err.value)


def test_bind_or_connect_follows_vllm_and_up_offsets_each_replicas_ports():
    assert binds("tcp://*:5557") and binds("ipc:///tmp/x") and binds("inproc://x") and binds("tcp://[::]:1")
    assert not binds("tcp://127.0.0.1:5557")
    assert offset_port("tcp://*:5557", 2) == "tcp://*:5559" and offset_port("ipc:///tmp/ev", 1) == "ipc:///tmp/ev_dp1"

    class Args:
        kv_events_config = '{"enable_kv_cache_events": true, "replay_endpoint": "tcp://127.0.0.1:6000", "topic": "kv"}'

    flag, value = kv_events_argv(Args(), 3)
    assert flag == "--kv-events-config"
    assert json.loads(value) == {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:5560",
                                 "replay_endpoint": "tcp://127.0.0.1:6003", "topic": "kv"}


# ---- live: a replica and a subscriber written from vLLM's format ----------------------------
def _chat(url: str, messages: list[dict], max_tokens: int = 40) -> dict:
    status, body = http_json("POST", url + "/v1/chat/completions",
                             {"model": "m", "messages": messages, "max_tokens": max_tokens})
    assert status == 200, body
    return body


def _next_turn(messages: list[dict], reply: dict, text: str) -> list[dict]:
    return [*messages, {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
            {"role": "user", "content": text}]


def _drain(sub: zmq.Socket, wait_s: float = 1.0) -> list[tuple[bytes, int, list]]:
    out = []
    while sub.poll(int(wait_s * 1000)):
        topic, seq, payload = sub.recv_multipart()
        out.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
        wait_s = 0.3
    return out


@pytest.fixture
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_a_subscriber_sees_each_step_as_vllm_sends_it_and_replay_resends_it(zmq_ctx):
    pub, replay = free_port(), free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{pub}", "topic": "kv@replica",
              "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    rep = start_replica("--kv-events-config", json.dumps(config), capacity_blocks=400)
    try:
        sub = zmq_ctx.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{pub}")
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        time.sleep(0.3)  # the slow joiner
        messages = [{"role": "user", "content": "tell me about caches " * 30}]
        first = _chat(rep.url, messages)
        second_turn = _next_turn(messages, first, "and more please")
        second = _chat(rep.url, second_turn)
        frames = _drain(sub)
        assert [seq for _, seq, _ in frames] == list(range(len(frames))) and frames
        assert all(topic == b"kv@replica" for topic, _, _ in frames)
        ts, events, rank = frames[0][2]
        assert abs(ts - time.time()) < 60 and rank == 0
        stored = [e for _, _, (_, evs, _) in frames for e in evs if e["type"] == "BlockStored"]
        assert all(e["medium"] == "GPU" and e["block_size"] == 16 and len(e["token_ids"]) == 16 * len(e["block_hashes"])
                   for e in stored)
        # the first turn's prompt blocks, with vLLM's hashes of its tokens
        tokens = tokenizer.encode(tokenizer.chat_template(messages))
        prompt = [vllm_hashing.external(d) for d in vllm_hashing.block_hashes(tokens, 16)]
        assert stored[0]["block_hashes"] == prompt and stored[0]["token_ids"] == tokens[:16 * len(prompt)]
        # the second turn hit what the first stored (its prompt and its response) and stored the rest
        published = [h for e in stored for h in e["block_hashes"]]
        tokens2 = tokenizer.encode(tokenizer.chat_template(second_turn))
        hashes2 = [vllm_hashing.external(d) for d in vllm_hashing.block_hashes(tokens2, 16)]
        hit = second["usage"]["prompt_tokens_details"]["cached_tokens"] // 16
        assert hit > len(prompt) and hashes2[:hit] == published[:hit]  # the response's blocks were published too
        # replay from seq 1: every batch from there, then the end marker
        dealer = zmq_ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay}")
        dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = []
        while True:
            assert dealer.poll(5000)
            _, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                break
            replayed.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
        assert replayed == [(seq, body) for _, seq, body in frames[1:]]
        status, stats = http_json("GET", rep.url + "/stats")
        assert stats["kv_events"]["batches"] == len(frames) and stats["kv_events"]["replay_requests"] == 1
    finally:
        rep.stop()


def test_demotions_to_the_host_tier_are_published_with_the_cpu_medium(zmq_ctx):
    path = f"ipc://{tempfile.gettempdir()}/kvemu-ev-{uuid.uuid4().hex[:8]}"
    config = {"enable_kv_cache_events": True, "endpoint": path, "event_encoding": "array"}
    rep = start_replica("--kv-events-config", json.dumps(config), "--host-cache-gib", "1", capacity_blocks=40)
    try:
        sub = zmq_ctx.socket(zmq.SUB)
        sub.connect(path)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.3)
        for k in range(4):  # four conversations of ~20 blocks each through a 40-block HBM
            _chat(rep.url, [{"role": "user", "content": f"conversation {k} " * 120}], max_tokens=8)
        events = [e for _, _, (_, evs, _) in _drain(sub) for e in evs]
        assert all(isinstance(e, list) for e in events)  # the array encoding: tag first
        media = {(e[0], e[6] if e[0] == "BlockStored" else e[2]) for e in events}
        assert {("BlockStored", "GPU"), ("BlockRemoved", "GPU"), ("BlockStored", "CPU")} <= media
    finally:
        rep.stop()


def test_an_endpoint_in_use_is_one_line_at_start():
    port = free_port()
    ctx = zmq.Context()
    holder = ctx.socket(zmq.PUB)
    holder.bind(f"tcp://127.0.0.1:{port}")
    try:
        config = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"})
        res = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--port", str(free_port()), "--capacity-blocks", "100",
                              "--kv-events-config", config], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert res.returncode == 2, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and "--kv-events-config" in lines[0] and "in use" in lines[0], res.stderr
        assert "Traceback" not in res.stderr
    finally:
        holder.close(linger=0)
        ctx.term()


# ---- live: NVIDIA Dynamo's standalone KV indexer ----------------------------------------------
def _dynamo_indexer(port: int) -> subprocess.Popen:
    pytest.importorskip("dynamo", reason="ai-dynamo-runtime (the dev extra) provides python -m dynamo.indexer")
    proc = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if http_json("GET", f"http://127.0.0.1:{port}/health", timeout=1.0)[0] == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"dynamo.indexer did not start: {proc.communicate()[0][-2000:]!r}")


def test_dynamos_indexer_finds_each_session_on_the_replica_that_holds_it():
    indexer_port = free_port()
    indexer = _dynamo_indexer(indexer_port)
    replicas = []
    try:
        base = f"{tempfile.gettempdir()}/kvemu-dyn-{uuid.uuid4().hex[:8]}"
        for k, encoding in enumerate(("map", "array")):
            config = {"enable_kv_cache_events": True, "endpoint": f"ipc://{base}-{k}",
                      "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", "event_encoding": encoding}
            rep = start_replica("--kv-events-config", json.dumps(config), capacity_blocks=2000)
            replicas.append(rep)
            status, body = http_json("POST", f"http://127.0.0.1:{indexer_port}/register",
                                     {"instance_id": k + 1, "endpoint": config["endpoint"], "model_name": "kvemu",
                                      "block_size": 16, "replay_endpoint": config["replay_endpoint"]})
            assert status == 201, body
        time.sleep(1.0)  # its listeners connect
        for k, rep in enumerate(replicas):  # one conversation per replica, two turns each
            messages = [{"role": "user", "content": f"session {k}: explain prefix caching " * 25}]
            reply = _chat(rep.url, messages)
            messages = _next_turn(messages, reply, "go on")
            reply = _chat(rep.url, messages)
            messages = _next_turn(messages, reply, "and then?")
            tokens = tokenizer.encode(tokenizer.chat_template(messages))
            deadline, scores = time.monotonic() + 10, {}
            while time.monotonic() < deadline:
                status, body = http_json("POST", f"http://127.0.0.1:{indexer_port}/query",
                                         {"token_ids": tokens, "model_name": "kvemu"})
                assert status == 200, body
                scores = body["scores"]
                if scores.get(str(k + 1), {}).get("0", 0) >= 16 * (len(tokens) // 16) - 64:
                    break
                time.sleep(0.2)
            # it names this replica only, with what the replica then serves from cache
            assert set(scores) == {str(k + 1)}, scores
            served = _chat(rep.url, messages)["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert scores[str(k + 1)]["0"] == served > 0, (scores, served)
    finally:
        for rep in replicas:
            rep.stop()
        indexer.kill()
        indexer.wait()


# ---- kvemu kv-events: the consumer users run ------------------------------------------------
def test_kv_events_decodes_both_encodings_and_refuses_what_is_not_an_event():
    from kvemu.kv_events_cmd import decode_batch, decode_event

    assert decode_event(["BlockRemoved", [1, 2], "CPU"]) == {"type": "BlockRemoved", "block_hashes": [1, 2],
                                                             "medium": "CPU"}
    assert decode_event({"type": "AllBlocksCleared"}) == {"type": "AllBlocksCleared"}
    assert decode_event(["BlockStored", [b"\x01\x02"], None, [5], 1, None, "GPU", None])["block_hashes"] == ["0102"]
    with pytest.raises(ValueError, match="not a KV event"):
        decode_event(["Nope"])
    batch = decode_batch(b"t", (7).to_bytes(8, "big"), msgpack.packb([1.5, [["AllBlocksCleared"]], 0]))
    assert batch == {"seq": 7, "topic": "t", "ts": 1.5, "data_parallel_rank": 0, "events": [{"type": "AllBlocksCleared"}]}


def test_kvemu_kv_events_prints_a_replicas_replayed_batches_as_json_lines():
    replay = free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{free_port()}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    rep = start_replica("--kv-events-config", json.dumps(config), capacity_blocks=400)
    try:
        _chat(rep.url, [{"role": "user", "content": "print my events " * 20}])
        res = subprocess.run([sys.executable, "-m", "kvemu", "kv-events", "--replay", f"tcp://127.0.0.1:{replay}",
                              "--batches", "5", "--timeout", "5"], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert res.returncode == 0, res.stderr
        lines = [json.loads(line) for line in res.stdout.splitlines()]
        assert [b["seq"] for b in lines] == list(range(len(lines))) and 1 <= len(lines) <= 5
        assert lines[0]["events"][0]["type"] == "BlockStored" and lines[0]["events"][0]["medium"] == "GPU"
        bad = subprocess.run([sys.executable, "-m", "kvemu", "kv-events", "--from-seq", "3"], capture_output=True,
                             text=True, timeout=60, cwd=REPO)
        assert bad.returncode == 2 and bad.stderr.strip() == "error: --from-seq: needs --replay (the live socket has no history)"
    finally:
        rep.stop()
