"""Data-parallel ranks in a live replica (replica/dp.py): the feed numbers each rank's events apart, the index keys
them by rank, and a replica process of two ranks serves, publishes and reports per rank as vLLM does."""

from __future__ import annotations

import json
import time

import msgpack
import pytest
import zmq

from replica.core.cache.pool import KvEvent
from replica.events import EventFeed
from replica.shipper import index_position
from router.strategies import RoutingSettings, chosen_rank, fold_ranks
from shared.index import EventBatch, MemoryIndex
from shared.index.base import dp_rank_key, split_dp_rank
from tests.conftest import free_port
from tests.support.cluster import metric, scrape, start_router, stop_all, wait_for
from tests.support.procs import http_json, start_replica


def test_each_rank_numbers_its_own_events_and_a_resync_republishes_every_rank():
    held = {0: [KvEvent("stored", (1, 2))], 1: [KvEvent("stored", (7,))]}
    feed = EventFeed("r", lambda: [], rank_snapshots=[lambda: held[0], lambda: held[1]])
    feed.publish([KvEvent("stored", (1, 2))], 0)
    feed.publish([KvEvent("stored", (7,))], 1)
    feed.publish([KvEvent("removed", (2,))], 0)
    wire = [b.to_wire() for b in feed.since(0)]
    assert [(w["seq"], w["dp_rank"], w["rank_seq"]) for w in wire] == [(1, 0, 1), (2, 1, 1), (3, 0, 2)]
    assert [index_position("r", b) for b in feed.since(0)] == [("r/dp0", 1), ("r/dp1", 1), ("r/dp0", 2)]
    feed.request_resync()  # each rank: cleared, then what it holds, numbered on from its own last
    assert [(b.dp_rank, b.rank_seq, [e.kind for e in b.events]) for b in feed.since(3)] == [
        (0, 3, ["cleared", "stored"]), (1, 2, ["cleared", "stored"])]
    assert [(b.dp_rank, b.rank_seq) for b in feed.heartbeats()] == [(0, 5), (1, 4)]
    with pytest.raises(ValueError, match="rank"):
        feed.publish([KvEvent("stored", (3,))])  # a data-parallel replica's events always name their rank


def test_the_index_keys_blocks_by_rank_and_a_router_folds_them_into_the_replica_and_its_best_rank():
    index = MemoryIndex()
    index.apply_sync(EventBatch(dp_rank_key("a", 0), "e", 1, [["stored", [1]]]))
    index.apply_sync(EventBatch(dp_rank_key("a", 1), "e", 1, [["stored", [1, 2, 3]]]))
    index.apply_sync(EventBatch("b", "e", 1, [["stored", [1, 2]]]))
    overlap = index.lookup_sync([1, 2, 3, 4])
    assert overlap == {"a/dp0": 1, "a/dp1": 3, "b": 2}
    assert fold_ranks(overlap) == ({"a": 3, "b": 2}, {"a": 1})
    # a level's run follows its rank's HBM prefix; equal prefixes go to the lowest rank
    assert fold_ranks({"a/dp0": 2, "a/dp1": 2, "a/dp0#1": 4, "a/dp1#1": 9}) == ({"a": 2, "a#1": 4}, {"a": 0})
    assert split_dp_rank("replica-0/dp12") == ("replica-0", 12) and split_dp_rank("x/dpy") == ("x/dpy", None)
    # the rank named (live and in the simulator): the best rank where the decision counted on a prefix, else none
    ranks, idle, s = fold_ranks(overlap)[1], {0: 0, 1: 0}, RoutingSettings()
    assert [chosen_rank(ranks, "a", 3, idle, s), chosen_rank(ranks, "a", 0, idle, s),
            chosen_rank(ranks, "b", 2, {}, s)] == [1, None, None]


