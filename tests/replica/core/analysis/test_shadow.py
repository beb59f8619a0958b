"""replica/core/analysis/shadow.py: the adaptive policy's shadows run the calls the pool ran (lookups,
pins, kept responses) through the pool's own rules, so a cold shadow of the pool's size given every
call is the pool."""

import random

import pytest

from replica.core.analysis.shadow import ShadowCall, ShadowRecorder, replay, shadow_pool
from replica.core.cache.policies.adaptive import AdaptivePolicy
from replica.core.cache.pool import BlockPool, PoolBusyError
from replica.core.cache.types import ACQUIRE, RELEASE, SERVE, STORE, Lookup, PoolOp

CYCLE = [ShadowCall(SERVE, [h], float(t)) for t, h in enumerate([1, 2, 3, 1, 2, 3])]


def recording_pool(capacity: int, candidate: str = "lru", hit_mode: str = "prefix") -> tuple[BlockPool, AdaptivePolicy]:
    """A pool run by adaptive on one candidate, which never decides: its recorder holds every call."""
    policy = AdaptivePolicy(candidates=candidate, interval_s=1e9)
    return BlockPool(capacity, policy, emit_events=False, hit_mode=hit_mode), policy


def test_replay_hand_worked():
    # Capacity 2 on the cycle 1,2,3: LRU always evicts the block that comes next (no hit).
    # S3-FIFO (small 1, main 1, ghost 1): 2 lands in main during warm-up and stays; 1 and 3
    # churn through small. The second 2 is the one hit.
    assert replay(CYCLE, 2, "lru") == 0.0
    assert replay(CYCLE, 2, "s3fifo") == pytest.approx(1 / 6)
    assert replay([ShadowCall(SERVE, [1, 2, 3], 0.0)], 2, "lru") == 0.0  # longer than the shadow: 3 misses


def test_a_kept_response_is_stored_in_the_shadow_as_the_pool_stores_it_tail_first():
    """The scheduler's finish path: prompt 1,2,3 held while it runs, response 4,5 stored, prompt released.
    vLLM frees tail first, so the LRU order is 5,4 (the response, deepest first) then 3,2,1; the next
    request (9,10, another session) evicts one block of a pool of 6: the response's last, 5."""
    pool, policy = recording_pool(6)
    a = pool.acquire(Lookup([1, 2, 3], now=0))
    assert pool.store([4, 5], now=1) == [4, 5]
    pool.release(a, 2)
    pool.serve(Lookup([9, 10], now=3))
    assert set(pool.resident) == {1, 2, 3, 4, 9, 10} and list(policy.inner._queue) == [4, 3, 2, 1, 10, 9]
    calls = policy._recorder.calls
    assert [c.kind for c in calls] == [ACQUIRE, STORE, RELEASE, SERVE]  # acquired and released at once: served
    assert policy._recorder.blocks == 5  # looked up: 3 + 2; the stored response is no lookup
    shadow, hits, looked_up = shadow_pool(calls, 6, "lru", "prefix")
    assert shadow.resident == pool.resident and list(shadow.policy._queue) == [4, 3, 2, 1, 10, 9]
    assert (hits, looked_up) == (0, 5)
    # The next turn: prompt 1..5 (its history, the response included) and a new block 6. The pool evicted
    # 5, so it hits 1..4 (prefix mode: up to the first miss); so does the shadow.
    calls.append(ShadowCall(SERVE, [1, 2, 3, 4, 5, 6], 4.0))
    assert replay(calls, 6, "lru", "prefix") == pytest.approx(4 / 11)
    assert replay(calls, 6, "lru", "holes") == pytest.approx(4 / 11)  # nothing resident past the miss here


def test_a_store_of_blocks_already_resident_changes_nothing_in_the_shadow_either():
    pool, policy = recording_pool(4)
    pool.serve(Lookup([1, 2], now=0))
    assert pool.store([1, 2], now=1) == []  # resident: left as they are
    shadow, _, _ = shadow_pool(policy._recorder.calls, 4, "lru")
    assert list(shadow.policy._queue) == list(policy.inner._queue) == [2, 1]


