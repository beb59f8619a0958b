import random
from collections import deque

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.policies.s3fifo import IN_MAIN
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from shared.errors import InputError
from tests.support.policy_checks import checked_victims, run_invariants
from tests.support.policy_traces import random_session_trace


def s3_pool(capacity, **params):
    return BlockPool(capacity, make_policy("s3fifo", **params))


def queues(pool):
    """(small, main) from tail to head, and the ghost from oldest to newest."""
    pol = pool.policy
    return list(pol._small), list(pol._main), list(pol._ghost)


def test_sizes_and_describe():
    pol = make_policy("s3fifo")
    BlockPool(18279, pol)
    assert (pol.small_size, pol.main_size, pol.ghost_size) == (1827, 16452, 16452)
    d = pol.describe()
    assert d["small_ratio"] == 0.1 and d["move_to_main_threshold"] == 2
    assert d["ghost_ratio"] == pytest.approx(16452 / 18279)
    pol = make_policy("s3fifo", small_ratio=0.25, move_to_main_threshold=1, ghost_ratio=0.5)
    BlockPool(10, pol)
    assert (pol.small_size, pol.main_size, pol.ghost_size) == (2, 8, 5)
    assert pol.describe()["ghost_ratio"] == 0.5
    pol = make_policy("s3fifo")
    BlockPool(3, pol)
    assert (pol.small_size, pol.main_size) == (1, 2)  # small never rounds down to 0


@pytest.mark.parametrize("params", [{"small_ratio": 0}, {"small_ratio": 1.0}, {"move_to_main_threshold": 0},
                                    {"move_to_main_threshold": 4}, {"move_to_main_threshold": 1.5},
                                    {"ghost_ratio": -1}, {"ghost_ratio": float("inf")}, {"bogus": 1}])
def test_bad_parameters_name_the_field(params):
    with pytest.raises(InputError):
        make_policy("s3fifo", **params)


def test_hand_worked_trace():
    # capacity 5, small_ratio 0.4: small 2, main 3, ghost 3, threshold 2 (freq >= 2 moves).
    pool = s3_pool(5, small_ratio=0.4)
    checked_victims(pool)
    hits = []

    def serve(*hashes):
        hits.append(pool.serve(Lookup(list(hashes))).hit_blocks)

    serve(1)
    serve(2)  # small [1, 2] (tail -> head)
    serve(3)
    serve(4)
    serve(5)  # no eviction yet and small is full: 3, 4, 5 go straight to main
    assert queues(pool) == ([1, 2], [3, 4, 5], [])
    serve(1)
    serve(1)  # freq(1) = 2
    serve(6)  # small tail 1 (freq 2) -> main head, freq 0; tail 2 (freq 0) -> evicted, ghost
    assert queues(pool) == ([6], [3, 4, 5, 1], [2])
    assert set(pool.resident) == {1, 3, 4, 5, 6}
    serve(2)  # ghost hit -> main; main (4) is over its size 3 -> evict main tail 3 (freq 0)
    assert queues(pool) == ([6], [4, 5, 1, 2], [])
    assert set(pool.resident) == {1, 2, 4, 5, 6}
    serve(7)  # main still over size: evict 4
    assert queues(pool) == ([6, 7], [5, 1, 2], [])
    serve(5)  # hit: freq(5) = 1
    serve(8)  # main at size -> small tail 6 -> ghost
    serve(9)  # small tail 7 -> ghost
    assert queues(pool) == ([8, 9], [5, 1, 2], [6, 7])
    assert set(pool.resident) == {1, 2, 5, 8, 9}
    serve(6)  # miss: small tail 8 -> ghost [6, 7, 8]; then 6 leaves the ghost for main
    assert queues(pool) == ([9], [5, 1, 2, 6], [7, 8])
    serve(10)  # main over size: tail 5 (freq 1) reinserted with 0; tail 1 (freq 0) evicted
    assert queues(pool) == ([9, 10], [2, 6, 5], [7, 8])
    assert set(pool.resident) == {2, 5, 6, 9, 10}
    assert hits == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    assert pool.policy._freq[5] & 3 == 0


