"""Offline oracles Belady and BeladyCompute through a real BlockPool (holes mode).

``next_use`` is computed here by a backward pass over the trace: for each block of a
request, the time of the next request containing it (inf when none).
"""

import gzip
import json
import random
from functools import cache
from itertools import combinations
from math import inf

import pytest

from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import make_policy, policy_class, policy_names
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from tests.support.policy_checks import run_timed_invariants
from tests.support.policy_traces import block_cost_512, session_workload, timed_prefix_trace


def positions(trace):
    """Where each request starts in the order the cache sees block accesses."""
    out, pos = [], 0
    for _, req in trace:
        out.append(pos)
        pos += len(req)
    return out


def next_uses(trace):
    """trace: [(t, hashes)] -> per request, each block's next access position (inf: never)."""
    starts = positions(trace)
    nxt: dict[int, float] = {}
    out = []
    for k in range(len(trace) - 1, -1, -1):
        req = trace[k][1]
        out.append([nxt.get(h, inf) for h in req])
        for i, h in enumerate(req):
            nxt[h] = starts[k] + i
    return out[::-1]


def replay(name, trace, capacity, cost=None, **kw):
    metrics = PoolMetrics(block_cost=cost) if cost else None
    pool = BlockPool(capacity, make_policy(name), metrics=metrics, block_cost=cost, **kw)
    hits = 0
    for (t, req), nu, pos in zip(trace, next_uses(trace), positions(trace)):
        hits += pool.serve(Lookup(req, now=t, next_use=nu, position=pos)).hit_blocks
    return hits, pool


def test_registered_as_oracles():
    assert {n for n in policy_names() if policy_class(n).needs_future} == {"belady", "belady_compute"}
    assert make_policy("belady").needs_future and make_policy("belady_compute").needs_future


def test_classic_reference_string_belady_beats_lru():
    # 1 2 3 4 1 2 5 1 2 3 4 5 with 3 frames: OPT 7 faults (5 hits), LRU 10 faults (2 hits)
    trace = [(float(t), [b]) for t, b in enumerate([1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5])]
    hits, pool = replay("belady", trace, 3)
    assert hits == 5
    # OPT's choices: t3 evicts 3 (next use 9), t6 evicts 4 (10); t9 evicts 1 or 2 (never again:
    # the larger hash, 2, goes), t10 evicts 3 (never again) -> {1, 4, 5}
    assert set(pool.resident) == {1, 4, 5}
    assert replay("lru", trace, 3)[0] == 2
    assert hits == brute_force_hits([req for _, req in trace], 3)


def brute_force_hits(requests, capacity):
    """Maximum block hits over every eviction choice (holes mode: a request's resident blocks
    all hit; its blocks stay pinned; new blocks are always inserted)."""

    @cache
    def best(i, resident):
        if i == len(requests):
            return 0
        req = set(requests[i])
        hits = len(req & resident)
        need = len(req - resident) - (capacity - len(resident))
        if need <= 0:
            return hits + best(i + 1, resident | req)
        return hits + max(best(i + 1, (resident - set(ev)) | req)
                          for ev in combinations(sorted(resident - req), need))

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(12))
def test_belady_equals_brute_force_optimum_on_tiny_traces(seed):
    rng = random.Random(seed)
    capacity = rng.choice([3, 4])
    requests = [rng.sample(range(1, 8), rng.randint(1, 3)) for _ in range(11)]
    trace = [(float(t), req) for t, req in enumerate(requests)]
    assert replay("belady", trace, capacity)[0] == brute_force_hits(requests, capacity)


@pytest.mark.parametrize("seed, capacity", [(1, 14), (2, 25), (3, 50), (4, 100)])
def test_belady_at_least_lru_on_random_traces(seed, capacity):
    trace = timed_prefix_trace(seed, n=1500)
    belady, _ = replay("belady", trace, capacity)
    lru, _ = replay("lru", trace, capacity)
    assert belady >= lru


