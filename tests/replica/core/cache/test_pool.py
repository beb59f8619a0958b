import random

import pytest

from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import make_policy
from replica.core.cache.policies.base import EvictionPolicy
from replica.core.cache.pool import BlockPool, KvEvent, PoolBusyError, PoolCapacityError
from replica.core.cache.types import Lookup
from shared.errors import InputError
from tests.support.policy_checks import apply_events


def lru_pool(capacity, **kw):
    return BlockPool(capacity, make_policy("lru"), **kw)


def test_holes_mode_reuses_deeper_blocks_and_counts_holes():
    pool = lru_pool(10)
    pool.serve(Lookup([1, 2, 3, 4, 5]))
    # drop blocks 2 and 4 by hand through the admin path
    pool.policy.on_remove(2)
    pool._forget([2])
    pool.policy.on_remove(4)
    pool._forget([4])
    alloc = pool.serve(Lookup([1, 2, 3, 4, 5, 6]))
    assert alloc.hit_idx == [0, 2, 4]
    assert alloc.new_idx == [1, 3, 5]
    assert (alloc.holes, alloc.hole_lengths) == (2, [1, 1])  # the tail miss (6) is not a hole
    s = pool.stats()
    assert s["holes"]["total"] == 2 and s["holes"]["max_per_request"] == 2


def test_prefix_mode_stops_at_first_miss():
    pool = lru_pool(10, hit_mode="prefix")
    pool.serve(Lookup([1, 2, 3]))
    pool.policy.on_remove(2)
    pool._forget([2])
    alloc = pool.serve(Lookup([1, 2, 3, 4]))
    assert alloc.hit_idx == [0]
    assert alloc.new_idx == [1, 3]  # block 3 is resident: recomputed but not re-allocated
    assert alloc.holes == 0
    assert pool.stats()["block_hits"] == 1


def test_token_and_block_hit_ratios():
    pool = lru_pool(10, block_size=16)
    pool.serve(Lookup([1, 2], input_tokens=40))
    pool.serve(Lookup([1, 2, 3], input_tokens=50))
    s = pool.stats()
    assert s["block_accesses"] == 5 and s["block_hits"] == 2
    assert s["block_hit_ratio"] == pytest.approx(0.4)
    assert s["tokens_queried"] == 90 and s["tokens_hit"] == 32
    assert s["token_hit_ratio"] == pytest.approx(32 / 90)


def test_csr_weights_hits_by_depth_cost():
    metrics = PoolMetrics(block_size=16, block_cost=lambda i: float(i + 1))
    pool = BlockPool(10, make_policy("lru"), metrics=metrics)
    pool.serve(Lookup([1, 2, 3]))  # costs 1+2+3, no hits
    pool.serve(Lookup([9, 2]))  # block 2 at depth 1 (cost 2) is a hit in holes mode; 9 at depth 0 misses
    s = pool.stats()
    assert s["csr"] == pytest.approx(2 / (6 + 3))
    assert s["block_hit_ratio"] == pytest.approx(1 / 5)


def test_request_larger_than_pool_is_a_clear_error():
    pool = lru_pool(3)
    with pytest.raises(PoolCapacityError) as err:
        pool.serve(Lookup([1, 2, 3, 4]))
    assert err.value.field == "prompt" and "4" in str(err.value)
    assert pool.used == 0 and pool.stats()["requests"] == 0


def test_pinned_blocks_are_never_evicted_and_busy_pool_refuses():
    pool = lru_pool(4)
    held = pool.acquire(Lookup([1, 2, 3]))
    pool.serve(Lookup([4]))
    with pytest.raises(PoolBusyError):
        pool.acquire(Lookup([5, 6]))  # only block 4 is evictable
    assert set(pool.resident) == {1, 2, 3, 4}
    pool.serve(Lookup([5]))  # evicts 4, never 1-3
    assert set(pool.resident) == {1, 2, 3, 5}
    pool.release(held)
    pool.serve(Lookup([6, 7, 8]))
    assert 5 not in pool.resident or len(pool.resident) == 4


class FifoIgnoringPins(EvictionPolicy):
    """A policy that never looks at pins: insertion order, released blocks re-appended."""

    name = "fifo_ignoring_pins"

    def __init__(self):
        self.order: dict[int, None] = {}
        self.asked: list[int] = []
        self.released: list[list[int]] = []

    def on_access(self, acc):
        self.order.update(dict.fromkeys(acc.hashes[i] for i in acc.new_idx))

    def on_release(self, hashes, now):
        self.released.append(list(hashes))
        for h in hashes:
            self.order.setdefault(h, None)

    def victims(self, need):
        out = list(self.order)[:need]
        for h in out:
            del self.order[h]
        self.asked.append(need)
        return out

    def on_remove(self, h):
        self.order.pop(h, None)

    def clear(self):
        self.order.clear()


def test_the_pool_alone_skips_pinned_victims_and_they_return_on_release():
    policy = FifoIgnoringPins()
    pool = BlockPool(4, policy)
    pool.serve(Lookup([1, 2]))
    pool.serve(Lookup([3, 4]))
    held = pool.acquire(Lookup([1]))  # 1 is pinned, still first in the policy's order
    assert policy.released == [[1, 2], [3, 4]]
    pool.serve(Lookup([5, 6]))  # victims(2) gives 1, 2: the pool keeps pinned 1, asks for 1 more: 3
    assert policy.asked == [2, 1]
    assert set(pool.resident) == {1, 4, 5, 6}
    assert [e for e in pool.drain_events() if e.kind == "removed"] == [KvEvent("removed", (2, 3))]
    assert 1 not in policy.order  # it left the order while pinned
    other = pool.acquire(Lookup([4]))
    pool.release(held)  # only blocks no request holds any more are handed back
    assert policy.released[-1] == [1] and list(policy.order) == [4, 5, 6, 1]
    pool.release(other)
    assert policy.released[-1] == [4] and list(policy.order) == [4, 5, 6, 1]