def test_multi_block_request_evicts_back_to_back_then_inserts_deepest_first():
    pool = s3_pool(5, small_ratio=0.4)
    checked_victims(pool)
    for h in (1, 2, 3, 4, 5):
        pool.serve(Lookup([h]))  # small [1, 2], main [3, 4, 5]
    alloc = pool.serve(Lookup([1, 6, 7]))  # 1 hits; 6, 7 need two victims before they are inserted
    assert alloc.hit_idx == [0] and alloc.new_idx == [1, 2]
    # victims(2) from small: tail 1 (freq 0) and 2 (freq 0), both into the ghost [1, 2]. 1 is
    # pinned by this request, so the pool keeps it and asks for one more: small is empty, so
    # the main tail 3 (freq 0) goes. 7, 6 enter small. When the request ends, 1 returns to
    # the policy as an insertion does: it is in the ghost, so it enters main.
    assert queues(pool) == ([7, 6], [4, 5, 1], [2])
    assert set(pool.resident) == {1, 4, 5, 6, 7}
    assert pool.policy._freq[1] == IN_MAIN


@pytest.mark.parametrize("threshold, hits", [(2, 1), (1, 2)])
def test_move_to_main_threshold_changes_the_outcome(threshold, hits):
    pool = s3_pool(5, small_ratio=0.4, move_to_main_threshold=threshold)
    for h in (1, 2, 3, 4, 5):
        pool.serve(Lookup([h]))  # small [1, 2], main [3, 4, 5]
    pool.serve(Lookup([1]))  # one hit: freq(1) = 1
    pool.serve(Lookup([6]))
    if threshold == 2:
        # freq 1 < 2: 1 is evicted into the ghost, 2 stays
        assert queues(pool) == ([2, 6], [3, 4, 5], [1])
        assert set(pool.resident) == {2, 3, 4, 5, 6}
    else:
        # freq 1 >= 1: 1 moves to main (freq reset), 2 (freq 0) is evicted
        assert queues(pool) == ([6], [3, 4, 5, 1], [2])
        assert set(pool.resident) == {1, 3, 4, 5, 6}
    pool.serve(Lookup([1]))  # threshold 2: a miss (1 comes back from the ghost into main); 1: a hit
    assert pool.metrics.block_hits == hits


def test_pinned_blocks_at_a_tail_are_skipped_and_a_fully_pinned_small_queue_is_detected():
    pool = s3_pool(5, small_ratio=0.4)
    checked_victims(pool)
    held = pool.acquire(Lookup([1, 2]))  # small [2, 1] (deepest first), both pinned
    for h in (3, 4, 5):
        pool.serve(Lookup([h]))  # main [3, 4, 5]
    pool.serve(Lookup([6]))  # small: 2, 1 pinned -> stuck after one pass; main tail 3 evicted
    assert set(pool.resident) == {1, 2, 4, 5, 6}
    for h in range(7, 30):
        pool.serve(Lookup([h]))
        assert {1, 2} <= set(pool.resident)
    pool.release(held)
    for h in range(30, 40):
        pool.serve(Lookup([h]))
    assert not {1, 2} & set(pool.resident)


def test_pinned_main_blocks_leave_the_order_and_return_on_release():
    pool = s3_pool(5, small_ratio=0.4)
    checked_victims(pool)
    for h in (1, 2, 3, 4, 5):
        pool.serve(Lookup([h]))  # small [1, 2], main [3, 4, 5]
    pool.serve(Lookup([1]))  # freq(1) = 1
    held = pool.acquire(Lookup([3, 4, 5, 1]))  # all hits, pinned; freq(1) = 2, freq(3, 4, 5) = 1
    pool.serve(Lookup([6]))  # small tail 1 (freq 2) -> main; 2 evicted -> ghost
    assert queues(pool) == ([6], [3, 4, 5, 1], [2])
    # main (4) is over size: 3, 4, 5 lose their credit; 1 (freq 0) is handed out but pinned, so
    # the pool keeps it (it leaves the order) and asks again: main is at size, small tail 6 goes
    pool.serve(Lookup([7]))
    assert set(pool.resident) == {1, 3, 4, 5, 7}
    assert queues(pool) == ([7], [3, 4, 5], [2, 6])
    pool.serve(Lookup([8]))  # main at size: small tail 7 goes
    assert set(pool.resident) == {1, 3, 4, 5, 8}
    pool.release(held)  # 1 comes back as an insertion: not in the ghost, so into small
    assert queues(pool) == ([8, 1], [3, 4, 5], [2, 6, 7])
    pool.serve(Lookup([9]))  # small tail 8 (freq 0) goes
    assert set(pool.resident) == {1, 3, 4, 5, 9}


