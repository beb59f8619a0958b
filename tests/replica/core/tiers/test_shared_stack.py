"""The shared store as the last level of two replicas' TierStacks: what one replica's HBM evicts the other
restores, the store keeps it, the links it crosses (each replica's NIC with the store's metadata round trip,
and the store's aggregate, which both replicas' transfers share), write-through, and whose events are whose.

Numbers are picked so the arithmetic is clean: 1 GB blocks, NICs of 8 Gb/s (1 GB/s: a block a second) with a
0.5 s time to first byte, a device link of 100 GB/s (0.01 s a block, no per-copy cost) and an aggregate of
8 or 16 Gb/s (1 or 2 GB/s)."""

from __future__ import annotations

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.shared import SharedSettings, SharedStore
from replica.core.tiers.stack import TierSettings, TierStack
from shared.index.base import level_key
from tests.support.tier_stack import serve

GB = 10**9
SHARED = 3  # the shared level's index: host (1) and SSD (2) are configured, empty, above it


def shared_settings(blocks=100, nic_gbps=8.0, store_gbps=8.0, ttfb_s=0.5, **kw) -> SharedSettings:
    return SharedSettings(blocks, nic_gbps=nic_gbps, store_gbps=store_gbps, ttfb_s=ttfb_s, **kw)


def replica(store: SharedStore, hbm_blocks=3, cost_per_block=100.0, fetch="always", emit_events=False, **tier):
    settings = TierSettings(host_link_gbps=100.0, fetch=fetch, shared=store.settings, **tier)
    hbm = BlockPool(hbm_blocks, make_policy("lru"), emit_events=False)
    return hbm, TierStack(settings, hbm, GB, lambda depth: cost_per_block, emit_events, shared=store)


def test_the_shared_level_is_the_last_level_with_its_nic_and_the_stores_aggregate_link():
    store = SharedStore(shared_settings())
    _, a = replica(store, host_blocks=2)
    _, b = replica(store)
    assert a.names == ["host", "ssd", "shared"] and [lv.name for lv in a.levels] == ["host", "shared"]
    level = a.shared
    assert level is a.levels[-1] and level.index == SHARED and level.shared and a.levels[0].shared is False
    assert level.serving is store and level.held is store.held and level.store_link is store.link
    assert b.shared.store_link is store.link  # one aggregate link for every replica of the store
    nic = level.link
    assert nic is not b.shared.link  # a NIC each
    assert (nic.name, nic.bandwidth, nic.latency_s, level.write_bw) == ("shared", 1e9, 0.5, 1e9)
    assert store.link.bandwidth == 1e9 and store.link.latency_s == 0.0
    assert a.capacity == 2 + 100
    assert a.stats()["shared_blocks"] == 100 and "shared_used_blocks" not in a.stats()


def test_a_replica_needs_the_store_to_build_a_shared_level():
    from shared.errors import InputError
    with pytest.raises(InputError) as err:
        TierStack(TierSettings(shared=shared_settings()), BlockPool(2, make_policy("lru")), GB, lambda d: 1.0)
    assert err.value.field == "shared"


