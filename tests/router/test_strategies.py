import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from router.strategies import (
    REASONS,
    SPECS,
    NoHealthyReplica,
    ReplicaState,
    RouteRequest,
    RouterMemory,
    RoutingContext,
    RoutingSettings,
    RoutingStep,
    get_strategy,
    is_imbalanced,
    load_bound,
    replica_cost,
    session_moves,
    strategy_spec,
)
from shared.errors import InputError, KvemuError, UnknownNameError
from shared.overrides import apply_overrides

REPO = Path(__file__).resolve().parents[2]
DEFAULT = RoutingSettings()


def replicas(*specs):
    """Each spec is ``(replica_id, in_flight[, queued_tokens[, healthy]])``."""
    def one(rid, in_flight, queued_tokens=0, healthy=True):
        return ReplicaState(rid, in_flight=in_flight, queued_tokens=queued_tokens, healthy=healthy)
    return [one(*spec) for spec in specs]


def route(name, reps, request=None, overlap=None, settings=DEFAULT, rng=None, memory=None):
    ctx = RoutingContext(settings, rng or random.Random(0), memory or RouterMemory())
    return get_strategy(name)(reps, request or RouteRequest(), overlap or {}, ctx)


def place(reps, rid, tokens=0):
    """What the caller does right after a decision: count the request at once."""
    for r in reps:
        if r.replica_id == rid:
            r.in_flight += 1
            r.queued_tokens += tokens
            return


# ---------------------------------------------------------------- round robin, random, least loaded


def test_round_robin_cycles_and_skips_an_unhealthy_replica():
    reps = replicas(("a", 0), ("b", 0, 0, False), ("c", 0))
    memory = RouterMemory()
    picks = [route("round_robin", reps, memory=memory) for _ in range(5)]
    assert [d.replica_id for d in picks] == ["a", "c", "a", "c", "a"]
    assert {d.reason for d in picks} == {"round_robin"}
    reps[1].healthy = True  # b recovers: it rejoins in list order
    assert [route("round_robin", reps, memory=memory).replica_id for _ in range(3)] == ["b", "c", "a"]


def test_random_covers_healthy_replicas_only():
    reps = replicas(("a", 0), ("b", 0, 0, False), ("c", 0))
    rng = random.Random(7)
    seen = Counter(route("random", reps, rng=rng).replica_id for _ in range(300))
    assert set(seen) == {"a", "c"}
    assert min(seen.values()) > 100


def test_least_loaded_picks_the_minimum_then_fewest_queued_tokens():
    assert route("least_loaded", replicas(("a", 3), ("b", 1), ("c", 2))).replica_id == "b"
    # equal in-flight counts: the shorter prefill queue wins
    d = route("least_loaded", replicas(("a", 1, 500), ("b", 1, 100), ("c", 2, 0)))
    assert (d.replica_id, d.reason) == ("b", "least_loaded")
    # the least loaded replica is down: the next one is taken
    assert route("least_loaded", replicas(("a", 3), ("b", 0, 0, False), ("c", 2))).replica_id == "c"


def test_least_loaded_breaks_ties_randomly_never_by_list_order():
    reps = replicas(("a", 1), ("b", 1), ("c", 2))
    seen = Counter(route("least_loaded", reps, rng=random.Random(seed)).replica_id for seed in range(400))
    assert set(seen) == {"a", "b"}  # c is never tied, never chosen
    assert 140 < seen["a"] < 260  # about half each


# ---------------------------------------------------------------- cache_aware


def test_cache_aware_equal_loads_takes_the_longest_prefix():
    # num_blocks 10, every replica 1 in flight, nothing queued:
    #   a: 1.0 * (10 - 2) + 1 = 9     b: 1.0 * (10 - 8) + 1 = 3     c: 1.0 * (10 - 0) + 1 = 11
    reps = replicas(("a", 1), ("b", 1), ("c", 1))
    d = route("cache_aware", reps, RouteRequest("s", 10, 170), {"a": 2, "b": 8})
    assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("b", "cache_hit", 8)
    assert [replica_cost(r, {"a": 2, "b": 8}.get(r.replica_id, 0), 10, DEFAULT) for r in reps] == [9, 3, 11]