def test_bad_settings_name_the_field():
    with pytest.raises(InputError) as err:
        lru_pool(0)
    assert err.value.field == "capacity_blocks"
    with pytest.raises(InputError) as err:
        lru_pool(4, hit_mode="fuzzy")
    assert err.value.field == "hit_mode"


def test_events_replay_to_the_resident_set():
    rng = random.Random(3)
    pool = lru_pool(20)
    mirror: set[int] = set()
    for _ in range(500):
        base = rng.randrange(30)
        pool.serve(Lookup([base * 100 + i for i in range(rng.randrange(1, 8))]))
        apply_events(mirror, pool.drain_events())
        assert mirror == set(pool.resident)
    assert pool.used <= 20


def test_reset_drops_unpinned_and_emits_cleared_then_stored():
    pool = lru_pool(10)
    held = pool.acquire(Lookup([1, 2]))
    pool.serve(Lookup([3, 4]))
    pool.drain_events()
    assert pool.reset() == 2
    assert set(pool.resident) == {1, 2}
    assert pool.drain_events() == [KvEvent("cleared", ()), KvEvent("stored", (1, 2))]
    pool.release(held)


def test_set_policy_keeps_resident_blocks_in_age_order():
    pool = lru_pool(4)
    pool.serve(Lookup([1]))
    pool.serve(Lookup([2]))
    pool.serve(Lookup([3]))
    pool.set_policy(make_policy("lru"))
    assert set(pool.resident) == {1, 2, 3}
    pool.serve(Lookup([4, 5]))  # needs one eviction: the oldest block, 1
    assert set(pool.resident) == {2, 3, 4, 5}


def test_footprint_and_one_hit_blocks():
    pool = lru_pool(4)
    pool.serve(Lookup([1, 2], session="a"))
    pool.serve(Lookup([3], session="b"))
    pool.serve(Lookup([1, 2, 9], session="a"))  # block 9 is new for a; 1,2 reused
    assert dict(pool.top_sessions()) == {"a": 3, "b": 1}
    pool.serve(Lookup([7, 8], session="c"))  # evicts 2 blocks
    s = pool.stats()
    assert s["evictions"] == 2
    # 3 (never reused) and 9 (never reused) are the LRU victims here
    assert s["one_hit_blocks"] == 2 + 2  # two evicted one-hit + 7, 8 resident unreused


def test_repeated_hash_in_one_request_is_rejected_cleanly():
    pool = lru_pool(10)
    with pytest.raises(InputError) as err:
        pool.serve(Lookup([1, 2, 1]))
    assert err.value.field == "block_hashes"
    assert pool.used == 0
    pool.serve(Lookup([1, 2]))
    assert pool.used == 2


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "arc", "session_lru", "random_compute"])
def test_serve_without_pins_equals_acquire_then_release(policy):
    """serve() skips pinning when nothing else is pinned; every observable stays the same."""
    rng = random.Random(7)
    served = BlockPool(40, make_policy(policy))
    pinned = BlockPool(40, make_policy(policy))
    for step in range(400):
        start, n = rng.randrange(60), rng.randrange(1, 12)
        hashes = [(start + i) * 7919 % 1000 for i in range(n)]  # overlapping prefixes and tails
        a = served.serve(Lookup(hashes, session=f"s{start % 5}", now=step))
        b = pinned.acquire(Lookup(hashes, session=f"s{start % 5}", now=step))
        pinned.release(b, step)
        assert (a.hit_idx, a.new_idx, a.holes) == (b.hit_idx, b.new_idx, b.holes)
        assert list(served.resident) == list(pinned.resident)
        assert served.drain_events() == pinned.drain_events()
    assert served.stats() == pinned.stats()
    assert not served.pin_counts and not pinned.pin_counts


def test_private_blocks_take_room_evicting_cached_blocks_and_are_never_indexed():
    """Blocks outside the hash map (a prompt's partial tail, decode KV): capacity 5."""
    pool = lru_pool(5)
    pool.serve(Lookup([1, 2, 3]))  # cached, unpinned
    pool.drain_events()
    pool.take_private(3)  # 2 free + 1 evicted (LRU: the request's last block first)
    assert (sorted(pool.resident), pool.private, pool.room, pool.usage()) == ([1, 2], 3, 2, 1.0)
    assert pool.drain_events() == [KvEvent("removed", (3,))]  # no event for the private blocks
    with pytest.raises(PoolBusyError):  # 1 new + 1 private, and only block 2 could go (1 is the hit)
        pool.acquire(Lookup([1, 4], extra=1))
    pool.free_private(1)
    alloc = pool.acquire(Lookup([1, 4], extra=1))  # the freed block and block 2, evicted
    assert (sorted(pool.resident), pool.private, pool.room) == ([1, 4], 3, 0)
    with pytest.raises(PoolBusyError):
        pool.take_private(1)
    with pytest.raises(PoolBusyError):
        pool.acquire(Lookup([9]))
    pool.release(alloc)
    pool.free_private(3)
    assert (pool.private, pool.room, pool.store([7, 8, 9, 10])) == (0, 5, [7, 8, 9, 10])