def test_what_one_replica_evicts_the_other_restores_from_the_store_which_keeps_it():
    store = SharedStore(shared_settings())
    hbm_a, a = replica(store)
    hbm_b, b = replica(store)
    serve(hbm_a, a, [1, 2], 0.0)
    serve(hbm_a, a, [3, 4, 5], 1.0)  # HBM of 3: 1 and 2 are evicted, written to the store (exclusive)
    assert sorted(hbm_a.resident) == [3, 4, 5] and sorted(store.held) == [1, 2]
    assert a.counters.demoted == 2 and a.counters.dropped == 0
    # 2 GB down the device link, over A's NIC and through the store's aggregate
    assert a.d2h.bytes_moved == 2 * GB and a.shared.link.bytes_moved == 2 * GB and store.link.bytes_moved == 2 * GB
    assert a.stats()["bytes_moved"] == {"host_to_device": 0, "device_to_host": 2 * GB, "ssd": 0, "shared": 2 * GB}
    assert b.lower_overlap("replica-1", [1, 2, 6], 0) == {level_key("replica-1", SHARED): 2}

    plan = b.plan([1, 2, 6], 10.0)
    assert plan.restored_idx == [0, 1] and plan.recomputed == 0 and plan.started_at == 10.0
    # B's NIC: 2 GB at 1 GB/s after the 0.5 s round trip -> 12.5; the aggregate (idle since A's write ended
    # at 3.0): 2 s -> 12.0; the device link: 0.02 s -> 10.02. The restore waits for the latest.
    finishes = sorted(round(link.finish(tr), 9) for link, tr in plan.waits)
    assert finishes == [10.02, 12.0, 12.5] and plan.ready_at == 12.5
    assert store.leases == {1: 20.0, 2: 20.0} and store.counters.reads == 2
    alloc = hbm_b.serve(Lookup([1, 2, 6], now=10.0))
    b.complete(plan, alloc.hashes, alloc.hit_idx, alloc.new_idx, 10.0)
    assert sorted(store.held) == [1, 2]  # never removed on a fetch: the other replicas want it
    assert b.counters.hits == [0, 0, 0, 2] and b.counters.accessed_blocks == 3 and b.counters.fetched == 2
    st = b.stats()
    assert st["shared_block_hit_ratio"] == pytest.approx(2 / 3) and st["host_block_hit_ratio"] == 0.0
    assert b.h2d.bytes_moved == 2 * GB and b.shared.link.bytes_moved == 2 * GB
    assert store.link.bytes_moved == 4 * GB and a.shared.link.bytes_moved == 2 * GB  # A's NIC: only its write
    assert a.counters.hits == [0, 0, 0, 0] and a.counters.accessed_blocks == 5


def test_a_host_level_spills_to_the_store_below_it():
    store = SharedStore(shared_settings())
    hbm, a = replica(store, hbm_blocks=2, host_blocks=1)
    serve(hbm, a, [1, 2], 0.0)
    serve(hbm, a, [3, 4], 1.0)  # 2 then 1 leave HBM for host (one block): 2 goes in, 1 on to the store
    assert list(a.pool("host").resident) == [2] and store.held == {1: 1}
    assert a.d2h.bytes_moved == 2 * GB and store.link.bytes_moved == GB and a.shared.link.bytes_moved == GB
    assert a.counters.dropped == 0


@pytest.mark.parametrize("store_gbps, ready", [(8.0, 9.0), (16.0, 7.5)])
def test_two_replicas_restoring_at_once_share_the_stores_aggregate(store_gbps, ready):
    """Both restore 2 GB at t=5 over their own NICs of 1 GB/s (2 s + 0.5 s to first byte = 7.5).
    An aggregate of 1 GB/s (as one NIC) is shared: each read gets half, both end at 5 + 4 = 9.0, twice
    the bandwidth phase of one alone. An aggregate of 2 GB/s gives each its 1 GB/s: 5 + 2 = 7.0, and the
    NIC's 7.5 paces the restore. The device links (0.02 s) never do."""
    store = SharedStore(shared_settings(store_gbps=store_gbps))
    store.admit_absent([1, 2, 3, 4], 0.0)
    hbm_a, a = replica(store, hbm_blocks=4)
    hbm_b, b = replica(store, hbm_blocks=4)
    plan_a = a.plan([1, 2], 5.0)
    assert plan_a.ready_at == 7.5  # alone: the NIC paces it either way
    plan_b = b.plan([3, 4], 5.0)
    assert plan_b.ready_at == ready
    assert max(link.finish(tr) for link, tr in plan_a.waits) == ready  # B's read slowed A's, projected again
    assert a.windows([plan_a], 5.0) == [(0.0, ready - 5.0)] and b.windows([plan_b], 5.0) == [(0.0, ready - 5.0)]
    assert store.link.in_flight == 2 and store.link.bytes_moved == 4 * GB
    assert a.shared.link.bytes_moved == 2 * GB and b.shared.link.bytes_moved == 2 * GB