def test_cache_aware_prefers_a_less_loaded_replica_when_the_overlap_advantage_is_smaller():
    # num_blocks 20, block_size 16.
    #   a holds 12 blocks but has 2 in flight and 160 queued tokens (= 10 blocks):
    #       cost = 1.0 * (20 - 12) + 1.0 * 2 + 160 / 16 = 8 + 12 = 20
    #   b holds 6 blocks, 1 in flight, nothing queued:
    #       cost = 1.0 * (20 - 6) + 1.0 * 1 + 0 = 14 + 1 = 15
    # a's overlap advantage (6 blocks) is smaller than its extra load (11 blocks): b wins.
    request = RouteRequest("s", 20, 330)
    overlap = {"a": 12, "b": 6}
    d = route("cache_aware", replicas(("a", 2, 160), ("b", 1, 0)), request, overlap)
    assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("b", "load_over_cache", 6)
    # Without a's queue: a = 8 + 2 = 10 < b = 15, the cache wins.
    d = route("cache_aware", replicas(("a", 2, 0), ("b", 1, 0)), request, overlap)
    assert (d.replica_id, d.reason) == ("a", "cache_hit")
    # Weighting prefill 3x: a = 3 * 8 + 12 = 36 < b = 3 * 14 + 1 = 43, the cache wins again.
    heavy = RoutingSettings(overlap_weight=3.0)
    d = route("cache_aware", replicas(("a", 2, 160), ("b", 1, 0)), request, overlap, settings=heavy)
    assert d.replica_id == "a"
    # Weight 0 ignores the cache: a = 12 > b = 1.
    blind = RoutingSettings(overlap_weight=0.0)
    assert route("cache_aware", replicas(("a", 2, 0), ("b", 1, 0)), request, overlap, settings=blind).replica_id == "b"


@pytest.mark.parametrize(
    "hot, cold, fires",
    [
        (10, 6, False),  # spread 4 is not > abs 4
        (11, 6, True),  # spread 5 > 4 and 11 > 1.5 * 6 = 9
        (15, 10, False),  # spread 5 > 4 but 15 is not > 1.5 * 10 = 15
        (16, 10, True),  # spread 6 > 4 and 16 > 15
        (4, 0, False),  # spread 4 is not > 4
        (5, 0, True),  # spread 5 > 4 and 5 > 1.5 * 0
    ],
)
def test_imbalance_guard_fires_exactly_past_both_thresholds(hot, cold, fires):
    settings = RoutingSettings(balance_abs_threshold=4, balance_rel_threshold=1.5)
    assert is_imbalanced(hot, cold, settings) is fires
    # "hot" holds the whole 100-block prompt: its hit saves 100 blocks of prefill over "cold".
    request, overlap = RouteRequest("s", 100, 1600), {"hot": 100}
    # Both queue: hot 1760 tokens (110 blocks, more than its hit saves), cold 1920 (120). On cost hot wins,
    # hot = 0 + hot_in_flight + 110 < cold = 100 + cold_in_flight + 120; past both thresholds the guard sends
    # the request to the least-loaded replica, as SGLang's does.
    reps = replicas(("hot", hot, 1760), ("cold", cold, 1920))
    d = route("cache_aware", reps, request, overlap, settings=settings)
    if fires:
        assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("cold", "imbalance_guard", 0)
    else:
        assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("hot", "cache_hit", 100)


@pytest.mark.parametrize("hot_queued, cold_queued", [(0, 0), (0, 1920), (1600, 1920), (1584, 160)])
def test_imbalance_guard_keeps_a_hit_whose_replica_queues_no_more_than_the_hit_saves(hot_queued, cold_queued):
    # In-flight 16 against 10 crosses both thresholds (spread 6 > 4, 16 > 15), but hot's queue is at most
    # 100 blocks (1600 tokens), what its 100-block hit saves over cold: decoders barely slow a prefill, so the
    # hit stays (each case also cheapest on cost: hot = 0 + 16 + hot_queued / 16 < cold = 100 + 10 + cold_queued / 16).
    settings = RoutingSettings(balance_abs_threshold=4, balance_rel_threshold=1.5)
    reps = replicas(("hot", 16, hot_queued), ("cold", 10, cold_queued))
    d = route("cache_aware", reps, RouteRequest("s", 100, 1600), {"hot": 100}, settings=settings)
    assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("hot", "cache_hit", 100)


