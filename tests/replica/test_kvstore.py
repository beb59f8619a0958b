"""The shared KV store live (replica/kvstore/): `kvemu store` as a real process on loopback, with hand-worked
expectations; a replica using it through its mirror; the replica's degraded mode when the store dies or
answers garbage, and its resync when a store answers again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from replica.core.cache.types import Lookup
from replica.core.tiers.shared import SharedSettings
from replica.kvstore.mirror import MirrorStore
from tests.conftest import free_port
from tests.support.procs import REPO, Proc, cluster_auth, http, http_json

# qwen3-coder-30b-a3b: 1.5 MiB per 16-token block, so 0.01 GiB = 6 blocks
BLOCK = 1572864
STORE = ("--shared-cache-gib", "0.01")


def start_store(*extra: str, port: int | None = None, time_scale: str = "0") -> Proc:
    port = port or free_port()
    proc = Proc(["-m", "kvemu", "store", "--port", str(port), "--time-scale", time_scale, *STORE, *extra], port)
    proc.wait_healthy()
    return proc


def test_the_mirror_follows_events_and_takes_no_writes_while_the_store_is_away():
    m = MirrorStore(SharedSettings(6), emit_events=False)
    queued = []
    m.notify = lambda: queued.append(1)
    assert m.admit_absent([1, 2]) == [] and m.mirror.skipped_writes == 2  # unreachable: nothing planned
    m.available = True
    assert m.admit_absent([1, 2]) == [1, 2] and 1 in m.held and m.take() == ([(1,), (2,)], []) and queued
    m.apply("stored", [3, 4])
    m.apply("removed", [1])
    assert sorted(m.held) == [2, 3, 4]
    m.acquire(Lookup([2, 3, 9]))
    assert m.take() == ([], [2, 3])
    m.refused([4])
    assert sorted(m.held) == [2, 3]
    held = m.held
    m.apply("cleared", [])
    assert m.held is held and not held  # cleared in place: the stack's queries hold this dict


@pytest.mark.slow
def test_the_store_stores_evicts_reads_and_publishes_a_replica_format_feed():
    store = start_store()
    auth = cluster_auth()
    try:
        status, body = http_json("GET", store.url + "/health")
        assert body["blocks"] == 6 and body["chunk_blocks"] == 1 and body["block_bytes"] == BLOCK and body["level"] == 3
        assert body["store_id"] == body["pool_id"] == "shared-store"  # pool_id: its name until this release
        assert http("POST", store.url + "/kv/write", {"chunks": [[1]]})[0] == 401  # the cluster token, always
        assert http("GET", store.url + "/kv/events")[0] == 401

        def write(chunks, now=0.0):
            status, out = http_json("POST", store.url + "/kv/write", {"replica_id": "r0", "now": now, "chunks": chunks},
                                    headers=auth)
            assert status == 200, out
            return out

        assert write([[1], [2], [3]]) == {"written": 3, "present": 0, "refused": [], "used_blocks": 3}
        # 3 is there (and becomes the most recently used); 4, 5, 6 fill the store to 6 blocks, above the 90%
        # watermark (5.4): Mooncake's round evicts 5% of the objects, at least one: the least recently used, 1
        assert write([[3], [4], [5], [6]]) == {"written": 3, "present": 1, "refused": [], "used_blocks": 5}
        status, read = http_json("POST", store.url + "/kv/read", {"replica_id": "r1", "hashes": [2, 1, 99]}, headers=auth)
        assert status == 200 and (read["held"], read["missing"]) == (1, 2)
        assert read["ready_at"] > read["now"]  # one block across the aggregate link
        assert write([[7]], now=1.0)["used_blocks"] == 5  # evicts 3 (2 was read since: used more recently)

        status, feed = http_json("GET", store.url + "/kv/events?after=0", headers=auth)
        assert feed["replica_id"] == "shared-store" and feed["batches"][0]["seq"] == 1
        events = [e for b in feed["batches"] for e in b["events"]]
        assert events == [["stored", [h], 3] for h in (1, 2, 3, 4, 5, 6)] + [["removed", [1], 3], ["stored", [7], 3],
                                                                              ["removed", [3], 3]]
        assert feed["next_seq"] == 10
        status, stats = http_json("GET", store.url + "/stats")
        assert (stats["writes"], stats["evictions"], stats["reads"], stats["refused_writes"]) == (7, 2, 1, 0)
        assert stats["read_missing_blocks"] == 2 and stats["bytes_moved"] == 8 * BLOCK
        assert stats["at_risk"] == {"chunks": 5, "blocks": 5, "bytes": 5 * BLOCK}
        metrics = http("GET", store.url + "/metrics")[2].decode()
        assert 'kvemu_store_used_blocks{store="shared-store"} 5.0' in metrics
        assert 'kvemu_store_evictions_total{store="shared-store"} 2.0' in metrics
        assert 'kvemu_pool_used_blocks{pool="shared-store"} 5.0' in metrics  # the old name, for one release

        # bad input: a 400 naming the field, counted
        status, err = http_json("POST", store.url + "/kv/write", {"chunks": [["x"]]}, headers=auth)
        assert status == 400 and "chunk" in err["error"]["param"]
        status, err = http_json("POST", store.url + "/kv/read", {"hashes": "nope"}, headers=auth)
        assert status == 400 and err["error"]["param"] == "hashes"
        # a resync: cleared, then one stored event per chunk held
        assert http("POST", store.url + "/kv/resync", headers=auth)[0] == 200
        status, feed = http_json("GET", store.url + "/kv/events?after=9", headers=auth)
        events = [e for b in feed["batches"] for e in b["events"]]
        assert events[0] == ["cleared", []] and sorted(e[1][0] for e in events[1:]) == [2, 4, 5, 6, 7]
    finally:
        assert store.stop() == 0
    log = store.proc.stderr.read().decode()
    assert "loses everything it held (5 chunks, 5 blocks" in log


def generate(url: str, first: int, blocks: int) -> dict:
    status, out = http_json("POST", url + "/generate",
                            {"token_ids": list(range(first, first + 16 * blocks)), "max_tokens": 1})
    assert status == 200, out
    return out


def wait_for(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def start_store_replica(store_url: str) -> Proc:
    port = free_port()
    proc = Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "8", "--time-scale", "0", "--fetch",
                 "always", "--shared-store-url", store_url, *STORE], port)
    proc.wait_healthy()
    return proc


def replica_view(url: str) -> tuple[dict, dict]:
    return http_json("GET", url + "/health")[1], http_json("GET", url + "/stats")[1]


@pytest.mark.slow
def test_a_replica_reads_back_what_it_evicted_and_carries_on_when_the_store_dies_then_resyncs():
    port = free_port()
    store = start_store(port=port)
    replica = start_store_replica(store.url)
    garbage = None
    try:
        assert wait_for(lambda: replica_view(replica.url)[0].get("shared_store") == "ok")
        generate(replica.url, 0, 4)  # A: 4 blocks
        generate(replica.url, 1000, 4)  # B: HBM's 8 blocks are full
        generate(replica.url, 2000, 4)  # C: A's 4 blocks are evicted, written to the shared store
        assert wait_for(lambda: http_json("GET", store.url + "/stats")[1]["used_blocks"] == 4)
        again = generate(replica.url, 0, 4)  # A again: read back from the shared store
        assert again["cached_tokens"] == 48  # as from host memory: 3 of its 4 blocks (vLLM's last-block rule)
        _, st = replica_view(replica.url)
        assert st["tiers"]["fetched_blocks"] == 4 and st["tiers"]["shared_block_hit_ratio"] == pytest.approx(4 / 16)
        assert wait_for(lambda: http_json("GET", store.url + "/stats")[1]["reads"] == 4)

        store.stop(signal.SIGKILL)  # the store dies: the replica serves on from HBM
        assert wait_for(lambda: replica_view(replica.url)[0]["shared_store"] == "unreachable")
        for first in (3000, 0, 4000, 1000):
            generate(replica.url, first, 4)
        health, st = replica_view(replica.url)
        assert health["status"] == "ok" and st["shared_store"]["failures"] >= 1 and st["shared_store"]["outages"] == 1
        assert st["shared_store"]["mirror"]["mirrored_blocks"] == 0  # nothing planned from a store that is gone
        assert st["pinned_blocks"] == 0 and st["tiers"]["fetched_blocks"] == 4  # no fetch from it, nothing pinned
        assert st["shared_store"]["mirror"]["skipped_write_chunks"] > 0  # evictions while it was away: dropped

        # something else answers on its port: garbage is an outage too, counted
        garbage = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                   cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: replica_view(replica.url)[1]["shared_store"]["garbage"] >= 1)
        assert replica_view(replica.url)[0]["shared_store"] == "unreachable"
        garbage.terminate()
        garbage.wait(10)

        store = start_store(port=port)  # a store again (a new, empty store): the replica resyncs and writes to it
        assert wait_for(lambda: replica_view(replica.url)[0]["shared_store"] == "ok")
        for first in (5000, 6000):
            generate(replica.url, first, 4)
        assert wait_for(lambda: http_json("GET", store.url + "/stats")[1]["used_blocks"] >= 4)
        _, st = replica_view(replica.url)
        assert st["shared_store"]["mirror"]["mirrored_blocks"] >= 4 and st["pinned_blocks"] == 0
    finally:
        if garbage is not None and garbage.poll() is None:
            garbage.kill()
            garbage.wait()
        assert replica.stop() == 0
        store.stop()
    assert "unreachable" in replica.proc.stderr.read().decode()


@pytest.mark.slow
def test_a_store_down_at_start_or_shaped_otherwise_is_one_line():
    port = free_port()
    res = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--capacity-blocks", "8", "--shared-store-url",
                          f"http://127.0.0.1:{port}", *STORE], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and "Traceback" not in res.stderr and "--shared-store-url" in res.stderr
    assert "no shared KV store answers" in res.stderr
    store = start_store(port=port)
    try:
        res = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--capacity-blocks", "8", "--shared-store-url", store.url,
                              "--shared-cache-gib", "0.02"], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert res.returncode != 0 and "has blocks 6, this replica's flags say 13" in res.stderr, res.stderr
    finally:
        store.stop()
    for flags, field in ((["--shared-cache-gib", "0.01"], "--shared-chunk-tokens"),):
        res = subprocess.run([sys.executable, "-m", "kvemu", "replica", "--capacity-blocks", "8", "--shared-chunk-tokens", "24",
                              "--shared-store-url", "http://127.0.0.1:1", *flags], cwd=REPO, capture_output=True,
                             text=True, timeout=30)
        assert res.returncode == 2 and field in res.stderr and "Traceback" not in res.stderr, res.stderr
