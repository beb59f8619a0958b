import random

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from shared.errors import InputError
from tests.support.policy_checks import checked_victims, run_invariants


def sl_pool(capacity, **kw):
    return BlockPool(capacity, make_policy("session_lru"), **kw)


def order(pool):
    """Units from LRU to MRU; anonymous units show as ('anon', n)."""
    return [("anon", k[1]) if isinstance(k, tuple) else k for k in pool.policy._units]


def test_takes_no_parameters():
    with pytest.raises(InputError):
        make_policy("session_lru", x=1)


def test_hand_worked_trace():
    pool = sl_pool(6)
    checked_victims(pool)
    hits = []

    def serve(hashes, session):
        hits.append(pool.serve(Lookup(hashes, session=session)).hit_blocks)

    serve([1, 2], "a")
    serve([3], "b")
    serve([1, 2, 4], "a")  # a reuses its two blocks, adds 4, moves to MRU
    assert order(pool) == ["b", "a"]
    serve([5, 6], "c")  # fills the pool exactly, no eviction
    serve([7], "d")  # one block needed: the LRU session b (1 block) goes
    assert set(pool.resident) == {1, 2, 4, 5, 6, 7}
    serve([8], "e")  # one block needed: the LRU session a goes whole (3 blocks)
    assert set(pool.resident) == {5, 6, 7, 8}
    assert order(pool) == ["c", "d", "e"]
    serve([1, 2], "a")  # a comes back from scratch; 2 blocks free
    assert order(pool) == ["c", "d", "e", "a"]
    # No session: its own unit. It reuses c's block 5, which is pinned while victims()
    # runs, so c is skipped (moved to MRU) and d goes; then c, the owner of the reused
    # block, and the new anonymous unit become the most recent.
    serve([5, 9], None)
    assert set(pool.resident) == {1, 2, 5, 6, 8, 9}
    assert order(pool) == ["e", "a", "c", ("anon", 1)]
    serve([10, 11], "f")  # 2 needed: e (1 block) is not enough, a (2) goes too
    assert set(pool.resident) == {5, 6, 9, 10, 11}
    assert order(pool) == ["c", ("anon", 1), "f"]
    serve([9, 12], None)  # reuses the first anonymous request's block: that unit is refreshed
    assert order(pool) == ["c", "f", ("anon", 1), ("anon", 2)]
    serve([13], "g")  # c (2 blocks) goes
    assert set(pool.resident) == {9, 10, 11, 12, 13}
    assert hits == [0, 0, 2, 0, 0, 0, 0, 1, 0, 1, 0]
    assert pool.metrics.evictions == 1 + 3 + 1 + 3 + 2


def test_a_session_with_a_running_request_is_skipped():
    pool = sl_pool(6)
    checked_victims(pool)
    held = pool.acquire(Lookup([1, 2], session="a"))
    pool.serve(Lookup([3, 4], session="b"))
    pool.serve(Lookup([5, 6], session="c"))
    pool.serve(Lookup([7], session="d"))  # a (LRU) is pinned: skipped and moved to MRU; b goes
    assert set(pool.resident) == {1, 2, 5, 6, 7}
    assert order(pool) == ["c", "a", "d"]
    for i in range(8, 40, 2):
        pool.serve(Lookup([i, i + 1], session=f"s{i}"))
        assert {1, 2} <= set(pool.resident)
    pool.release(held)
    for i in range(40, 52, 2):
        pool.serve(Lookup([i, i + 1], session=f"s{i}"))
    assert not {1, 2} & set(pool.resident)


def test_only_when_every_evictable_block_sits_in_a_pinned_session_is_one_split():
    pool = sl_pool(4)
    checked_victims(pool)
    pool.serve(Lookup([1, 2, 3], session="a"))
    held = pool.acquire(Lookup([1], session="x"))  # x reuses a's first block and keeps it pinned
    pool.serve(Lookup([4, 5], session="b"))  # 1 block needed; a is the only unit and is pinned
    assert set(pool.resident) == {1, 4, 5}  # a's unpinned blocks 2, 3 went, all of them
    pool.release(held)  # block 1 returns to a's unit, the most recent now
    pool.serve(Lookup([6, 7], session="c"))  # so b is the LRU unit and goes
    assert set(pool.resident) == {1, 6, 7}


