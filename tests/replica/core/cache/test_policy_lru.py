import random
from collections import OrderedDict

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from tests.support.policy_checks import run_invariants
from tests.support.policy_traces import random_session_trace


def test_hand_worked_trace_vllm_order():
    # capacity 4. Request [A,B,C] frees C first, then B, A: queue head->tail = C, B, A.
    pool = BlockPool(4, make_policy("lru"))
    A, B, C, D, E, F = range(1, 7)
    assert pool.serve(Lookup([A, B, C])).hit_blocks == 0
    assert pool.serve(Lookup([D])).hit_blocks == 0  # queue: C B A D
    # [E, F] needs 2 slots with 4 used... 0 free -> evict C, B (the deepest of the first request)
    assert pool.serve(Lookup([E, F])).hit_blocks == 0
    assert set(pool.resident) == {A, D, E, F}
    # A is still resident although it is older than D: the shallow block survives
    assert pool.serve(Lookup([A, B])).hit_idx == [0]
    assert set(pool.resident) == {A, B, E, F}  # D was the LRU head after F, E were queued behind it
    hits = sum(pool.serve(Lookup(r)).hit_blocks for r in ([E, F], [A, B], [C]))
    assert hits == 4
    assert set(pool.resident) == {A, B, C, F} or set(pool.resident) == {A, B, C, E}


def reference_lru(requests, capacity):
    """Independent replay: per request, hits = blocks resident at its start; then the
    request's blocks move to the MRU end with the shallowest most recent; evict from the
    LRU end."""
    od: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for req in requests:
        hits += sum(1 for h in req if h in od)
        for h in req:
            od.pop(h, None)
        while len(od) + len(req) > capacity:
            od.popitem(last=False)
        for h in reversed(req):
            od[h] = None
    return hits


def random_prefix_trace(seed, n=3000):
    rng = random.Random(seed)
    sessions = {}
    out = []
    next_id = iter(range(1, 10**9))
    for _ in range(n):
        s = rng.randrange(60)
        chain = sessions.setdefault(s, [next(next_id)])
        chain.extend(next(next_id) for _ in range(rng.randrange(0, 4)))
        if rng.random() < 0.1:
            chain[:] = chain[: rng.randrange(1, len(chain) + 1)]
        out.append(list(chain[: rng.randrange(1, len(chain) + 1)]) if rng.random() < 0.3 else list(chain))
    return out


def test_matches_independent_ordereddict_replay():
    trace = random_prefix_trace(7)
    for cap in (40, 100, 250, 700):
        if max(len(r) for r in trace) > cap:
            continue
        pool = BlockPool(cap, make_policy("lru"), emit_events=False)
        got = sum(pool.serve(Lookup(r)).hit_blocks for r in trace)
        assert got == reference_lru(trace, cap), cap


def queue_matches_residency(pool):
    """Every resident unpinned block is queued, and only resident blocks are queued (pinned
    hits may stay queued: victims() skips them and on_release re-queues them)."""
    queued = set(pool.policy._queue)
    assert queued <= set(pool.resident)
    assert {h for h in pool.resident if not pool.is_pinned(h)} <= queued


@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
def test_random_trace_invariants_with_pinned_requests(hit_mode):
    pool = BlockPool(30, make_policy("lru"), hit_mode=hit_mode)
    run_invariants(pool, random_session_trace(8), random.Random(4), extra_check=queue_matches_residency)
