"""The cluster's shared KV store (replica/core/tiers/shared.py) on its own: its settings' checks, chunked
writes, Mooncake's watermark eviction with read leases, LRU, and what a fetch leaves behind. Every
expectation is worked by hand from the module's constants (90% high watermark, 5% evicted, 10 s leases)."""

from __future__ import annotations

import math

import pytest

from replica.core.cache.pool import KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.shared import EVICT_FRACTION, HIGH_WATERMARK, LEASE_S, SharedSettings, SharedStore
from shared.errors import InputError


def store(blocks=100, **kw) -> SharedStore:
    return SharedStore(SharedSettings(blocks, **kw))


def write_one_by_one(s: SharedStore, hashes, now=0.0) -> None:
    for h in hashes:
        s.admit_absent([h], now)


# ---- settings ------------------------------------------------------------------------------------
def test_the_defaults_are_one_block_chunks_mooncake_eviction_writes_of_evictions_and_one_store():
    s = SharedSettings(8)
    assert (s.blocks, s.chunk_blocks, s.eviction, s.write, s.scope) == (8, 1, "mooncake", "evict", 0)
    assert (s.nic_gbps, s.store_gbps, s.ttfb_s) == (400.0, 640.0, 1e-4)
    assert (HIGH_WATERMARK, EVICT_FRACTION, LEASE_S) == (0.9, 0.05, 10.0)


@pytest.mark.parametrize("kw, field", [
    ({"blocks": 0}, "shared_blocks"),
    ({"blocks": -3}, "shared_blocks"),
    ({"blocks": 2.0}, "shared_blocks"),  # not an integer
    ({"blocks": True}, "shared_blocks"),  # a bool is no count
    ({"chunk_blocks": 0}, "shared_chunk_blocks"),
    ({"chunk_blocks": -1}, "shared_chunk_blocks"),
    ({"blocks": 4, "chunk_blocks": 5, "write": "through"}, "shared_blocks"),  # no chunk fits
    ({"chunk_blocks": 2}, "shared_write"),  # chunks of several blocks need write-through
    ({"chunk_blocks": 4, "write": "evict"}, "shared_write"),
    ({"eviction": "fifo"}, "shared_eviction"),
    ({"eviction": "LRU"}, "shared_eviction"),
    ({"write": "back"}, "shared_write"),
    ({"nic_gbps": 0}, "shared_nic_gbps"),
    ({"nic_gbps": -1.0}, "shared_nic_gbps"),
    ({"nic_gbps": math.nan}, "shared_nic_gbps"),
    ({"nic_gbps": math.inf}, "shared_nic_gbps"),
    ({"store_gbps": 0.0}, "shared_store_gbps"),
    ({"store_gbps": -640.0}, "shared_store_gbps"),
    ({"store_gbps": math.nan}, "shared_store_gbps"),
    ({"ttfb_s": -1e-6}, "shared_ttfb_s"),
    ({"ttfb_s": math.nan}, "shared_ttfb_s"),
    ({"scope": -1}, "shared_scope"),
    ({"scope": 1.5}, "shared_scope"),
])
def test_bad_settings_are_refused_naming_the_field(kw, field):
    kw = {"blocks": 100, **kw}
    with pytest.raises(InputError) as err:
        SharedSettings(**kw)
    assert err.value.field == field


def test_the_edges_of_the_settings_are_accepted():
    assert SharedSettings(4, chunk_blocks=4, write="through").chunk_blocks == 4  # one chunk exactly fills it
    assert SharedSettings(1, ttfb_s=0.0, scope=0).ttfb_s == 0.0
    assert SharedSettings(1, nic_gbps=1e-3, store_gbps=1e-3, scope=7).scope == 7
    assert SharedSettings(1, chunk_blocks=1, write="through", eviction="lru").eviction == "lru"


