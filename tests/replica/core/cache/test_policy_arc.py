import random

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from shared.errors import InputError
from tests.support.policy_checks import checked_victims, run_invariants
from tests.support.policy_traces import random_session_trace


def lists(pool):
    """T1, T2, B1, B2 from LRU to MRU."""
    pol = pool.policy
    return list(pol._t1), list(pol._t2), list(pol._b1), list(pol._b2)


def test_takes_no_parameters():
    with pytest.raises(InputError):
        make_policy("arc", p=3)
    assert make_policy("arc").describe() == {"name": "arc", "p": 0.0}


def test_hand_worked_trace_and_p_adaptation():
    pool = BlockPool(4, make_policy("arc"))
    checked_victims(pool)
    pol = pool.policy
    hits = []

    def serve(*hashes):
        hits.append(pool.serve(Lookup(list(hashes))).hit_blocks)

    serve(1)
    serve(2)
    serve(1)  # hit in T1 -> MRU of T2
    serve(3)
    serve(4)
    assert lists(pool) == ([2, 3, 4], [1], [], [])
    serve(5)  # REPLACE: |T1| = 3 > p = 0 -> T1's LRU 2 goes to B1
    assert lists(pool) == ([3, 4, 5], [1], [2], [])
    serve(2)  # REPLACE first (3 -> B1), then the B1 hit: p += max(|B2|/|B1|, 1) = 1; 2 -> T2
    assert lists(pool) == ([4, 5], [1, 2], [3], [])
    assert pol.p == 1
    serve(6)  # |T1| = 2 > 1: 4 -> B1
    serve(7)  # 5 -> B1, then |T1| + |B1| = 5 > c: B1 drops its LRU 3
    assert lists(pool) == ([6, 7], [1, 2], [4, 5], [])
    serve(1)  # hit in T2 -> MRU
    serve(8)  # 6 -> B1; B1 drops 4
    assert lists(pool) == ([7, 8], [2, 1], [5, 6], [])
    serve(5)  # 7 -> B1, then B1 hit: p = 1 + max(0/3, 1) = 2
    assert lists(pool) == ([8], [2, 1, 5], [6, 7], [])
    assert pol.p == 2
    serve(9)  # |T1| = 1 <= p: T2's LRU 2 -> B2
    assert lists(pool) == ([8, 9], [1, 5], [6, 7], [2])
    serve(2)  # |T1| = 2 <= p: 1 -> B2; then the B2 hit: p = 2 - max(|B1|/|B2| = 2/2, 1) = 1
    assert lists(pool) == ([8, 9], [5, 2], [6, 7], [1])
    assert pol.p == 1
    assert set(pool.resident) == {2, 5, 8, 9}
    # Two new blocks: victims(2) first (|T1| = 2 > 1: 8 -> B1; |T1| = 1: T2's LRU 5 -> B2),
    # then inserted deepest first (11, 10): B1 is trimmed to keep |T1| + |B1| <= 4.
    serve(10, 11)
    assert lists(pool) == ([9, 11, 10], [2], [8], [1, 5])
    assert set(pool.resident) == {2, 9, 10, 11}
    assert hits == [0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert pol.describe() == {"name": "arc", "p": 1.0}


def test_p_moves_by_the_ghost_size_ratio():
    pool = BlockPool(4, make_policy("arc"))
    checked_victims(pool)
    pol = pool.policy
    for h in (1, 2, 3, 4, 1, 2, 3, 4):
        pool.serve(Lookup([h]))
    assert lists(pool) == ([], [1, 2, 3, 4], [], [])
    pool.serve(Lookup([5]))  # T1 is empty: T2's LRU 1 -> B2
    assert lists(pool) == ([5], [2, 3, 4], [], [1])
    pool.serve(Lookup([6]))  # |T1| = 1 > p = 0: 5 -> B1
    for h in (6, 7, 7, 8):  # each one-timer pushes T2's LRU into B2 once the last is a hit
        pool.serve(Lookup([h]))
    assert lists(pool) == ([8], [4, 6, 7], [5], [1, 2, 3])
    pool.serve(Lookup([5]))  # 8 -> B1 first; B1 hit with |B2| = 3, |B1| = 2: p += 3/2
    assert lists(pool) == ([], [4, 6, 7, 5], [8], [1, 2, 3])
    assert pol.p == 1.5
    pool.serve(Lookup([1]))  # T1 is empty: 4 -> B2; B2 hit with |B1|/|B2| = 1/4 < 1: p -= 1
    assert lists(pool) == ([], [6, 7, 5, 1], [8], [2, 3, 4])
    assert pol.p == 0.5
    assert pool.metrics.block_hits == 6


def test_pinned_blocks_leave_the_lists_and_return_to_t2_on_release():
    pool = BlockPool(4, make_policy("arc"))
    checked_victims(pool)
    held = pool.acquire(Lookup([1, 2]))  # T1 [2, 1], both pinned
    pool.serve(Lookup([3]))
    pool.serve(Lookup([3]))
    pool.serve(Lookup([4]))
    pool.serve(Lookup([4]))
    assert lists(pool) == ([2, 1], [3, 4], [], [])
    # |T1| > p: T1's LRU 2, then 1, go to B1, but both are pinned, so the pool keeps them and
    # asks again; T1 is empty now, so T2's LRU 3 goes to B2
    pool.serve(Lookup([5]))
    assert lists(pool) == ([5], [4], [2, 1], [3])
    assert set(pool.resident) == {1, 2, 4, 5}
    for h in range(6, 40):
        pool.serve(Lookup([h]))
        assert {1, 2} <= set(pool.resident)
    pool.release(held)  # both return to T2's MRU end, out of the ghost
    t1, t2, b1, b2 = lists(pool)
    assert t2[-2:] == [2, 1] and not {1, 2} & set(b1 + b2)


def test_ghost_lists_stay_bounded():
    rng = random.Random(1)
    pool = BlockPool(16, make_policy("arc"), emit_events=False)
    pol = pool.policy
    for _ in range(5000):
        pool.serve(Lookup(rng.sample(range(80), rng.randrange(1, 4)) if rng.random() < 0.5
                   else rng.sample(range(1000), rng.randrange(1, 3))))
        t1, t2, b1, b2 = (len(x) for x in lists(pool))
        assert t1 + t2 == pool.used
        assert t1 + b1 <= 16 and t1 + t2 + b1 + b2 <= 32
        assert 0 <= pol.p <= 16


def lists_match_residency(pool):
    """T1 and T2 split the evictable blocks between them; the ghosts hold none of them."""
    t1, t2, b1, b2 = lists(pool)
    # a pinned block the policy gave up sits in a ghost, resident, until its release
    evictable = set(pool.resident) - set(pool.pin_counts)
    assert evictable <= set(t1) | set(t2) <= set(pool.resident) and not set(t1) & set(t2)
    assert not (set(b1) | set(b2)) & evictable


@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
def test_random_trace_invariants_with_pinned_requests(hit_mode):
    pool = BlockPool(30, make_policy("arc"), hit_mode=hit_mode)
    run_invariants(pool, random_session_trace(10), random.Random(6), extra_check=lists_match_residency)