def test_imbalance_guard_weighs_the_queue_against_what_the_hit_saves_over_the_least_loaded_replica():
    # cold holds 60 of the 100 blocks: hot's hit saves only 40 blocks over it. hot queues 720 tokens (45 blocks
    # > 40), cold 960 (60): cost hot = 0 + 16 + 45 = 61 < cold = 40 + 10 + 60 = 110, but past both thresholds
    # the guard moves it; with 640 queued (40 blocks, not more than the 40 saved) the hit stays.
    settings = RoutingSettings(balance_abs_threshold=4, balance_rel_threshold=1.5)
    request, overlap = RouteRequest("s", 100, 1600), {"hot": 100, "cold": 60}
    d = route("cache_aware", replicas(("hot", 16, 720), ("cold", 10, 960)), request, overlap, settings=settings)
    assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("cold", "imbalance_guard", 60)
    d = route("cache_aware", replicas(("hot", 16, 640), ("cold", 10, 960)), request, overlap, settings=settings)
    assert (d.replica_id, d.reason, d.predicted_cached_blocks) == ("hot", "cache_hit", 100)


def test_in_flight_requests_do_not_outweigh_a_longer_hit_when_nothing_queues():
    # The tour's second turn: 32 blocks, 24 of them (the first turn's prompt and answer) on "home". home has 20
    # more requests in flight than "idle", all decoding (nothing queued): home = 8 + 25 = 33 < idle = 32 + 5 = 37.
    reps = replicas(("home", 25), ("idle", 5))
    d = route("cache_aware", reps, RouteRequest("s", 32, 512), {"home": 24})
    assert (d.replica_id, d.reason) == ("home", "cache_hit")
    # The same spread with one 512-token prefill queued on home (32 blocks): home = 8 + 25 + 32 = 65 > 37.
    d = route("cache_aware", replicas(("home", 25, 512), ("idle", 5)), RouteRequest("s", 32, 512), {"home": 24})
    assert (d.replica_id, d.reason) == ("idle", "load_over_cache")


def test_imbalance_guard_ignores_unhealthy_replicas():
    settings = RoutingSettings(balance_abs_threshold=4, balance_rel_threshold=1.5)
    reps = replicas(("hot", 20), ("idle_but_down", 0, 0, False), ("warm", 18))
    d = route("cache_aware", reps, RouteRequest("s", 100, 1600), {"hot": 100}, settings=settings)
    assert (d.replica_id, d.reason) == ("hot", "cache_hit")


def test_cache_aware_ties_break_randomly_and_misses_say_so():
    reps = replicas(("a", 2), ("b", 2), ("c", 3))
    seen = Counter()
    for seed in range(300):
        d = route("cache_aware", reps, RouteRequest("s", 10, 160), {}, rng=random.Random(seed))
        assert d.reason == "cache_miss_balance" and d.predicted_cached_blocks == 0
        seen[d.replica_id] += 1
    assert set(seen) == {"a", "b"}
    assert min(seen.values()) > 100


def test_overlap_is_clamped_and_unknown_ids_ignored():
    d = route("cache_aware", replicas(("a", 0)), RouteRequest("s", 5, 90), {"a": 9, "ghost": 50})
    assert d.predicted_cached_blocks == 5
    d = route("least_loaded", replicas(("a", 0)), RouteRequest("s", 5, 90), {"a": -3})
    assert d.predicted_cached_blocks == 0


# ---------------------------------------------------------------- session


def four():
    return replicas(("r0", 0), ("r1", 0), ("r2", 0), ("r3", 0))