# ---- chunked writes --------------------------------------------------------------------------
def test_a_prompt_is_written_in_whole_chunks_keyed_by_their_last_block_and_its_tail_is_not():
    s = store(100, chunk_blocks=4, write="through")
    written = s.admit_absent(list(range(10, 20)), 0.0)  # 10 blocks, chunks of 4: [10..13], [14..17]; 18, 19 left
    assert written == list(range(10, 18))
    assert s.used == 8 and len(s.chunks) == 2
    assert dict(s.chunks) == {13: (10, 11, 12, 13), 17: (14, 15, 16, 17)}
    assert s.held == {10: 13, 11: 13, 12: 13, 13: 13, 14: 17, 15: 17, 16: 17, 17: 17}
    assert s.absent([13, 17, 18, 19]) == [18, 19]
    assert s.counters.writes == 2 and s.counters.refused == 0
    assert s.drain_events() == [KvEvent("stored", (10, 11, 12, 13)), KvEvent("stored", (14, 15, 16, 17))]
    assert s.drain_events() == []


def test_a_chunk_held_already_is_not_written_again_only_the_new_ones():
    s = store(100, chunk_blocks=4, write="through")
    s.admit_absent(list(range(8)), 0.0)  # chunks 3 and 7
    s.drain_events()
    written = s.admit_absent(list(range(13)), 1.0)  # the same two, then [8..11]; 12 is a tail
    assert written == [8, 9, 10, 11]
    assert list(s.chunks) == [3, 7, 11] and s.counters.writes == 3
    assert s.drain_events() == [KvEvent("stored", (8, 9, 10, 11))]
    assert s.admit_absent(list(range(12)), 2.0) == [] and s.counters.writes == 3  # nothing new: nothing crosses
    assert s.drain_events() == []


def test_a_rewrite_of_a_held_chunk_moves_it_to_the_most_recently_used_end():
    s = store(100)
    write_one_by_one(s, [1, 2, 3])
    assert s.admit_absent([1], 1.0) == []
    assert s.eviction_order() == [2, 3, 1]


def test_admit_is_admit_absent_without_the_answer():
    s = store(100)
    s.admit([5, 6], 0.0)
    assert sorted(s.held) == [5, 6] and s.counters.writes == 2


# ---- Mooncake's watermark --------------------------------------------------------------------
def test_crossing_the_90_percent_watermark_evicts_5_percent_of_the_objects_least_recent_first():
    """100 blocks of one-block chunks: after 90 writes the store is at 90 (not above 90.0); the 91st lifts
    it to 91 > 90, so it evicts max(1, int(0.05 x 91)) = int(4.55) = 4 chunks, the first four written."""
    s = store(100)
    write_one_by_one(s, range(1, 91))
    assert s.used == 90 and s.counters.evictions == 0
    s.drain_events()
    assert s.admit_absent([91], 1.0) == [91]
    assert s.used == 87 and s.counters.evictions == 4
    assert sorted(s.absent(range(1, 92))) == [1, 2, 3, 4]
    assert list(s.chunks)[:2] == [5, 6] and list(s.chunks)[-1] == 91
    assert s.drain_events() == [KvEvent("stored", (91,)), KvEvent("removed", (1, 2, 3, 4))]
    # 87 -> 88, 89, 90: no eviction; the write that makes 91 evicts int(0.05 x 91) = 4 more: 5..8
    write_one_by_one(s, [92, 93, 94], 2.0)
    assert s.used == 90 and s.counters.evictions == 4
    s.admit_absent([95], 2.0)
    assert s.used == 87 and s.counters.evictions == 8 and sorted(s.absent(range(5, 10))) == [5, 6, 7, 8]


def test_the_watermark_is_checked_once_after_a_write_of_many():
    """One write of 95 blocks into an empty store of 100: all fit, and 95 > 90 sweeps, but a write's own
    chunks are never its victims: 95 stay. The next write (one block) sweeps int(0.05 x 96) = 4 of the
    older ones, least recent first."""
    s = store(100)
    assert s.admit_absent(list(range(95)), 0.0) == list(range(95))
    assert s.used == 95 and s.counters.evictions == 0
    assert s.admit_absent([95], 1.0) == [95]
    assert s.used == 92 and sorted(s.absent(range(96))) == [0, 1, 2, 3]
    assert s.counters.writes == 96 and s.counters.evictions == 4


def test_a_small_store_evicts_at_least_one_object():
    """10 blocks: the 10th write lifts it to 10 > 9.0; int(0.05 x 10) = 0, so max(1, 0) = 1 chunk goes."""
    s = store(10)
    write_one_by_one(s, range(1, 11))
    assert s.used == 9 and s.absent([1]) == [1] and s.counters.evictions == 1