@pytest.mark.parametrize("store_gbps, fetched", [(8.0, False), (16.0, True)])
def test_fetch_or_recompute_weighs_the_aggregate_as_busy_as_the_cluster_makes_it(store_gbps, fetched):
    """Recomputing a block costs 1.5 s: a run of 2, 3.0 s. A restores alone in 2.5 s (its NIC): fetched.
    B, right after: its NIC says 2.5 s, but the aggregate, with A's read on it, says 4.0 s at 1 GB/s
    (recompute instead) or 2.0 s at 2 GB/s (fetch, in 2.5 s)."""
    store = SharedStore(shared_settings(store_gbps=store_gbps))
    store.admit_absent([1, 2, 3, 4], 0.0)
    _, a = replica(store, hbm_blocks=4, cost_per_block=1.5, fetch="auto")
    _, b = replica(store, hbm_blocks=4, cost_per_block=1.5, fetch="auto")
    assert a.plan([1, 2], 5.0).restored_idx == [0, 1]
    b.produced([], 5.0)  # B's clock at 5 (its own NIC is idle)
    assert b.transfer_seconds(b.shared, 2) == (4.0 if store_gbps == 8.0 else 2.5)
    plan = b.plan([3, 4], 5.0)
    assert (plan.restored_idx == [0, 1]) is fetched and plan.recomputed == (0 if fetched else 2)
    assert store.counters.reads == (4 if fetched else 2)  # a run recomputed is not read: no lease
    assert store.leases == ({1: 15.0, 2: 15.0, 3: 15.0, 4: 15.0} if fetched else {1: 15.0, 2: 15.0})


def test_a_cancelled_plan_takes_its_transfers_back_from_both_links():
    store = SharedStore(shared_settings())
    store.admit_absent([1, 2], 0.0)
    _, a = replica(store)
    plan = a.plan([1, 2], 5.0)
    assert store.link.bytes_moved == 2 * GB and store.link.in_flight == 1
    a.cancel(plan)
    assert store.link.bytes_moved == 0 and store.link.in_flight == 0 and a.shared.link.bytes_moved == 0
    assert sorted(store.held) == [1, 2]


def test_the_store_is_read_at_admission_over_both_its_links_not_staged():
    """A waiting request stages nothing from the shared store (its reads would cross the aggregate too):
    the read starts at admission, on the replica's NIC and the store's aggregate alike."""
    store = SharedStore(shared_settings())
    store.admit_absent([1, 2], 0.0)
    before = store.link.bytes_moved
    _, a = replica(store)
    a.stage([1, 2], 5.0)
    assert a.shared.link.bytes_moved == 0 and store.link.bytes_moved == before
    a.plan([1, 2], 5.0)
    assert a.shared.link.bytes_moved == 2 * GB and store.link.bytes_moved == before + 2 * GB


def test_write_through_stores_a_finished_requests_prompt_chunks_and_its_tail_stays_out():
    """Chunks of 2: the prompt 1..5 gives chunks (1, 2) and (3, 4); 5 is a tail and the response block 6
    is not written (chunks of several blocks are cut from the prompt's depth 0). 4 GB on each link."""
    store = SharedStore(shared_settings(chunk_blocks=2, write="through"))
    _, a = replica(store)
    a.released([1, 2, 3, 4, 5], [6], 3.0)
    assert dict(store.chunks) == {2: (1, 2), 4: (3, 4)}
    assert a.d2h.bytes_moved == 4 * GB and a.shared.link.bytes_moved == 4 * GB and store.link.bytes_moved == 4 * GB
    assert a.counters.demoted == 0
    a.released([1, 2, 3, 4, 5, 7], [], 4.0)  # the next turn: its chunks are held, only (5, 7) crosses
    assert list(store.chunks) == [2, 4, 7] and store.link.bytes_moved == 6 * GB