def test_same_session_same_replica():
    reps, memory = four(), RouterMemory()
    decisions = [route("session", reps, RouteRequest("alice", 4, 64), memory=memory) for _ in range(10)]
    assert len({d.replica_id for d in decisions}) == 1
    assert decisions[0].reason == "session_new"
    assert {d.reason for d in decisions[1:]} == {"session_sticky"}


def test_sessions_spread_over_replicas():
    huge = RoutingSettings(bounded_load_factor=1e9)  # pure consistent hashing, no load feedback
    reps, memory = four(), RouterMemory()
    seen = Counter(route("session", reps, RouteRequest(f"user-{i}"), settings=huge, memory=memory).replica_id
                   for i in range(400))
    assert set(seen) == {"r0", "r1", "r2", "r3"}
    assert min(seen.values()) >= 50  # 100 expected each


def test_ring_ignores_replica_order():
    reps = four()
    forward = [route("session", reps, RouteRequest(f"u{i}")).replica_id for i in range(50)]
    backward = [route("session", reps[::-1], RouteRequest(f"u{i}")).replica_id for i in range(50)]
    assert forward == backward


SCRIPT = """
import json, random
from router.strategies import ReplicaState, RouteRequest, RouterMemory, RoutingContext, RoutingSettings, get_strategy
reps = [ReplicaState(f"r{i}") for i in range(4)]
ctx, strat = RoutingContext(RoutingSettings(bounded_load_factor=1e9), random.Random(), RouterMemory()), get_strategy("session")
print(json.dumps([strat(reps, RouteRequest(f"user-{i}"), {}, ctx).replica_id
                  for i in range(60)]))
"""


def test_session_placement_is_identical_across_processes():
    huge = RoutingSettings(bounded_load_factor=1e9)
    reps, memory = four(), RouterMemory()
    here = [route("session", reps, RouteRequest(f"user-{i}"), settings=huge, memory=memory).replica_id
            for i in range(60)]
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True,
                             text=True, check=True, timeout=60)
        assert json.loads(out.stdout) == here


def test_bounded_loads_hold_as_many_sessions_arrive():
    settings = RoutingSettings(bounded_load_factor=1.25)
    reps, memory, rng = four(), RouterMemory(), random.Random(3)
    reasons = Counter()
    for _ in range(500):
        # a few hot sessions dominate, as in production traces
        sid = f"hot-{rng.randrange(3)}" if rng.random() < 0.7 else f"cold-{rng.randrange(1000)}"
        d = route("session", reps, RouteRequest(sid, 8, 128), settings=settings, memory=memory)
        reasons[d.reason] += 1
        place(reps, d.replica_id)
        total = sum(r.in_flight for r in reps)
        # the bound, or the floor (bounded_load_min) under which affinity always wins
        assert max(r.in_flight for r in reps) <= max(math.ceil(1.25 * total / len(reps)),
                                                     settings.bounded_load_min)
    assert reasons["session_overflow"] > 0 and reasons["session_sticky"] > 0
    assert set(reasons) <= REASONS


def test_low_load_keeps_affinity_under_the_floor():
    settings = RoutingSettings(bounded_load_factor=1.25, bounded_load_min=2)
    reps, memory = four(), RouterMemory()
    first = route("session", reps, RouteRequest("s", 8, 128), settings=settings, memory=memory).replica_id
    place(reps, first)  # one request in flight: ceil(1.25 * 2 / 4) = 1 would call this replica full
    again = route("session", reps, RouteRequest("s", 8, 128), settings=settings, memory=memory)
    assert again.replica_id == first and again.reason == "session_sticky"


def test_load_bound_formula():
    # 7 in flight over 2 replicas, placing the 8th: ceil(1.25 * 8 / 2) = 5
    assert load_bound(7, 2, 1.25) == 5
    # 1.1 * 50 is 55.00000000000001 in floats; the bound must still be 55, not 56
    assert load_bound(49, 1, 1.1) == 55
    assert load_bound(0, 4, 1.25) == 1  # empty cluster: anyone may take the first request
    assert load_bound(8, 3, 1.0) == 3


