"""RandomCompute and PartialNode RandomCompute (seed 002, principles 3 and 4) through a real BlockPool.

With ``sample_size`` >= the pool size every candidate is scored, so the policies are
deterministic and the hand-worked traces below are exact. Reminder of the scoring clock:
the pool asks for victims before it reports the request that needs the space, so scores
use ``now`` = the incoming request's time (the pool tells policies before evicting).
"""

import random

import pytest

from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from shared.errors import InputError
from tests.support.policy_checks import run_timed_invariants
from tests.support.policy_traces import block_cost_512, session_workload, timed_prefix_trace

A, B, C, D, E, F, G, H, I, X, Y, Z, P, Q, R = range(1, 16)  # noqa: E741  (block names, as in the seed)


def pool_with(name, capacity, cost=None, **params):
    metrics = PoolMetrics(block_cost=cost) if cost else None
    return BlockPool(capacity, make_policy(name, **params), metrics=metrics, block_cost=cost)


# ---- RandomCompute, hand-worked ------------------------------------------------------------
def test_random_compute_keeps_the_expensive_deep_block_lru_drops():
    def cube(d):  # depth 0: 1, depth 1: 8
        return float((d + 1) ** 3)

    rc = pool_with("random_compute", 4, cube, decay_halflife_s=10)
    lru = pool_with("lru", 4, cube)
    for pool in (rc, lru):
        pool.serve(Lookup([A, B], now=0))  # A d0 c1, B d1 c8, f=1, last 0
        pool.serve(Lookup([C], now=10))
        pool.serve(Lookup([D], now=20))
    # [E] at 30 needs one slot; scores at now=30: cost * f * 2^(-idle/10) / idle
    #   A: 1 * 0.125 / 30 = 0.0042   B: 8 * 0.125 / 30 = 0.033   C: 1 * 0.25 / 20 = 0.0125
    #   D: 1 * 0.5 / 10 = 0.05 -> evict A
    rc.serve(Lookup([E], now=30))
    lru.serve(Lookup([E], now=30))
    assert set(rc.resident) == {B, C, D, E}  # A (cheap) went
    assert set(lru.resident) == {A, C, D, E}  # LRU head was B (the deepest block of [A, B])
    # [A, B] at 40: B pinned; now=40: C 1*0.125/30=0.0042, D 1*0.25/20=0.0125, E 1*0.5/10=0.05 -> evict C
    assert rc.serve(Lookup([A, B], now=40)).hit_idx == [1]
    assert set(rc.resident) == {A, B, D, E}
    assert lru.serve(Lookup([A, B], now=40)).hit_idx == [0]
    # B: f = 1*2^(-4) + 1 = 1.0625, last 40; A new at 40. [F] at 50, now=50:
    #   A 1*0.5/10 = 0.05; B 8*1.0625*0.5/10 = 0.425; D 1*0.125/30 = 0.0042; E 1*0.25/20 = 0.0125
    #   -> evict D
    rc.serve(Lookup([F], now=50))
    lru.serve(Lookup([F], now=50))
    assert set(rc.resident) == {A, B, E, F}
    # costs: [A,B] 9, C 1, D 1, E 1, [A,B] 9, F 1 = 22; RC hit B (8), LRU hit A (1)
    assert rc.stats()["block_hits"] == lru.stats()["block_hits"] == 1
    assert rc.stats()["csr"] == pytest.approx(8 / 22)
    assert lru.stats()["csr"] == pytest.approx(1 / 22)


@pytest.mark.parametrize("halflife, evicted", [(10.0, B), (0.1, A)])
def test_random_compute_frequency_and_its_decay(halflife, evicted):
    pool = pool_with("random_compute", 3, decay_halflife_s=halflife)  # cost 1 everywhere
    for t, req in enumerate([[A], [A], [A], [B], [C]]):
        pool.serve(Lookup(req, now=t))
    # [D] at 5, now=5. halflife 10: A f = 1 + 2^-0.1 + 2^-0.2 = 2.8036 at t=2, f_eff(5) = 2.2772,
    # idle 3 -> 0.7591; B f_eff = 2^-0.2 = 0.8706, idle 2 -> 0.4353; C 2^-0.1 / 1 = 0.9330:
    # B goes although A is older.
    # halflife 0.1: A 1.00098 * 2^-30 / 3 = 3.1e-10 < B 2^-20 / 2 = 4.8e-7 < C 2^-10 / 1 = 9.8e-4: A goes.
    pool.serve(Lookup([D], now=5))
    assert set(pool.resident) == {A, B, C, D} - {evicted}