def test_a_write_that_does_not_fit_evicts_what_it_needs_first_under_mooncake_too():
    """Chunks of 4 in 10 blocks (write-through): two chunks hold 8 (not above 9.0). A third needs 8 + 4 -
    10 = 2 blocks more: ceil(2 / 4) = 1 chunk, the least recent, goes first; then 8 > 9 is false: no sweep."""
    s = store(10, chunk_blocks=4, write="through")
    s.admit_absent(list(range(8)), 0.0)
    assert s.admit_absent([*range(8), 8, 9, 10, 11], 1.0) == [8, 9, 10, 11]
    assert list(s.chunks) == [7, 11] and s.used == 8 and s.counters.evictions == 1


# ---- reads and their leases ------------------------------------------------------------------
def test_a_read_leases_its_chunks_for_10_s_and_makes_them_most_recent():
    s = store(100, chunk_blocks=2, write="through")
    s.admit_absent([1, 2, 3, 4, 5, 6], 0.0)  # chunks 2, 4, 6
    alloc = s.acquire(Lookup([1, 2, 3, 4], session="a", now=5.0))
    assert list(alloc.hashes) == [1, 2, 3, 4] and alloc.hit_idx == [] and alloc.session == "a"
    assert s.leases == {2: 15.0, 4: 15.0}
    assert s.eviction_order() == [6] and s.counters.reads == 2  # 2 and 4 leave the order while leased
    s.release(alloc, 6.0)  # a lease ends with time, not with the read
    assert s.leases == {2: 15.0, 4: 15.0}
    s.remove([1, 2, 3, 4])  # a fetched block stays for the other replicas
    assert sorted(s.held) == [1, 2, 3, 4, 5, 6] and s.used == 6 and s.pinned == 0
    assert s.drain_events() == [KvEvent("stored", (1, 2)), KvEvent("stored", (3, 4)), KvEvent("stored", (5, 6))]


def test_a_read_of_a_block_it_does_not_hold_takes_no_lease():
    s = store(100)
    s.admit_absent([1], 0.0)
    s.acquire(Lookup([1, 99], now=0.0))
    assert s.leases == {1: 10.0} and s.counters.reads == 1


def test_the_watermark_sweep_skips_leased_chunks_until_their_lease_ends():
    """Blocks 0..89 written at t=0; 0 and 1 read at t=1 (leased to 11: out of the eviction order); 2..89
    rewritten at t=2 (held: made most recent, nothing crosses). Block 90 at t=3 lifts the store to 91: the
    sweep of 4 takes 2, 3, 4, 5. At t=11 the lease has ended (a lease protects while its end is after now):
    91, 92, 93 bring it back to 90, 94 to 91; 0 and 1 re-enter the order at its recent end (as if read at
    11), after 94, and the sweep of 4 takes 6, 7, 8, 9."""
    s = store(100)
    s.admit_absent(list(range(90)), 0.0)
    s.acquire(Lookup([0, 1], now=1.0))
    assert s.admit_absent(list(range(2, 90)), 2.0) == []
    assert s.eviction_order()[:2] == [2, 3]
    s.admit_absent([90], 3.0)
    assert s.used == 87 and sorted(s.absent(range(91))) == [2, 3, 4, 5]
    assert s.leases == {0: 11.0, 1: 11.0}
    write_one_by_one(s, [91, 92, 93], 11.0)
    assert s.used == 90
    s.admit_absent([94], 11.0)
    assert s.used == 87 and sorted(s.absent(range(95))) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert s.eviction_order()[-3:] == [94, 0, 1]
    assert s.leases == {}  # an ended lease is forgotten
    assert s.counters.evictions == 8


def test_a_write_that_finds_no_room_because_every_chunk_is_leased_is_refused_and_changes_nothing():
    """Mooncake, chunks of 3 in 10 blocks (write-through): three chunks hold 9 (not above 9.0), all read at
    t=0 (leased to 10). A fourth at t=1 needs 9 + 3 - 10 = 2 blocks: ceil(2 / 3) = 1 chunk to evict, but
    every one is leased: refused, nothing written, nothing evicted, no event."""
    s = store(10, chunk_blocks=3, write="through")
    s.admit_absent(list(range(9)), 0.0)
    s.acquire(Lookup(list(range(9)), now=0.0))
    s.drain_events()
    before = (dict(s.chunks), dict(s.held), dict(s.leases))
    assert s.admit_absent([*range(9), 9, 10, 11], 1.0) == []
    assert (dict(s.chunks), dict(s.held), dict(s.leases)) == before
    assert (s.counters.refused, s.counters.writes, s.counters.evictions) == (1, 3, 0)
    assert s.drain_events() == []
    # once the leases end (t=10), the same write evicts the least recent chunk (2) and goes in
    assert s.admit_absent([*range(9), 9, 10, 11], 10.0) == [9, 10, 11]
    assert list(s.chunks) == [5, 8, 11] and s.counters.refused == 1