def test_huge_factor_keeps_a_hot_session_sticky_and_makes_a_hotspot():
    reps, memory = four(), RouterMemory()
    huge = RoutingSettings(bounded_load_factor=1e9)
    for _ in range(100):
        d = route("session", reps, RouteRequest("hot"), settings=huge, memory=memory)
        place(reps, d.replica_id)
    assert sorted(r.in_flight for r in reps) == [0, 0, 0, 100]
    # the same burst under c = 1.25 spills over to every replica
    reps, memory = four(), RouterMemory()
    for _ in range(100):
        place(reps, route("session", reps, RouteRequest("hot"), memory=memory).replica_id)
    assert max(r.in_flight for r in reps) <= math.ceil(1.25 * 100 / 4)
    assert min(r.in_flight for r in reps) > 0


def test_session_moves_when_its_replica_fails_and_stays_moved():
    reps, memory = four(), RouterMemory()
    home = route("session", reps, RouteRequest("bob"), memory=memory).replica_id
    next(r for r in reps if r.replica_id == home).healthy = False
    d = route("session", reps, RouteRequest("bob"), memory=memory)
    assert d.replica_id != home and d.reason == "session_failover"
    # the new replica now holds bob's history: stay there after the old one recovers
    next(r for r in reps if r.replica_id == home).healthy = True
    d2 = route("session", reps, RouteRequest("bob"), memory=memory)
    assert (d2.replica_id, d2.reason) == (d.replica_id, "session_sticky")
    # the assigned replica leaves the cluster entirely
    survivors = [r for r in reps if r.replica_id != d.replica_id]
    d3 = route("session", survivors, RouteRequest("bob"), memory=memory)
    assert d3.replica_id != d.replica_id and d3.reason == "session_failover"


def test_session_map_stays_bounded_lru():
    settings = RoutingSettings(max_sessions=10)
    reps, memory = four(), RouterMemory()
    for i in range(100):
        route("session", reps, RouteRequest(f"s{i}"), settings=settings, memory=memory)
        route("session", reps, RouteRequest("s0"), settings=settings, memory=memory)  # kept warm
        assert len(memory.sessions) <= 10
    assert "s0" in memory.sessions and "s99" in memory.sessions and "s50" not in memory.sessions


def test_session_without_id_goes_least_loaded():
    reps = replicas(("a", 3), ("b", 1), ("c", 2))
    for sid in (None, ""):
        d = route("session", reps, RouteRequest(sid, 3, 48))
        assert (d.replica_id, d.reason) == ("b", "no_session")


# ---------------------------------------------------------------- registry, errors, settings


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        get_strategy("fastest")
    message = str(err.value)
    assert "fastest" in message
    for name in ("round_robin", "random", "least_loaded", "session", "cache_aware"):
        assert name in message
    assert set(SPECS) == {"round_robin", "random", "least_loaded", "session", "cache_aware"}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_healthy_replica(name):
    down = replicas(("a", 0, 0, False), ("b", 0, 0, False))
    for reps in (down, []):
        with pytest.raises(NoHealthyReplica) as err:
            route(name, reps, RouteRequest("s", 2, 32))
        assert isinstance(err.value, KvemuError)
        assert err.value.reason in REASONS


@pytest.mark.parametrize("name", sorted(SPECS))
def test_strategies_pick_healthy_replicas_and_never_mutate_their_inputs(name):
    rng = random.Random(11)
    memory = RouterMemory()
    for _ in range(300):
        reps = [ReplicaState(f"r{i}", rng.randrange(6), rng.randrange(3) * 64, rng.random(), rng.random() < 0.8)
                for i in range(5)]
        reps[rng.randrange(5)].healthy = True
        before = [(r.in_flight, r.queued_tokens, r.kv_usage, r.healthy) for r in reps]
        nb = rng.randrange(0, 30)
        overlap = {f"r{i}": rng.randrange(0, 40) for i in range(5) if rng.random() < 0.5}
        request = RouteRequest(rng.choice([None, "x", "y", "z"]), nb, nb * 16 + 5)
        d = get_strategy(name)(reps, request, overlap, RoutingContext(DEFAULT, rng, memory))
        chosen = next(r for r in reps if r.replica_id == d.replica_id)
        assert chosen.healthy
        assert d.reason in REASONS
        assert d.predicted_cached_blocks == min(max(overlap.get(d.replica_id, 0), 0), nb)
        assert [(r.in_flight, r.queued_tokens, r.kv_usage, r.healthy) for r in reps] == before