def test_matches_a_per_object_reference_on_single_block_requests():
    """Single-block requests make the pool's protocol the same as libCacheSim's
    evict-then-insert loop, so an independent straightforward model must agree."""

    def reference(trace, cap, small_ratio=0.1, thr=2):
        s_size = max(1, int(cap * small_ratio))
        m_size, g_size = cap - s_size, cap - s_size
        small, main, ghost, freq = deque(), deque(), deque(), {}
        evicted_once, hits = False, 0
        for x in trace:
            if x in freq:
                hits += 1
                freq[x] = min(freq[x] + 1, 3)
                continue
            if len(small) + len(main) == cap:
                evicted_once = True
                done = False
                while not done:
                    if len(main) > m_size or not small:
                        y = main.popleft()
                        if freq[y]:
                            freq[y] -= 1
                            main.append(y)
                        else:
                            del freq[y]
                            done = True
                    else:
                        y = small.popleft()
                        if freq[y] >= thr:
                            freq[y] = 0
                            main.append(y)
                        else:
                            del freq[y]
                            ghost.append(y)
                            if len(ghost) > g_size:
                                ghost.popleft()
                            done = True
            freq[x] = 0
            if x in ghost:
                ghost.remove(x)
                main.append(x)
            elif not evicted_once and len(small) >= s_size:
                main.append(x)
            else:
                small.append(x)
        return hits

    rng = random.Random(3)
    trace = [int(rng.paretovariate(0.8)) if rng.random() < 0.6 else rng.randrange(1000, 5000) for _ in range(8000)]
    for cap, thr in ((10, 2), (37, 1), (100, 2), (100, 3), (400, 2)):
        pool = BlockPool(cap, make_policy("s3fifo", move_to_main_threshold=thr), emit_events=False)
        got = sum(pool.serve(Lookup([x])).hit_blocks for x in trace)
        assert got == reference(trace, cap, thr=thr), (cap, thr)


def scan_heavy_trace(seed):
    """A hot set of 10 blocks, re-read in bursts, between scans of one-hit blocks that are
    longer than the cache."""
    rng = random.Random(seed)
    hot = list(range(10))
    fresh = iter(range(1000, 10**9))
    out = []
    for _ in range(60):
        for _ in range(30):
            out.append([rng.choice(hot)])
        for _ in range(rng.randrange(10, 25)):
            out.append([next(fresh) for _ in range(rng.randrange(1, 4))])
    return out


def test_beats_lru_when_one_hit_traffic_dominates_a_tight_cache():
    trace = scan_heavy_trace(11)
    ratios = {}
    for name in ("lru", "s3fifo"):
        pool = BlockPool(20, make_policy(name), emit_events=False)
        for req in trace:
            pool.serve(Lookup(req))
        ratios[name] = pool.stats()["block_hit_ratio"]
    assert ratios["s3fifo"] > ratios["lru"] + 0.1, ratios


def freq_tracks_residency(pool):
    # every evictable block is in the order; a pinned one may have left it until its release
    tracked, resident = set(pool.policy._freq), set(pool.resident)
    assert resident - set(pool.pin_counts) <= tracked <= resident


@pytest.mark.parametrize("params", [{}, {"move_to_main_threshold": 1}, {"small_ratio": 0.3, "ghost_ratio": 2.0}])
def test_random_trace_invariants_with_pinned_requests(params):
    pool = BlockPool(30, make_policy("s3fifo", **params))
    run_invariants(pool, random_session_trace(9), random.Random(5), extra_check=freq_tracks_residency)
