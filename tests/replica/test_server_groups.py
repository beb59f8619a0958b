"""A replica of a model of two KV cache groups (gpt-oss-120b: a 128-token window as group 0, full attention as
group 1) as a real process: vLLM's wire publishes a prompt's blocks in each group, kvemu's feed in the full group
alone, and ``/stats`` has the groups' section."""

import json
import time

import msgpack
import pytest
import zmq

from shared import vllm_hashing
from tests.conftest import free_port
from tests.support.procs import cluster_auth, http_json, start_replica

pytestmark = pytest.mark.slow  # a real process on loopback


def test_a_prompt_is_stored_in_both_groups_on_vllms_wire_and_once_in_kvemus_feed():
    pub = free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{pub}"}
    rep = start_replica("--model", "gpt-oss-120b", "--kv-events-config", json.dumps(config), capacity_blocks=400)
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{pub}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.3)  # the slow joiner
        tokens = list(range(1, 101))  # 6 full blocks of 16 and a partial one
        status, _ = http_json("POST", rep.url + "/generate", {"token_ids": tokens, "max_tokens": 1})
        assert status == 200
        assert sub.poll(5000)
        _, _, payload = sub.recv_multipart()
        events = msgpack.unpackb(payload)[1]
        hashes = [vllm_hashing.external(d) for d in vllm_hashing.block_hashes(tokens, 16)]
        # the chunk's blocks, a BlockStored per group in group order (vLLM's cache_blocks stores group by group)
        assert [(e["type"], e["group_idx"], e["kv_cache_spec_kind"], e.get("kv_cache_spec_sliding_window"),
                 e["block_hashes"], e["token_ids"]) for e in events] == [
            ("BlockStored", 0, "sliding_window", 128, hashes, tokens[:96]),
            ("BlockStored", 1, "full_attention", None, hashes, tokens[:96])]
        _, feed = http_json("GET", rep.url + "/kv/events?after=0", headers=cluster_auth())
        stored = [e for b in feed["batches"] for e in b["events"]]
        assert len(stored) == 1 and stored[0][0] == "stored" and len(stored[0][1]) == 6  # the full group's alone
        _, stats = http_json("GET", rep.url + "/stats")
        assert stats["kv_groups"] == {
            "count": 2, "layers_per_group": 18,
            "groups": [{"group": 0, "kind": "window", "layers": 18, "window": 128, "held_blocks": 0,
                        "window_freed_blocks": 0},
                       {"group": 1, "kind": "full", "layers": 18, "held_blocks": 0}]}  # nothing running now
    finally:
        ctx.destroy(linger=0)
        rep.stop()
