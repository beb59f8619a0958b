import random

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.policies.adaptive import AdaptivePolicy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from shared.errors import InputError
from tests.support.policy_checks import run_invariants

CYCLE = [[1], [2], [3], [1], [2], [3]]


def test_decision_on_a_tiny_trace_switches_to_the_shadow_winner():
    policy = AdaptivePolicy(interval_s=6, margin=0)  # WAKMan's plain rule
    pool = BlockPool(2, policy, emit_events=False)
    for t, hashes in enumerate(CYCLE):
        pool.serve(Lookup(hashes, now=t))
    assert policy.current == "lru" and not policy.decisions
    pool.serve(Lookup([4], now=6))  # first access at the interval end: decide on the six before it
    # nothing private: the shadow has the pool's 2 blocks (tests/replica/core/analysis/test_shadow.py
    # works the replay by hand: LRU no hit, S3-FIFO one in six)
    assert list(policy.decisions) == [{
        "at": 6, "interval_s": 6, "shadow_capacity": 2, "accesses": 6,
        "hit_ratio": {"lru": 0.0, "s3fifo": pytest.approx(1 / 6)}, "winner": "s3fifo", "running": "s3fifo",
        "switched": True}]
    assert policy.current == "s3fifo" and policy.inner.name == "s3fifo"
    d = pool.stats()["policy"]
    assert d["switches"] == 1 and d["decision_counts"] == {"s3fifo": 1} and d["decisions"][0]["winner"] == "s3fifo"
    assert d["shadow_blocks"] == 6 and d["shadow_cpu_s"] >= 0  # cost: 6 block accesses replayed per candidate
    assert policy._recorder.blocks == 1  # the access at t=6 opens the next interval


def test_margin_keeps_the_running_policy_when_the_gap_is_small():
    policy = AdaptivePolicy(interval_s=6, margin=0.2)
    pool = BlockPool(2, policy, emit_events=False)
    for t, hashes in enumerate(CYCLE + [[4]]):
        pool.serve(Lookup(hashes, now=t))
    (dec,) = policy.decisions
    assert dec["winner"] == "s3fifo" and dec["running"] == "lru" and not dec["switched"]
    assert policy.current == "lru" and policy.decision_counts == {"lru": 1} and policy.switches == 0


def test_adapt_interval_halves_on_flips_and_doubles_when_stable():
    policy = AdaptivePolicy(interval_s=8, adapt_interval=True)
    policy.decisions.append({"winner": "lru"})
    pool = BlockPool(2, policy, emit_events=False)
    for t, hashes in enumerate(CYCLE + CYCLE[:2] + [[9]]):
        pool.serve(Lookup(hashes, now=t))
    assert policy.decisions[-1]["winner"] == "s3fifo" and policy._interval == 4  # flipped: halved


@pytest.mark.parametrize("target", ["s3fifo", "arc", "lru"])
def test_switch_hands_every_resident_block_over_once_and_respects_pins(target):
    policy = AdaptivePolicy(candidates="lru,s3fifo,arc", interval_s=1e9)
    pool = BlockPool(40, policy, emit_events=False)
    rng = random.Random(3)
    for t in range(60):
        base = rng.randrange(30) * 100
        pool.serve(Lookup([base + i for i in range(rng.randrange(1, 6))], now=t))
    held = pool.acquire(Lookup([7001, 7002, 7003], now=61))
    if target == "lru":
        policy._switch_to("s3fifo", 61)
    policy._switch_to(target, 62)
    assert policy.inner.name == target
    free = pool.evictable
    victims = policy.victims(free)
    assert len(victims) == len(set(victims)) == free
    assert set(victims) == set(pool.resident) - {7001, 7002, 7003}
    for h in victims:
        pool.resident.pop(h)
    pool.release(held, 63)
    assert sorted(policy.victims(3)) == [7001, 7002, 7003]  # released later, then evictable


