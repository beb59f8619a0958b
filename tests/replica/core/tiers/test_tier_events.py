"""A replica with memory tiers ships its host and SSD blocks as tier-tagged events, and an index
fed those events answers the lookups the simulator computes from the pools themselves."""

from __future__ import annotations

import random

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.cache.pool import KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.stack import TierSettings
from shared.costmodel import CostModel
from shared.index import EventBatch, MemoryIndex

COST = CostModel.from_names("llama-3-8b", "h200")


def core(mode="exclusive", hbm=2, host=2, ssd=2, tier_events=True):
    return build_core(CoreSettings(capacity_blocks=hbm, tier_events=tier_events,
                                   knobs=EngineKnobs(tiers=TierSettings(
        host_blocks=host, ssd_blocks=ssd, mode=mode, fetch="always"))), COST)


def serve(c, hashes, now=0.0):
    plan = c.tiers.plan(hashes, now)
    alloc = c.pool.serve(Lookup(hashes, now=now))
    c.tiers.complete(plan, alloc.hashes, alloc.hit_idx, alloc.new_idx, now)


def sim_overlap(c, rid, hashes):
    """What the simulator's _route hands cache_aware for this replica."""
    out = {rid: n} if (n := c.pool.prefix_match(hashes)) else {}
    out.update(c.tiers.lower_overlap(rid, hashes, n))
    return out


def test_tier_events_are_tagged_and_a_reset_resends_the_tiers():
    c = core()
    for t, h in enumerate((1, 2, 3)):
        serve(c, [h], now=float(t))  # the third evicts 1 from HBM (LRU): demoted to host
    assert c.drain_events() == [KvEvent("stored", (1,)), KvEvent("stored", (2,)), KvEvent("removed", (1,)),
                                KvEvent("stored", (3,)), KvEvent("stored", (1,), 1)]
    serve(c, [4], now=3.0)  # evicts 2 to host
    serve(c, [5], now=4.0)  # evicts 3; host is full, so 1 spills to SSD
    assert c.drain_events() == [
        KvEvent("removed", (2,)), KvEvent("stored", (4,)), KvEvent("removed", (3,)), KvEvent("stored", (5,)),
        KvEvent("stored", (2,), 1), KvEvent("removed", (1,), 1), KvEvent("stored", (3,), 1),
        KvEvent("stored", (1,), 2)]
    assert c.snapshot_events() == [KvEvent("stored", (4, 5)), KvEvent("stored", (2, 3), 1),
                                   KvEvent("stored", (1,), 2)]
    # 2 is fetched from host (exclusive: it then leaves host); HBM evicts 4 to host, where 2 is
    # still pinned for the fetch, so 3 spills to SSD
    serve(c, [2], now=5.0)
    c.drain_events()
    c.pool.reset()  # /admin/reset: an HBM `cleared` clears every tier in an index, so the tiers follow
    assert c.drain_events() == [KvEvent("cleared", ()), KvEvent("stored", (4,), 1),
                                KvEvent("stored", (1, 3), 2)]


def test_without_tier_events_the_tiers_stay_silent():
    c = core(tier_events=False)
    for t, h in enumerate((1, 2, 3)):
        serve(c, [h], now=float(t))
    assert [e.level for e in c.drain_events()] == [0, 0, 0, 0]
    assert c.snapshot_events() == [KvEvent("stored", (2, 3))]


@pytest.mark.parametrize("mode", ["exclusive", "inclusive"])
def test_an_index_fed_the_events_answers_what_the_simulator_computes(mode):
    """Random multi-turn traffic through two tiered replicas; after every request the index's
    lookup of a random prompt equals the simulator's HBM prefix + lower_overlap per replica."""
    rng = random.Random(5)
    reps = {rid: core(mode, hbm=12, host=10, ssd=14) for rid in ("a", "b")}
    index, seq, tier_hits = MemoryIndex(), dict.fromkeys(reps, 0), 0
    sessions = [[rng.getrandbits(60) for _ in range(12)] for _ in range(8)]
    for t in range(300):
        rid = rng.choice(list(reps))
        s = rng.choice(sessions)
        serve(reps[rid], s[:rng.randint(1, 12)], now=float(t))
        events = reps[rid].drain_events()
        index.apply_sync(EventBatch(rid, "e", seq[rid], events))
        seq[rid] += len(events)
        prompt = rng.choice(sessions)[:rng.randint(1, 12)]
        want = {}
        for r, c in reps.items():
            want.update(sim_overlap(c, r, prompt))
        assert index.lookup_sync(prompt) == want
        tier_hits += any("#" in k for k in want)
    assert tier_hits > 100  # the lower tiers answered most lookups