def test_under_lru_a_write_into_a_full_store_of_leased_chunks_is_refused():
    s = store(4, eviction="lru")
    s.admit_absent([1, 2, 3, 4], 0.0)  # lru has no watermark: full, nothing evicted
    assert s.used == 4 and s.counters.evictions == 0
    s.acquire(Lookup([1, 2, 3, 4], now=0.0))
    assert s.admit_absent([5], 9.999) == [] and s.counters.refused == 1
    assert sorted(s.held) == [1, 2, 3, 4] and s.counters.evictions == 0


def test_a_mooncake_write_over_the_watermark_with_every_older_chunk_leased_keeps_what_it_stored():
    """10 blocks, 1..9 written and read at t=0 (leased until 10). Blocks 10, 11, 12 in one write at t=1: 10
    fits; 11 needs a block, but every older chunk is leased and 10 is this write's own: refused, as 12; the
    sweep over the watermark finds nothing it may evict. Only 10 crossed, and it is held."""
    s = store(10)
    s.admit_absent(list(range(1, 10)), 0.0)
    s.acquire(Lookup(list(range(1, 10)), now=0.0))
    assert s.admit_absent([10, 11, 12], 1.0) == [10]
    assert sorted(s.held) == list(range(1, 11))
    assert (s.counters.writes, s.counters.evictions, s.counters.refused) == (10, 0, 2)


# ---- LRU ---------------------------------------------------------------------------------------
def test_lru_evicts_exactly_what_a_write_needs_one_least_recent_chunk_at_a_time():
    s = store(10, eviction="lru")
    write_one_by_one(s, range(1, 11))
    assert s.used == 10 and s.counters.evictions == 0  # no watermark under lru
    s.acquire(Lookup([1], now=0.0))  # 1 becomes the most recent, and leased to 10
    s.drain_events()
    assert s.admit_absent([11, 12], 1.0) == [11, 12]  # one chunk each: 2, then 3
    assert sorted(s.absent(range(1, 13))) == [2, 3] and s.used == 10
    assert s.drain_events() == [KvEvent("removed", (2,)), KvEvent("stored", (11,)), KvEvent("removed", (3,)),
                                KvEvent("stored", (12,))]
    s2 = store(12, eviction="lru", chunk_blocks=4, write="through")
    s2.admit_absent(list(range(12)), 0.0)  # 3 chunks: full
    s2.admit_absent([*range(12), 12, 13, 14, 15], 1.0)  # needs 4 more blocks: ceil(4 / 4) = 1 chunk (3)
    assert list(s2.chunks) == [7, 11, 15] and s2.counters.evictions == 1


# ---- the LevelPool face ------------------------------------------------------------------------
def test_its_level_pool_face_and_stats():
    s = store(100, chunk_blocks=2, write="through", eviction="lru")
    assert (s.capacity, s.pinned, s.used) == (100, 0, 0)
    assert s.settle() is s
    s.admit_absent([1, 2, 3], 0.0)
    s.acquire(Lookup([1, 2], now=0.0))
    assert s.link.name == "shared_store" and s.link.bandwidth == 640e9 / 8 and s.link.latency_s == 0.0
    assert s.stats() == {"blocks": 100, "used_blocks": 2, "chunks": 1, "chunk_blocks": 2, "eviction": "lru",
                         "write": "through", "writes": 1, "refused_writes": 0, "reads": 1, "evictions": 0,
                         "bytes_moved": 0, "nic_gbps": 400.0, "store_gbps": 640.0, "pool_gbps": 640.0}


def test_a_store_without_events_keeps_none():
    s = SharedStore(SharedSettings(10), emit_events=False)
    write_one_by_one(s, range(1, 11))
    assert s.counters.evictions == 1 and s.events == [] and s.drain_events() == []