def test_chosen_rank_names_the_least_loaded_rank_where_the_ranks_in_flight_are_imbalanced():
    s = RoutingSettings(balance_abs_threshold=2, balance_rel_threshold=1.5)
    prefix_on_1 = {"a": 1}  # fold_ranks': a's prefix is on rank 1
    # 3 - 0 > 2 and 3 > 1.5 x 0: imbalanced, rank 0 the least loaded
    assert chosen_rank(prefix_on_1, "a", 3, {0: 0, 1: 3}, s) == 0
    # a spread of 2 is not past 2 (strict): the prefix's rank
    assert chosen_rank(prefix_on_1, "a", 3, {0: 1, 1: 3}, s) == 1
    # 9 - 6 > 2 but 9 is not past 1.5 x 6 (strict): the prefix's rank
    assert chosen_rank(prefix_on_1, "a", 3, {0: 6, 1: 9}, s) == 1
    # 10 - 6 > 2 and 10 > 9: imbalanced; of three ranks, 0 and 2 tie as the least loaded: the lowest, 0
    assert chosen_rank(prefix_on_1, "a", 3, {0: 6, 1: 10, 2: 6}, s) == 0
    # imbalanced, the prefix's rank the least loaded itself: it stays
    assert chosen_rank({"a": 0}, "a", 3, {0: 0, 1: 9}, s) == 0
    # the decision counted on no prefix: no rank named, whatever the loads (the replica balances its ranks)
    assert chosen_rank(prefix_on_1, "a", 0, {0: 0, 1: 9}, s) is None


def _generate(url: str, tokens: list[int], rank: str | None = None) -> tuple[int, dict]:
    headers = {"X-data-parallel-rank": rank} if rank is not None else None
    return http_json("POST", url + "/generate", {"token_ids": tokens, "max_tokens": 2}, headers=headers)


def _batches(sub: zmq.Socket) -> list:
    out = []
    while sub.poll(1000):
        _topic, _seq, payload = sub.recv_multipart()
        out.append(msgpack.unpackb(payload))  # as a vLLM consumer decodes KVEventBatch: [ts, events, dp_rank]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("lockstep", [(), ("--enable-expert-parallel",)], ids=["engine_a_rank", "lockstep"])
def test_a_replica_of_two_ranks_serves_publishes_and_reports_each_rank_and_a_router_sends_a_prefix_to_its_rank(
        lockstep):
    port = free_port()
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"}
    rep = start_replica("--data-parallel-size", "2", *lockstep, "--kv-events-config", json.dumps(config),
                        capacity_blocks=200)
    router = None
    ctx = zmq.Context()
    try:
        subs = []
        for rank in (0, 1):  # vLLM's rule: rank r publishes on the endpoint's port + r
            sub = ctx.socket(zmq.SUB)
            sub.connect(f"tcp://127.0.0.1:{port + rank}")
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            subs.append(sub)
        time.sleep(0.3)  # the slow joiner
        a, b = list(range(100, 164)), list(range(500, 564))
        assert _generate(rep.url, a, "1")[1]["dp_rank"] == 1
        assert _generate(rep.url, b, "0")[1]["dp_rank"] == 0
        for bad in ("2", "x"):
            status, body = _generate(rep.url, a, bad)
            assert status == 400 and "X-data-parallel-rank" in body["error"]["message"] and "0 to 1" in \
                body["error"]["message"]
        ranks = http_json("GET", rep.url + "/stats")[1]["data_parallel"]["ranks"]
        assert [(r["routed"], r["requests"], r["tokens_queried"]) for r in ranks] == [(1, 1, 64), (1, 1, 64)]
        for rank, sub in enumerate(subs):
            batches = _batches(sub)
            assert batches and all(dp == rank for _ts, _events, dp in batches)
            stored = [e for _, events, _ in batches for e in events if e["type"] == "BlockStored"]
            assert stored and stored[0]["token_ids"][:16] == (a if rank else b)[:16]  # its own request's blocks
        samples = scrape(rep.url)
        assert metric(samples, "vllm:prefix_cache_queries_total", engine="0") == 64
        assert metric(samples, "vllm:prefix_cache_queries_total", engine="1") == 64
        assert {"0", "1"} <= {dict(lab).get("engine") for (n, lab) in samples if n == "vllm:kv_cache_usage_perc"}
        router = start_router([rep.url])
        published = http_json("GET", rep.url + "/stats")[1]["events"]["published_events"]
        wait_for(lambda: metric(scrape(router.url), "kvemu_router_events_applied_total") >= published,
                 what="the router's index holding both ranks' blocks")
        status, body = _generate(router.url, a + [7] * 16)  # a's prefix is on rank 1 only: the router names it
        assert status == 200 and body["dp_rank"] == 1 and body["cached_tokens"] == 64
    finally:
        ctx.destroy(linger=0)
        stop_all(*(p for p in (router, rep) if p is not None))