def random_calls(pool: BlockPool, rng: random.Random, steps: int) -> None:
    """Sessions whose turns extend their history by their last response, held concurrently (up to 3
    at once) and finished in any order, each storing its response before its prompt is released."""
    history: dict[int, list[int]] = {}
    running: list[tuple[object, list[int]]] = []
    fresh = iter(range(10_000, 10**9))
    for t in range(steps):
        if running and (len(running) == 3 or rng.random() < 0.5):
            alloc, response = running.pop(rng.randrange(len(running)))
            pool.store(response, now=t)
            pool.release(alloc, t)
            continue
        s = rng.randrange(8)
        prompt = history.get(s, [])
        if not prompt or len(prompt) > 12:  # a new conversation of the session, on its system prompt
            prompt = [s * 100_000 + i for i in range(rng.randrange(1, 4))]
        prompt = prompt + [next(fresh) for _ in range(rng.randrange(0, 3))]
        response = [next(fresh) for _ in range(rng.randrange(0, 3))]
        history[s] = prompt + response
        try:
            running.append((pool.acquire(Lookup(prompt, str(s), now=t)), response))
        except PoolBusyError:
            history[s] = prompt[:1]


@pytest.mark.parametrize("candidate", ["lru", "s3fifo"])
def test_a_cold_shadow_of_the_pools_size_given_every_call_is_the_pool(candidate):
    pool, policy = recording_pool(24, candidate)
    random_calls(pool, random.Random(7), 400)
    shadow, _, _ = shadow_pool(policy._recorder.calls, 24, candidate, "prefix")
    assert shadow.resident == pool.resident and dict(shadow.pin_counts) == dict(pool.pin_counts)
    real, mine = policy.inner, shadow.policy
    if candidate == "lru":
        assert list(mine._queue) == list(real._queue)
    else:
        assert (list(mine._small), list(mine._main), list(mine._ghost), mine._freq) == \
            (list(real._small), list(real._main), list(real._ghost), real._freq)


def test_recorder_capacity_is_the_mean_room_for_hashed_blocks():
    rec = ShadowRecorder()
    for private in (0, 4, 2):
        rec.record(PoolOp(SERVE, [1], 0.0, private), 10)
    rec.record(PoolOp(STORE, [2], 0.0, 9), 10)  # not a lookup: no sample
    assert rec.mean_room() == 8 and rec.shadow_capacity() == 8 and rec.blocks == 3
    sampled = ShadowRecorder(rate=0.5)
    sampled.record(PoolOp(SERVE, list(range(10_000)), 0.0), 100)
    assert sampled.shadow_capacity() == 50
    assert 4_700 < sampled.blocks < 5_300  # about half the hash space
    assert sampled.hit_mode("prefix") == "holes" and rec.hit_mode("prefix") == "prefix"


def test_a_release_of_a_request_acquired_before_the_interval_is_not_recorded():
    rec = ShadowRecorder()
    earlier, now = [1, 2], [3]
    rec.record(PoolOp(RELEASE, earlier, 0.0), 10)
    rec.record(PoolOp(ACQUIRE, now, 1.0), 10)
    rec.record(PoolOp(STORE, [4], 2.0), 10)
    rec.record(PoolOp(RELEASE, now, 3.0), 10)
    assert [(c.kind, c.key == id(now)) for c in rec.calls] == [(ACQUIRE, True), (STORE, False), (RELEASE, True)]
    rec.record(PoolOp(ACQUIRE, earlier, 4.0), 10)
    rec.record(PoolOp(RELEASE, earlier, 4.0), 10)
    assert rec.calls[-1] == ShadowCall(SERVE, earlier, 4.0)  # acquired and released at once: served
