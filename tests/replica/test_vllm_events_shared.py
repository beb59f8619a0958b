"""A shared KV store's vLLM KV events (issue 45): ``replica.vllm_events.store_publisher`` publishes the store's
stored / removed events on the store's own endpoint, every one with medium ``SHARED``, kvemu's hashes (not
registered with tokens: one BlockStored per block) and no tokens; a ZMQ subscriber reads them live and
``kvemu kv-events`` (the consumer written from vLLM's format) replayed."""

from __future__ import annotations

import json
import subprocess
import time

import zmq

from kvemu.kv_events_cmd import decode_batch
from replica.core.cache.pool import KvEvent
from replica.core.tiers.shared import SharedSettings, SharedStore
from replica.vllm_events import SHARED_MEDIUM, EventTranslator, store_publisher
from shared.kv_events_config import KvEventsConfig
from tests.conftest import free_port
from tests.support.kvemu_cli import REPO, kvemu_cmd


def test_every_event_of_a_store_has_the_shared_medium_whatever_its_level():
    tr = EventTranslator(16, medium=SHARED_MEDIUM)
    out = tr.translate([KvEvent("stored", (5, 6), 3), KvEvent("stored", (7,)), KvEvent("removed", (5,), 3),
                        KvEvent("cleared", ())])
    assert [(e["type"], e.get("medium"), e.get("block_hashes")) for e in out] == [
        ("BlockStored", "SHARED", [5]), ("BlockStored", "SHARED", [6]), ("BlockStored", "SHARED", [7]), ("BlockRemoved", "SHARED", [5]),
        ("AllBlocksCleared", None, None)]
    assert out[0]["token_ids"] == [] and out[0]["parent_block_hash"] is None


def test_kvemu_kv_events_reads_a_stores_events_live_and_replayed():
    pub, replay = free_port(), free_port()
    config = KvEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{pub}",  # a wildcard binds (vLLM)
                            replay_endpoint=f"tcp://127.0.0.1:{replay}", topic="store")
    publisher = store_publisher(config, 16)
    store = SharedStore(SharedSettings(blocks=4, eviction="lru"))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.connect(f"tcp://127.0.0.1:{pub}")
        sub.setsockopt(zmq.SUBSCRIBE, b"store")
        time.sleep(0.5)  # a PUB socket drops what it sends before the subscriber joined (ZMQ's slow joiner)
        store.admit([1, 2, 3, 4], now=0.0)  # four chunks of one block
        publisher.publish(store.drain_events())
        store.admit([9], now=1.0)  # full: LRU evicts block 1 first
        publisher.publish(store.drain_events())
        live = []
        for _ in range(2):
            assert sub.poll(10_000), "no batch from the store's publisher"
            topic, seq, payload = sub.recv_multipart()
            live.append(decode_batch(topic, seq, payload))
        assert [[(e["type"], e["block_hashes"], e["medium"]) for e in b["events"]] for b in live] == [
            [("BlockStored", [1], "SHARED"), ("BlockStored", [2], "SHARED"), ("BlockStored", [3], "SHARED"),
             ("BlockStored", [4], "SHARED")],
            [("BlockRemoved", [1], "SHARED"), ("BlockStored", [9], "SHARED")]]
        assert [b["seq"] for b in live] == [0, 1]
        res = subprocess.run(kvemu_cmd("kv-events", "--replay", f"tcp://127.0.0.1:{replay}", "--from-seq", "1",
                                       "--timeout", "10"), cwd=REPO, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        replayed = [json.loads(line) for line in res.stdout.splitlines()]
        assert [b["seq"] for b in replayed] == [1] and replayed[0]["events"] == live[1]["events"]
        assert publisher.stats()["batches"] == 2
    finally:
        sub.close(linger=0)
        ctx.term()
        publisher.shutdown()