def test_set_policy_groups_resident_blocks_by_owner():
    pool = BlockPool(6, make_policy("lru"))
    pool.serve(Lookup([1, 2], session="a"))
    pool.serve(Lookup([3], session="b"))
    pool.serve(Lookup([4], session=None))
    pool.serve(Lookup([5], session="a"))
    pool.set_policy(make_policy("session_lru"))
    units = pool.policy._units
    assert {k: sorted(v) for k, v in units.items() if not isinstance(k, tuple)} == {"a": [1, 2, 5], "b": [3]}
    assert [list(v) for k, v in units.items() if isinstance(k, tuple)] == [[4]]
    pool.serve(Lookup([6, 7], session="c"))  # 1 needed: a, the first owner met, is the LRU unit
    assert set(pool.resident) == {3, 4, 6, 7}


def session_trace(seed, n=3000, capacity=40):
    """Sessions whose every request is the whole conversation so far plus new blocks,
    no sharing between sessions, plus anonymous one-off requests."""
    rng = random.Random(seed)
    fresh = iter(range(1, 10**9))
    chains: dict[str, list[int]] = {}
    names = {}
    out = []
    for _ in range(n):
        s = rng.randrange(15)
        if s == 0:
            out.append((None, [next(fresh) for _ in range(rng.randrange(1, 5))]))
            continue
        name = names.setdefault(s, f"s{s}.0")
        chain = chains.setdefault(name, [])
        add = rng.randrange(1, 5)
        if len(chain) + add > capacity // 2:  # the conversation ends; a new one starts
            name = names[s] = f"s{s}.{len(chains)}"
            chain = chains[name] = []
        chain.extend(next(fresh) for _ in range(add))
        out.append((name, list(chain)))
    return out


def test_no_session_is_ever_partially_resident():
    pool = sl_pool(40)
    checked_victims(pool)
    content: dict[str | None, set[int]] = {}  # blocks a session inserted since it was last evicted
    splits = 0
    for step, (session, hashes) in enumerate(session_trace(4)):
        alloc = pool.serve(Lookup(hashes, session=session, now=step))
        if session is not None:
            content.setdefault(session, set()).update(hashes[i] for i in alloc.new_idx)
        resident = pool.resident
        for s, blocks in content.items():
            present = sum(1 for h in blocks if h in resident)
            if present == 0:
                blocks.clear()  # evicted whole (or never stored)
            elif present != len(blocks):
                splits += 1
            else:
                assert all(resident[h] == s for h in blocks)
        # the policy's incremental units mirror the pool's residency and owners
        units = pool.policy._units
        assert sum(len(b) for b in units.values()) == len(resident)
        for k, blocks in units.items():
            assert blocks
            for h in blocks:
                assert resident[h] == (None if isinstance(k, tuple) else k)
    assert splits == 0
    assert pool.metrics.evictions > 1000 and pool.metrics.block_hits > 1000


def with_shared_system_prompt(trace, rng):
    """One request in five gets a shared system prompt, owned by whoever stored it; read
    lazily so the draws interleave with run_invariants' own."""
    system = [10**8, 10**8 + 1]
    for session, hashes in trace:
        yield session, (system + hashes[:30] if rng.random() < 0.2 else hashes)


def units_track_residency(pool):
    # every evictable block is in a unit; a pinned one may have left until its release
    tracked, resident = set(pool.policy._unit_of), set(pool.resident)
    assert resident - set(pool.pin_counts) <= tracked <= resident


def test_random_trace_invariants_with_pinned_requests():
    rng = random.Random(8)
    run_invariants(sl_pool(40), with_shared_system_prompt(session_trace(12), rng), rng,
                   extra_check=units_track_residency, reset_every=700)
