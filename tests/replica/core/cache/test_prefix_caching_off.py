"""Prefix caching off (vLLM without --enable-prefix-caching), in the pool and the scheduler over it:
every block of a request is its own private block while it runs, freed when it ends; nothing is
cached, matched, stored, evicted or sent as an event."""

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core, check_prefix_caching
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, PoolBusyError, PoolCapacityError
from replica.core.cache.types import Lookup
from replica.core.compiled import pool as compiled_pool
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from replica.core.tiers.stack import TierSettings
from shared.costmodel import CostModel
from shared.errors import InputError

COST = CostModel.from_names("llama-3-8b", "h100")


def off_pool(capacity: int, **kw) -> BlockPool:
    return BlockPool(capacity, make_policy("lru"), prefix_caching=False, **kw)


def test_two_requests_with_the_same_prompt_at_once_take_twice_the_blocks_and_both_miss():
    pool = off_pool(10)
    a = pool.acquire(Lookup([1, 2, 3]))
    b = pool.acquire(Lookup([1, 2, 3], extra=1))  # the same prompt, and a partial last block
    assert (a.hit_idx, a.new_idx, a.touched_idx, a.private) == ([], [0, 1, 2], [], 3)
    assert (b.hit_idx, b.private) == ([], 3)
    assert (pool.private, pool.free, pool.room, pool.pinned, pool.used) == (7, 3, 3, 0, 0)  # 3 + 3 + 1 held
    assert pool.usage() == pytest.approx(0.7)
    with pytest.raises(PoolBusyError):  # 4 blocks do not fit in the 3 left, and nothing is evictable
        pool.acquire(Lookup([1, 2, 3, 4]))
    pool.release(a)
    pool.release(b)
    pool.free_private(1)  # the scheduler frees the extra block (decode_kv.forget)
    assert (pool.private, pool.free, pool.used, pool.resident, pool.footprint) == (0, 10, 0, {}, {})
    # a third request with that prompt, after both ended: still a miss, nothing was kept
    c = pool.acquire(Lookup([1, 2, 3]))
    assert c.hit_idx == [] and pool.private == 3
    pool.release(c)
    s = pool.stats()
    assert (s["requests"], s["block_accesses"], s["block_hits"], s["block_hit_ratio"]) == (3, 9, 0, 0.0)
    assert (s["inserted_blocks"], s["evictions"], s["resident_blocks"], s["prefix_caching"]) == (0, 0, 0, "off")
    assert pool.drain_events() == []  # a router's index hears of nothing
    assert pool.prefix_match([1, 2, 3]) == 0


def test_nothing_is_stored_served_requests_keep_nothing_and_the_policy_sees_nothing():
    pool = off_pool(8)
    assert pool.store([7, 8, 9]) == []  # response KV: not cached
    alloc = pool.serve(Lookup([1, 2, 3, 4]))
    assert alloc.hit_idx == [] and pool.private == 0 and not pool.resident
    assert pool.serve(Lookup([1, 2, 3, 4])).hit_idx == []
    assert pool.policy.victims(1) == []  # nothing ever entered its order
    with pytest.raises(PoolCapacityError):
        pool.acquire(Lookup(list(range(9))))
    with pytest.raises(PoolBusyError):  # private blocks cannot evict what is not cached either
        pool.acquire(Lookup(list(range(6))))
        pool.take_private(3)


def test_the_default_pool_still_shares_and_caches():
    pool = BlockPool(10, make_policy("lru"))
    a = pool.acquire(Lookup([1, 2, 3]))
    b = pool.acquire(Lookup([1, 2, 3]))
    assert b.hit_idx == [0, 1, 2] and pool.used == 3 and a.private == b.private == 0
    assert pool.stats()["prefix_caching"] == "on"


def make(capacity: int, **kw):
    pool = off_pool(capacity, block_size=16, emit_events=False)
    return pool, Scheduler(pool, COST, SchedulerSettings(**kw))


def drain(sched, now=0.0):
    while sched.has_work():
        res = sched.step(now)
        now += res.duration
    return now


def test_a_repeated_prompt_is_prefilled_in_full_each_time_and_its_ttft_is_the_firsts():
    pool, sched = make(100)
    first = SchedRequest(1, list(range(10)), 165, 4, 0.0)
    sched.submit(first)
    end = drain(sched)
    again = SchedRequest(2, list(range(10)), 165, 4, end)
    sched.submit(again)
    drain(sched, end)
    assert first.cached_tokens == again.cached_tokens == 0
    assert again.t_first_token - again.arrival == pytest.approx(first.t_first_token - first.arrival)
    assert sched.prefill_tokens == 2 * 165
    assert (pool.private, pool.used, pool.metrics.block_hits) == (0, 0, 0)


def test_prompt_blocks_count_against_the_pool_while_a_request_runs():
    # 10 blocks each (plus a partial one): two fit in 24 blocks, the third waits for one to end
    pool, sched = make(24)
    reqs = [SchedRequest(i, list(range(10)), 165, 3, 0.0) for i in range(3)]
    for r in reqs:
        sched.submit(r)
    sched.step(0.0)
    assert sched.num_running == 2 and sched.num_waiting == 1 and pool.private == 22
    drain(sched)
    assert reqs[2].t_admitted >= min(reqs[0].t_finished, reqs[1].t_finished)
    assert pool.private == 0 and pool.metrics.block_hits == 0


def test_reorder_reclaims_the_private_blocks_it_lent():
    # the head (20 blocks) waits behind a 15-block request; a 12-block one is lent the idle memory;
    # when the first ends, 20 fit only once the lent request's private blocks are taken back
    pool, sched = make(30, admission="reorder")
    first = SchedRequest(1, list(range(15)), 15 * 16, 2, 0.0)
    head = SchedRequest(2, list(range(15)) + list(range(100, 105)), 20 * 16, 2, 0.0)
    lent = SchedRequest(3, list(range(12)), 12 * 16, 50, 0.0)
    for r in (first, head, lent):
        sched.submit(r)
    sched.step(0.0)
    assert sched.promotions == 1 and lent.alloc is not None and lent.alloc.private == 12
    drain(sched)
    assert lent.preemptions == 1 and head.t_admitted <= lent.t_finished
    assert all(r.t_finished > 0 for r in (first, head, lent)) and pool.private == 0
    assert pool.metrics.block_hits == 0


def test_the_compiled_pool_says_no_and_the_python_pool_runs():
    pool = off_pool(64, emit_events=False)
    if compiled_pool.compiled():
        assert compiled_pool.why_not(pool) == "prefix caching off needs the Python pool"
    core = build_core(CoreSettings(capacity_blocks=64, emit_events=False, compiled=True,
                                   knobs=EngineKnobs(prefix_caching="off", response_kv="drop")), COST)
    assert core.compiled is None and core.pool.prefix_caching is False


def test_off_with_a_lower_tier_is_refused_in_one_line():
    tiers = TierSettings(host_blocks=100)
    with pytest.raises(InputError, match="would hold nothing") as err:
        CoreSettings(capacity_blocks=64, knobs=EngineKnobs(prefix_caching="off", tiers=tiers))
    assert err.value.field == "prefix_caching" and "\n" not in str(err.value)
    check_prefix_caching("on", tiers)
    check_prefix_caching("off", TierSettings())
    with pytest.raises(InputError, match="on, off"):
        CoreSettings(capacity_blocks=64, knobs=EngineKnobs(prefix_caching="yes"))