def oracle_reference(trace, capacity, cost, compute):
    """Full-scan oracle; yields the resident set after each request. Belady: evict the largest
    (next use, hash); BeladyCompute: never-used-again blocks first, cheapest first, then the
    largest ((next use - now) / cost, hash), now = the incoming request's position."""
    rec: dict[int, tuple[float, int]] = {}  # block -> (next use, depth)
    clock = 0.0

    def key(h):
        t, d = rec[h]
        if not compute:
            return (t, h)
        if t == inf:
            return (1, -cost(d), h)
        return (0, max(t - clock, 1e-9) / cost(d), h)  # a past next use counts as "needed now"

    for req, nu, pos in zip([r for _, r in trace], next_uses(trace), positions(trace)):
        clock = pos  # victims are scored at the incoming request's position
        need = sum(1 for h in req if h not in rec) - (capacity - len(rec))
        if need > 0:
            for h in sorted((h for h in rec if h not in req), key=key, reverse=True)[:need]:
                del rec[h]
        for i, h in enumerate(req):
            rec[h] = (nu[i], i)
        yield set(rec)


@pytest.mark.parametrize("name", ["belady", "belady_compute"])
@pytest.mark.parametrize("seed, capacity", [(5, 13), (6, 30), (7, 60)])
def test_matches_full_scan_reference(name, seed, capacity):
    rng = random.Random(seed)
    table = [rng.uniform(1, 50) for _ in range(64)]
    cost = table.__getitem__
    # integer times with repeats: equal next uses make ties, broken by hash
    trace = [(float(int(t)), req) for t, req in timed_prefix_trace(seed, n=1200)]
    pool = BlockPool(capacity, make_policy(name), metrics=PoolMetrics(block_cost=cost), block_cost=cost)
    expected = oracle_reference(trace, capacity, cost, name == "belady_compute")
    for (t, req), nu, pos, want in zip(trace, next_uses(trace), positions(trace), expected):
        pool.serve(Lookup(req, now=t, next_use=nu, position=pos))
        assert set(pool.resident) == want


def test_belady_compute_seed002_example():
    # Seed 002: one slot, A reused in 10 s at cost 1, B reused in 11 s at cost 100:
    # Belady evicts B (farther), BeladyCompute keeps it. Costs by depth: depth 1 costs 100.
    def cost(d):
        return 100.0 if d == 1 else 1.0

    X, B, A, C = 1, 2, 3, 4
    trace = [
        (0.0, [X, B]),  # B at depth 1 (cost 100), next used at 11; X next used at 3
        (1.0, [A]),  # A next used at 10; the pool (3 blocks) is full
        (2.0, [C]),  # one slot needed, choice among X (3), B (11), A (10)
        (3.0, [X]),
        (10.0, [A]),
        (11.0, [X, B]),
    ]
    # Positions (the access order): X 0, B 1, A 2, C 3, X 4, A 5, X 6, B 7. At C (position 3)
    # Belady evicts the farthest, B (7). BeladyCompute: X (4-3)/1 = 1, B (7-3)/100 = 0.04,
    # A (5-3)/1 = 2 -> evicts A and keeps B.
    states = {}
    for name in ("belady", "belady_compute"):
        pool = BlockPool(3, make_policy(name), metrics=PoolMetrics(block_cost=cost), block_cost=cost)
        hits = []
        for (t, req), nu, pos in zip(trace, next_uses(trace), positions(trace)):
            hits.append(pool.serve(Lookup(req, now=t, next_use=nu, position=pos)).hit_idx)
            if t == 2.0:
                states[name] = set(pool.resident)
        states[name, "hits"] = hits
        states[name, "stats"] = pool.stats()
    assert states["belady"] == {X, A, C}
    assert states["belady_compute"] == {X, B, C}
    # Belady hits X, A, X (cost 3); BeladyCompute hits X, X, B (cost 102), of 206 in all
    assert states["belady", "hits"] == [[], [], [], [0], [0], [0]]
    assert states["belady_compute", "hits"] == [[], [], [], [0], [], [0, 1]]
    assert states["belady", "stats"]["block_hits"] == states["belady_compute", "stats"]["block_hits"] == 3
    assert states["belady", "stats"]["csr"] == pytest.approx(3 / 206)
    assert states["belady_compute", "stats"]["csr"] == pytest.approx(102 / 206)