@pytest.mark.parametrize(
    "field, value",
    [
        ("block_size", 0),
        ("block_size", 16.0),
        ("overlap_weight", -0.1),
        ("overlap_weight", float("nan")),
        ("in_flight_weight", -1),
        ("balance_abs_threshold", -1),
        ("balance_abs_threshold", True),
        ("balance_rel_threshold", 0.9),
        ("bounded_load_factor", 0.99),
        ("bounded_load_factor", float("inf")),
        ("bounded_load_factor", "1.25"),
        ("virtual_nodes", 0),
        ("virtual_nodes", 100_000),
        ("max_sessions", 0),
    ],
)
def test_settings_validation_names_the_field(field, value):
    with pytest.raises(InputError) as err:
        RoutingSettings(**{field: value})
    assert err.value.field == field


def test_settings_accept_cli_overrides():
    s = apply_overrides(RoutingSettings(), {"bounded_load_factor": "2", "balance_abs_threshold": "8"})
    assert (s.bounded_load_factor, s.balance_abs_threshold) == (2.0, 8)
    with pytest.raises(InputError) as err:
        apply_overrides(RoutingSettings(), {"balance_rel_threshold": "0.5"})
    assert err.value.field == "balance_rel_threshold"


@pytest.mark.parametrize("host_cost, ssd_cost, winner", [(0.1, 0.5, "b"), (1.0, 1.0, "a"), (0.1, 0.0, "c")])
def test_cache_aware_prices_a_host_or_ssd_hit_by_its_fetch_cost(host_cost, ssd_cost, winner):
    # 10 blocks. a: 4 in HBM -> 6 to compute. b: 2 in HBM + 6 in host -> 8 - 6 * (1 - host_cost).
    # c: 1 in HBM + 9 on SSD -> 9 - 9 * (1 - ssd_cost).
    reps = replicas(("a", 0), ("b", 0), ("c", 0))
    overlap = {"a": 4, "b": 2, "b#1": 6, "c": 1, "c#2": 9}
    settings = RoutingSettings(level_hit_costs=(host_cost, ssd_cost))  # levels 1 and 2, by index
    # costs, in blocks: (0.1, 0.5): a 6, b 2.6, c 4.5; (1.0, 1.0): a 6, b 8, c 9; (0.1, 0.0): c 0
    d = route("cache_aware", reps, RouteRequest(num_blocks=10), overlap, settings)
    expected = {"a": 6.0, "b": 8 - 6 * (1 - host_cost), "c": 9 - 9 * (1 - ssd_cost)}
    assert d.replica_id == min(expected, key=expected.get) == winner
    assert d.predicted_cached_blocks == overlap[winner]  # HBM blocks only: the others are fetched


def test_a_level_beyond_the_hit_cost_list_costs_as_a_miss():
    # 10 blocks. a: 4 in HBM -> 6. b: 9 in level 3 -> 10 - 9 * (1 - cost): listed at 0.1, 1.9 (b wins);
    # beyond a list of two, a miss (10: a wins)
    reps = replicas(("a", 0), ("b", 0))
    overlap = {"a": 4, "b#3": 9}
    listed = RoutingSettings(level_hit_costs=(0.1, 0.5, 0.1))
    assert route("cache_aware", reps, RouteRequest(num_blocks=10), overlap, listed).replica_id == "b"
    assert route("cache_aware", reps, RouteRequest(num_blocks=10), overlap,
                 RoutingSettings(level_hit_costs=(0.1, 0.5))).replica_id == "a"