def rc_reference(trace, capacity, cost, halflife, eps=1e-3):
    """Independent full-scan RandomCompute in linear space; yields the resident set per request."""
    meta: dict[int, list] = {}  # h -> [depth, f, last]
    clock = 0.0
    for t, req in trace:
        clock = max(clock, t)  # victims are scored at the incoming request's time
        new = [h for h in req if h not in meta]
        need = len(new) - (capacity - len(meta))
        if need > 0:
            def score(h, clock=clock):
                d, f, last = meta[h]
                idle = clock - last
                return cost(d) * f * 2.0 ** (-idle / halflife) / max(idle, eps)

            for h in sorted((h for h in meta if h not in req), key=score)[:need]:
                del meta[h]
        for i, h in enumerate(req):
            if h in meta:
                d, f, last = meta[h]
                meta[h] = [i, 1.0 + f * 2.0 ** (-max(t - last, 0.0) / halflife), t]
            else:
                meta[h] = [i, 1.0, t]
        yield set(meta)


@pytest.mark.parametrize("seed, capacity", [(1, 15), (2, 30), (3, 60)])
def test_random_compute_exhaustive_matches_full_scan_reference(seed, capacity):
    def cost(d):
        return 1.0 + 0.5 * d ** 1.5

    trace = timed_prefix_trace(seed)
    pool = pool_with("random_compute", capacity, cost, sample_size=capacity, decay_halflife_s=7.0)
    for (t, req), expect in zip(trace, rc_reference(trace, capacity, cost, 7.0)):
        pool.serve(Lookup(req, now=t))
        assert set(pool.resident) == expect


# ---- PartialNode, hand-worked ---------------------------------------------------------------
def test_partial_node_evicts_a_chunk_from_the_start_of_the_coldest_node():
    pool = pool_with("partial_node", 8, chunk_blocks=2, decay_halflife_s=1000)  # cost 1 everywhere
    pool.serve(Lookup([A, B, C, D], now=0))  # node N1 = A..D (depths 0..3)
    pool.serve(Lookup([E, F], now=10))  # node N2
    pool.serve(Lookup([G], now=20))  # node N3; 7 used
    # [H, I] at 30 needs 1 more slot; now=30: N1 idle 30 > N2 idle 20 > N3 idle 10 (mean cost 1
    # each, f 1): N1 scores lowest (2^-0.03 / 30 = 0.033 against 0.049 and 0.099).
    # N1 loses its 2 shallowest blocks (chunk 2), more than the 1 asked for.
    pool.serve(Lookup([H, I], now=30))
    assert set(pool.resident) == {C, D, E, F, G, H, I}
    assert pool.stats()["evictions"] == 2
    # A and B are recomputed as ONE hole in front of the reused C, D; the new A, B need 1 more slot:
    # now=40, C and D pinned: N2 (idle 30, against G's 20 and [H, I]'s 10) loses E, F.
    alloc = pool.serve(Lookup([A, B, C, D], now=40))
    assert alloc.hit_idx == [2, 3] and alloc.holes == 1 and alloc.hole_lengths == [2]
    assert set(pool.resident) == {A, B, C, D, G, H, I}


def test_partial_node_run_starts_after_pinned_shallow_blocks():
    pool = pool_with("partial_node", 5, chunk_blocks=8)
    pool.serve(Lookup([A, B, C], now=0))  # N1
    pool.serve(Lookup([X], now=10))
    pool.serve(Lookup([Y], now=20))
    # [A, Z] at 30: A pinned (reused). N1 is the coldest; its run skips pinned A and takes B, C.
    assert pool.serve(Lookup([A, Z], now=30)).hit_idx == [0]
    assert set(pool.resident) == {A, X, Y, Z}


def test_partial_node_pinned_block_ends_the_run():
    pool = pool_with("partial_node", 6, chunk_blocks=8)
    pool.serve(Lookup([A, B, C, D], now=0))  # N1
    pool.serve(Lookup([X], now=10))
    pool.serve(Lookup([Y], now=20))
    # [Q, R, C] at 30 reuses C (pinned) and needs 2 slots; N1's run is A, B and stops at C.
    assert pool.serve(Lookup([Q, R, C], now=30)).hit_idx == [2]
    assert set(pool.resident) == {C, D, X, Y, Q, R}