def test_belady_compute_trades_hits_for_csr_on_sessions():
    trace = [(t, req) for t, _, req in session_workload(1)]
    res = {}
    for name in ("belady", "belady_compute"):
        pool = BlockPool(300, make_policy(name), block_size=512, emit_events=False,
                         metrics=PoolMetrics(block_size=512, block_cost=block_cost_512), block_cost=block_cost_512)
        for (t, req), nu, pos in zip(trace, next_uses(trace), positions(trace)):
            pool.serve(Lookup(req, now=t, next_use=nu, position=pos))
        res[name] = pool.stats()
    assert res["belady"]["block_hit_ratio"] > res["belady_compute"]["block_hit_ratio"]  # 0.625 vs 0.613
    assert res["belady_compute"]["csr"] > res["belady"]["csr"] + 0.03  # 0.641 vs 0.576


@pytest.mark.parametrize("name", ["belady", "belady_compute"])
def test_pinned_never_evicted_and_events_replay(name):
    trace = timed_prefix_trace(12, n=1500)
    pool = BlockPool(40, make_policy(name), block_cost=lambda d: 1.0 + d)
    run_timed_invariants(pool, trace, random.Random(9), next_uses=next_uses(trace), positions=positions(trace))


@pytest.mark.parametrize("name", ["belady", "belady_compute"])
def test_victims_distinct_resident_unpinned(name):
    pool = BlockPool(10, make_policy(name))
    for t in range(5):
        pool.serve(Lookup([2 * t, 2 * t + 1], now=t, next_use=[inf, 100.0 - t]))
    pool.acquire(Lookup([0, 1, 9], now=6, next_use=[inf, inf, inf]))  # pins 0, 1, 9; all never used again
    victims = pool.policy.victims(4)
    assert len(set(victims)) == 4 and set(victims) <= set(pool.resident)
    assert not set(victims) & {0, 1, 9}
    assert set(victims) == {2, 4, 6, 8}  # the never-used-again blocks that are not pinned


def test_missing_next_use_counts_as_never():
    pool = BlockPool(2, make_policy("belady"))
    pool.serve(Lookup([1], now=0, next_use=[5.0]))
    pool.serve(Lookup([2], now=1))  # no next_use: never again
    pool.serve(Lookup([3], now=2, next_use=[inf]))
    assert set(pool.resident) == {1, 3}


def test_mooncake_belady_hit_ratio(mooncake_conversation):
    with gzip.open(mooncake_conversation, "rt") as f:
        lines = [json.loads(line) for line in f]
    trace = [(line["timestamp"] / 1000, line["hash_ids"]) for line in lines]
    pool = BlockPool(18279, make_policy("belady"), block_size=512, emit_events=False)
    for (t, req), nu, pos in zip(trace, next_uses(trace), positions(trace)):
        pool.serve(Lookup(req, now=t, next_use=nu, position=pos))
    assert pool.stats()["block_hit_ratio"] == pytest.approx(0.366, abs=0.002)  # measured 0.3664


def test_requests_sharing_a_timestamp_are_ordered_by_position():
    # Capacity 2, every request at t=0. At [1] the resident blocks are 2 and 3: 3 comes back at
    # position 3, 2 only at position 4, so the optimum evicts 2 and then hits 3 and 1. Next uses
    # by timestamp would all read 0 and break the tie on the hash (evicting 3): one hit, not two.
    requests = [[2], [3], [1], [3], [2], [1], [4]]
    trace = [(0.0, req) for req in requests]
    hits, pool = replay("belady", trace, 2)
    assert hits == 2 == brute_force_hits(requests, 2)
    assert next_uses(trace)[2] == [5] and next_uses(trace)[0] == [4]