def test_write_through_of_one_block_chunks_writes_the_response_blocks_too():
    store = SharedStore(shared_settings(write="through"))
    _, a = replica(store)
    a.released([1, 2, 3], [4], 3.0)
    assert sorted(store.held) == [1, 2, 3, 4] and store.link.bytes_moved == 4 * GB


def test_writes_of_evictions_write_nothing_when_a_request_finishes():
    store = SharedStore(shared_settings())
    _, a = replica(store)
    a.released([1, 2, 3], [4], 3.0)
    assert store.held == {} and store.link.bytes_moved == 0


def test_with_one_block_chunks_an_eviction_of_what_write_through_stored_crosses_nothing_again():
    store = SharedStore(shared_settings(write="through"))
    hbm, a = replica(store)
    serve(hbm, a, [1, 2, 3], 0.0)
    a.released([1, 2, 3], [], 0.0)
    assert store.link.bytes_moved == 3 * GB
    serve(hbm, a, [4, 5, 6], 1.0)  # evicts 1, 2, 3: a store written through takes no evictions
    assert a.counters.dropped == 3 and store.link.bytes_moved == 3 * GB and a.shared.link.bytes_moved == 3 * GB
    assert sorted(store.chunks) == [1, 2, 3] and store.counters.writes == 3


def test_with_write_through_chunks_an_hbm_eviction_makes_no_chunk_of_its_own():
    store = SharedStore(shared_settings(blocks=4, chunk_blocks=2, write="through", eviction="lru"))
    hbm, a = replica(store, hbm_blocks=4)
    serve(hbm, a, [1, 2, 3, 4], 0.0)
    a.released([1, 2, 3, 4], [], 0.0)
    assert dict(store.chunks) == {2: (1, 2), 4: (3, 4)}
    serve(hbm, a, [11, 12, 13, 14], 1.0)  # evicts 1..4 from HBM
    assert dict(store.chunks) == {2: (1, 2), 4: (3, 4)}  # no chunk cut in eviction order
    assert store.held == {1: 2, 2: 2, 3: 4, 4: 4}
    for t, prompt in enumerate(([11, 12], [11, 12, 13, 14], [21, 22], [21, 22, 23, 24]), 2):
        a.released(prompt, [], float(t))  # LRU makes room a chunk at a time: no KeyError
    assert store.used == 4


def test_the_stores_events_are_not_a_replicas():
    store = SharedStore(shared_settings())
    hbm, a = replica(store, hbm_blocks=2, host_blocks=1, emit_events=True)
    serve(hbm, a, [1, 2], 0.0)
    serve(hbm, a, [3, 4], 1.0)
    events = a.drain_events()
    assert events == [KvEvent("stored", (2,), 1)]  # host's, tagged; none of the shared level
    assert store.drain_events() == [KvEvent("stored", (1,))]  # the store's are the store's to publish
    assert all(e.level == 1 for e in a.snapshot_events())
    _, b = replica(store, emit_events=True)
    b.released([7], [], 2.0)  # nothing of B's own either way
    assert b.drain_events() == []


def test_the_stores_group_replicas_in_id_order_by_scope():
    # the one grouping the simulator and `kvemu up` share: scope 0 one store, scope k one per k replicas
    assert SharedSettings(10).groups(5) == [range(0, 5)]
    assert [SharedSettings(10).group_of(i, 5) for i in range(5)] == [0, 0, 0, 0, 0]
    assert SharedSettings(10, scope=2).groups(5) == [range(0, 2), range(2, 4), range(4, 5)]
    assert [SharedSettings(10, scope=2).group_of(i, 5) for i in range(5)] == [0, 0, 1, 1, 2]