def test_partial_node_one_node_per_run_of_new_blocks():
    pool = pool_with("partial_node", 10)
    pool.serve(Lookup([A, B, C, D], now=0))
    pool.policy.on_remove(B)  # admin removal, as the pool's own tests do
    pool._forget([B])
    alloc = pool.serve(Lookup([A, B, C, D, E], now=1))
    assert alloc.new_idx == [1, 4]
    node_of = pool.policy._node_of
    assert node_of[B][0] is not node_of[E][0]  # two runs of new blocks -> two nodes
    assert node_of[A][0] is node_of[C][0] is node_of[D][0]  # the first request's node
    assert [node_of[h][1] for h in (A, B, C, D, E)] == [0, 1, 2, 3, 4]  # depths


# ---- both: contract and invariants ----------------------------------------------------------
POLICIES = [
    ("random_compute", {}),
    ("random_compute", {"sample_size": 4}),
    ("partial_node", {}),
    ("partial_node", {"sample_size": 4, "chunk_blocks": 3}),
]


@pytest.mark.parametrize("name, params", POLICIES)
def test_random_trace_invariants_and_event_replay(name, params):
    pool = BlockPool(40, make_policy(name, **params), block_cost=lambda d: 1.0 + d)
    run_timed_invariants(pool, timed_prefix_trace(11, n=1500), random.Random(5), reset_at=700)


@pytest.mark.parametrize("name", ["random_compute", "partial_node"])
def test_victims_distinct_resident_unpinned(name):
    pool = BlockPool(12, make_policy(name, sample_size=3, seed=4))
    for t in range(6):
        pool.serve(Lookup([100 + 2 * t, 101 + 2 * t], now=t))
    running = pool.acquire(Lookup([100, 101, 104], now=7))  # pins 100, 101, 104
    victims = pool.policy.victims(5)
    assert len(victims) >= 5 and len(set(victims)) == len(victims)
    assert set(victims) <= set(pool.resident) and not set(victims) & {100, 101, 104}
    assert running.hit_idx == [0, 1, 2]


@pytest.mark.parametrize("name", ["random_compute", "partial_node"])
def test_same_seed_same_result(name):
    trace = timed_prefix_trace(8, n=800)

    def run(seed):
        pool = BlockPool(30, make_policy(name, sample_size=5, seed=seed), emit_events=False)
        states = []
        for t, req in trace:
            pool.serve(Lookup(req, now=t))
            states.append(frozenset(pool.resident))
        return states

    assert run(3) == run(3)


def test_parameters_are_validated_and_described():
    with pytest.raises(InputError):
        make_policy("random_compute", sample_size=0)
    with pytest.raises(InputError):
        make_policy("partial_node", chunk_blocks=-1)
    with pytest.raises(InputError):
        make_policy("random_compute", decay_halflife_s="x")
    d = make_policy("partial_node", sample_size=64, chunk_blocks=16, seed=2).describe()
    assert d["name"] == "partial_node" and d["sample_size"] == 64 and d["chunk_blocks"] == 16
    assert make_policy("random_compute").describe()["sample_size"] == 128


# ---- seed 002's findings on a synthetic multi-turn workload ---------------------------------
def run_workload(name, trace, capacity, **params):
    pool = BlockPool(capacity, make_policy(name, **params), block_size=512, emit_events=False,
                     metrics=PoolMetrics(block_size=512, block_cost=block_cost_512), block_cost=block_cost_512)
    for t, s, req in trace:
        pool.serve(Lookup(req, session=s, now=t))
    return pool.stats()


@pytest.mark.parametrize("seed, capacity", [(1, 300), (2, 500)])
def test_seed002_random_compute_beats_lru_on_csr(seed, capacity):
    assert block_cost_512(100) > 5 * block_cost_512(0)  # miss cost varies strongly with depth
    trace = session_workload(seed)
    lru = run_workload("lru", trace, capacity)
    rc = run_workload("random_compute", trace, capacity)
    assert rc["csr"] > lru["csr"] + 0.02  # measured: +0.041 / +0.049


@pytest.mark.parametrize("seed, capacity", [(1, 300), (2, 500)])
def test_seed002_partial_node_far_fewer_holes_at_similar_csr(seed, capacity):
    trace = session_workload(seed)
    rc = run_workload("random_compute", trace, capacity)
    pn = run_workload("partial_node", trace, capacity)
    rc_holes, pn_holes = rc["holes"]["mean_per_request"], pn["holes"]["mean_per_request"]
    assert rc_holes > 0.2
    assert pn_holes * 3 <= rc_holes  # measured: 5.4x / 4.6x fewer
    assert abs(rc["csr"] - pn["csr"]) <= 0.04  # measured: 0.029 / 0.020 lower