@pytest.mark.parametrize("seed", range(12))
def test_belady_equals_brute_force_optimum_when_timestamps_collide(seed):
    rng = random.Random(100 + seed)
    capacity = rng.choice([2, 3])
    requests = [rng.sample(range(1, 7), rng.randint(1, 2)) for _ in range(10)]
    trace = [(float(k // 4), req) for k, req in enumerate(requests)]  # four requests per timestamp
    assert replay("belady", trace, capacity)[0] == brute_force_hits(requests, capacity)


@pytest.mark.parametrize("seed", range(3))
def test_belady_compute_victims_are_the_full_scan_argmax_under_batching(seed):
    # Up to 6 requests hold pins at once (as under continuous batching), positions sometimes step
    # back (causal arrivals), and victims calls come one after another at one position: each call
    # must return the full scan's order over resident unpinned blocks (never-again ones first,
    # cheapest first, then the largest (next use - now) / cost, ties on the larger hash).
    rng = random.Random(seed)
    table = [rng.uniform(1, 50) for _ in range(64)]
    cost = table.__getitem__
    trace = timed_prefix_trace(seed, n=800)
    nus, pos = next_uses(trace), positions(trace)
    pool = BlockPool(60, make_policy("belady_compute"), block_cost=cost)
    rec: dict[int, tuple[float, int]] = {}
    policy = pool.policy
    real_victims = policy.victims

    def checked_victims(need):
        now = pool.policy_context.position

        def key(h):
            t, d = rec[h]
            return (1, -cost(d), h) if t == inf else (0, max(t - now, 1e-9) / cost(d), h)

        free = [h for h in pool.resident if not pool.is_pinned(h)]
        want = sorted(free, key=key, reverse=True)[:need]
        got = real_victims(need)
        assert got == want
        return got

    policy.victims = checked_victims
    held: list = []
    for k, ((t, req), nu) in enumerate(zip(trace, nus)):
        while held and (len(held) >= 6 or rng.random() < 0.3):
            pool.release(held.pop(rng.randrange(len(held))), now=t)
        p = pos[k] - (rng.randrange(40) if rng.random() < 0.05 else 0)
        try:
            alloc = pool.acquire(Lookup(req, now=t, next_use=nu, position=p))
        except Exception:  # too many pins for the pool right now: free them all, then retry
            while held:
                pool.release(held.pop(), now=t)
            alloc = pool.acquire(Lookup(req, now=t, next_use=nu, position=p))
        rec.update((h, (nu[i], i)) for i, h in enumerate(req))
        held.append(alloc)


@pytest.mark.parametrize("name", ["belady", "belady_compute"])
def test_a_block_pinned_again_with_the_same_next_use_is_never_a_victim_and_comes_back(name):
    """A preempted request re-admitted re-records the very next uses its released blocks were
    pushed with: those heap entries must still count as stale while the blocks are pinned, or
    the pool skips them as victims and the oracle forgets them for good."""
    pool = BlockPool(4, make_policy(name))
    nu = [50.0, 60.0] if name == "belady" else [inf, inf]
    a = pool.acquire(Lookup([1, 2], now=0, position=0, next_use=nu))
    pool.release(a, 1)  # 1 and 2 pushed with their next uses
    a = pool.acquire(Lookup([1, 2], now=2, position=0, next_use=nu))  # re-admitted: pinned, same next uses
    pool.serve(Lookup([3, 4], now=3, position=1, next_use=[5.0, 6.0]))
    pool.serve(Lookup([5, 6], now=4, position=2, next_use=[7.0, 8.0]))  # needs 2 victims: only 3 and 4 qualify
    assert sorted(pool.resident) == [1, 2, 5, 6]
    pool.release(a, 5)
    pool.serve(Lookup([7, 8], now=6, position=3, next_use=[9.0, 10.0]))  # 1 and 2 are evictable again
    assert len(pool.resident) == 4 and 7 in pool.resident
    pool.serve(Lookup([9, 10, 11, 12], now=7, position=4, next_use=[inf] * 4))  # every block is evictable
    assert sorted(pool.resident) == [9, 10, 11, 12]