def test_switch_hands_over_in_age_order():
    policy = AdaptivePolicy(interval_s=1e9)
    pool = BlockPool(10, policy, emit_events=False)
    for t, h in enumerate([1, 2, 3, 4]):
        pool.serve(Lookup([h], now=t))
    pool.serve(Lookup([2], now=5))  # 2 is now the most recent
    policy._switch_to("s3fifo", 6)
    policy._switch_to("lru", 7)
    assert policy.victims(4) == [1, 3, 4, 2]


def trace(rng):
    for _ in range(1500):
        s = rng.randrange(25)
        yield f"s{s}", [s * 1000 + i for i in range(rng.randrange(1, 8))]


@pytest.mark.parametrize("params", [{}, {"estimator": "sampled", "sample_rate": 0.5, "adapt_interval": True},
                                    {"candidates": "s3fifo,arc,lru", "margin": 0.01}])
def test_invariants_with_pinned_requests_and_switches(params):
    policy = AdaptivePolicy(interval_s=15, **params)
    pool = BlockPool(48, policy)

    def check(p):
        order = policy._newest_first()
        assert len(order) == len(set(order)) and set(order) == set(p.resident)
        if policy._tracking:  # a pinned block may have left the order until its release
            assert set(p.resident) - set(p.pin_counts) <= set(policy._recency) <= set(p.resident)

    run_invariants(pool, trace(random.Random(5)), random.Random(6), extra_check=check)
    assert len(policy.decisions) > 20


def scans(rng):
    """Hot sessions under one-shot scans: S3-FIFO keeps the hot blocks, LRU lets scans flush them."""
    for k in range(1500):
        if rng.random() < 0.4:
            s = rng.randrange(6)
            yield f"s{s}", [s * 1000 + i for i in range(4)]
        else:
            yield None, [10**6 + k * 10 + i for i in range(6)]


def test_invariants_switch_at_least_once():
    # 40 requests an interval: a cold shadow of the pool's 40 blocks must fill before the policies part
    policy = AdaptivePolicy(interval_s=40)
    pool = BlockPool(40, policy)
    run_invariants(pool, scans(random.Random(1)), random.Random(2))
    assert policy.switches >= 1 and policy.decision_counts.get("s3fifo", 0) > policy.decision_counts.get("lru", 0)


def test_live_switch_to_adaptive_is_not_recorded_as_traffic():
    pool = BlockPool(10, make_policy("lru"), emit_events=False)
    for h in range(5):
        pool.serve(Lookup([h], now=h))
    policy = make_policy("adaptive", interval_s=100)
    pool.set_policy(policy, 5)
    assert policy._recorder.blocks == 0 and policy._newest_first() == [4, 3, 2, 1, 0]
    assert policy.victims(2) == [0, 1]


@pytest.mark.parametrize("params, field", [
    ({"candidates": "lru,belady"}, "candidates"),
    ({"candidates": "lru,mru"}, "candidates"),
    ({"candidates": "lru,adaptive"}, "candidates"),
    ({"candidates": ""}, "candidates"),
    ({"candidates": ["lru", 3]}, "candidates"),
    ({"candidates": 7}, "candidates"),
    ({"interval_s": 0}, "interval_s"),
    ({"interval_s": "x"}, "interval_s"),
    ({"margin": -0.1}, "margin"),
    ({"adapt_interval": "maybe"}, "adapt_interval"),
    ({"estimator": "mrc"}, "estimator"),
    ({"sample_rate": 0}, "sample_rate"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(InputError) as err:
        make_policy("adaptive", **params)
    assert err.value.field == field


def test_defaults():
    d = make_policy("adaptive").describe()
    assert (d["candidates"], d["interval_s"], d["margin"], d["adapt_interval"], d["estimator"]) == \
        ("lru,s3fifo", 900.0, 0.01, False, "full")


def test_flags_from_the_command_line():
    assert make_policy("adaptive", adapt_interval="true").adapt_interval is True
    assert make_policy("adaptive", adapt_interval=0).adapt_interval is False
    assert make_policy("adaptive", candidates=["ARC", "lru"]).candidates == ["arc", "lru"]
