"""`kvemu up --kv-events-config`: every replica publishes vLLM's KV events on its own endpoint
(the base's port plus the replica's index, as vLLM offsets it per data-parallel rank)."""

from __future__ import annotations

import json
import tempfile
import time
import uuid

import msgpack
import pytest
import zmq

from tests.conftest import free_port
from tests.support.kvemu_cli import Up, run_kvemu
from tests.support.procs import http_json

pytestmark = pytest.mark.slow


def test_each_replica_of_up_publishes_on_its_own_endpoint_and_the_routed_one_stores_the_prompt():
    base = f"ipc://{tempfile.gettempdir()}/kvemu-up-ev-{uuid.uuid4().hex[:8]}"
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": base})
    up = Up("--replicas", "2", "--capacity-blocks", "500", "--time-scale", "0", "--port", str(free_port()),
            "--kv-events-config", config)
    ctx = zmq.Context()
    try:
        urls = up.ready()
        subs = []
        for i, endpoint in enumerate((base, f"{base}_dp1")):
            sub = ctx.socket(zmq.SUB)
            sub.connect(endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            subs.append(sub)
            status, stats = http_json("GET", urls[f"replica-{i}"] + "/stats")
            assert stats["kv_events"]["endpoint"] == endpoint
        time.sleep(0.3)
        status, body = http_json("POST", urls["router"] + "/v1/chat/completions",
                                 {"model": "m", "messages": [{"role": "user", "content": "hello " * 200}], "max_tokens": 4})
        assert status == 200, body
        stored = []
        for i, sub in enumerate(subs):
            while sub.poll(1000):
                _, _, payload = sub.recv_multipart()
                stored += [(i, e["block_hashes"]) for e in msgpack.unpackb(payload)[1] if e["type"] == "BlockStored"]
        assert len({i for i, _ in stored}) == 1 and sum(len(h) for _, h in stored) >= 200 // 16
    finally:
        up.cleanup()
        ctx.destroy(linger=0)


def test_a_bad_kv_events_config_stops_up_before_anything_starts():
    res = run_kvemu("up", "--port", str(free_port()), "--kv-events-config", '{"enable_kv_cache_events": true, "hwm": 0}')
    assert res.returncode == 2 and res.stderr.strip().startswith("error: --kv-events-config: hwm"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stdout == ""