def test_in_flight_weight_counts_blocks_of_load_block_size_tokens_where_set():
    # radix pages of 1 count vLLM's blocks of 16: one in-flight request weighs 16 pages, as it weighs one
    # block of 16; unset, the hashing unit's blocks
    assert RoutingSettings(block_size=1, in_flight_weight=2.0, load_block_size=16).in_flight_cost == 32.0
    assert RoutingSettings(block_size=16, in_flight_weight=2.0, load_block_size=16).in_flight_cost == 2.0
    assert RoutingSettings(block_size=512, in_flight_weight=2.0).in_flight_cost == 2.0
    # a: 3 in flight, prompt of 40 pages cached on neither -> 40 + 3 * 16 = 88; b: 5 pages queued, idle -> 45
    reps = [ReplicaState("a", in_flight=3), ReplicaState("b", queued_tokens=5)]
    pages = RoutingSettings(block_size=1, load_block_size=16, balance_abs_threshold=100)
    assert route("cache_aware", reps, RouteRequest(num_blocks=40), {"a": 0}, pages).replica_id == "b"
    # a holds 38 of the 40: 2 + 48 = 50 against b's 45: still b; without the 16, a's 2 + 3 = 5 wins
    assert route("cache_aware", reps, RouteRequest(num_blocks=40), {"a": 38}, pages).replica_id == "b"
    unscaled = RoutingSettings(block_size=1, balance_abs_threshold=100)
    assert route("cache_aware", reps, RouteRequest(num_blocks=40), {"a": 38}, unscaled).replica_id == "a"


# ---------------------------------------------------------------- one routing step's load counts


def test_a_step_counts_a_requests_prefill_as_queued_until_its_first_token():
    # 40-block prompt of 640 tokens; "b" holds 30 blocks: its prefill there is 640 - 30 * 16 = 160 tokens.
    step = RoutingStep(strategy_spec("cache_aware"), RoutingSettings())
    a, b = ReplicaState("a"), ReplicaState("b")
    first, second = RouteRequest("s", 40, 640), RouteRequest("t", 40, 650)
    decision, pos = step.route([a, b], first, {"b": 30})
    assert (decision.replica_id, pos, b.in_flight, b.queued_tokens) == ("b", 1, 1, 160)
    # a second request, nothing cached anywhere: a (cost 40) beats b (40 + 1 + 160 / 16 = 51), all 650 queued
    step.route([a, b], second, {})
    assert (a.in_flight, a.queued_tokens) == (1, 650)
    step.prefilled(b, first)  # b's first token: decoding, nothing queued, still in flight
    step.prefilled(b, first)  # (once only)
    assert (b.in_flight, b.queued_tokens) == (1, 0)
    step.done(b, first)
    step.done(a, second)  # answered without a head first (a replica that sends none): all of it goes then
    assert (a.in_flight, a.queued_tokens, b.in_flight, b.queued_tokens) == (0, 0, 0, 0)
    # a fully cached prompt queues nothing; a strategy without the index (its caller looks nothing up) queues
    # the whole prompt
    step.route([a, b], RouteRequest("u", 40, 640), {"a": 40, "b": 40})
    assert a.queued_tokens + b.queued_tokens == 0
    blind = RoutingStep(strategy_spec("least_loaded"), RoutingSettings())
    blind.route([a], first, {})
    assert a.queued_tokens == 640


def test_a_step_counts_the_turns_that_leave_their_sessions_replica_by_reason():
    step = RoutingStep(strategy_spec("cache_aware"), RoutingSettings())
    a, b = ReplicaState("a"), ReplicaState("b")
    turn = RouteRequest("s", 10, 160)
    step.route([a, b], turn, {"a": 10})  # first turn: nothing to leave
    assert (step.session_turns, step.last_moved) == (0, "")
    step.route([a, b], turn, {"a": 10})  # stays on a
    assert (step.session_turns, step.last_moved) == (1, "")
    a.queued_tokens += 1600  # a's queue (100 blocks) outweighs its 10-block hit: b, and the turn left a
    d, _ = step.route([a, b], turn, {"a": 10})
    assert (d.replica_id, d.reason, step.last_moved) == ("b", "load_over_cache", "load_over_cache")
    step.route([a, b], RouteRequest(None, 10, 160), {})  # no session: not a turn
    assert session_moves(step) == {"turns": 2, "left": 1, "by_reason": {"load_over_cache": 1}}
