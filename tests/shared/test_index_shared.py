"""The prefix index keeps a shared store's blocks (a KV store several replicas read, the last level of each
one's hierarchy): one set per store fed by its own feed, answered for each replica it serves as the run
after that replica's own prefix under ``<id>#<level>``; hand-worked lookups, scope groups, the epoch / gap /
cleared rules, the bound, a store declared late, and random residencies against the simulator's
``TierStack.lower_overlap``, on both backends."""

from __future__ import annotations

import random

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.tiers.shared import SharedSettings, SharedStore
from replica.core.tiers.stack import TierSettings, TierStack
from shared.errors import InputError
from shared.index import IndexEvent, StoreScope
from tests.support.index_cases import H1, H2, H3, H4, H5, H6, batch, ev, run

SHARED = 3  # the shared level's index after host DRAM (1) and SSD (2)


def lev(kind: str, level: int, *hashes: int) -> IndexEvent:
    return IndexEvent(kind, tuple(hashes), level)


def test_a_store_answers_the_run_after_each_replicas_own_prefix(make):
    async def body(idx):
        await idx.add_store(StoreScope("store", SHARED))
        # A: H1 in HBM, H2 in host memory; B: H6 in HBM only; the store: H1..H4
        await idx.apply(batch("A", 0, ev("stored", H1), lev("stored", 1, H2)))
        await idx.apply(batch("B", 0, ev("stored", H6)))
        await idx.apply(batch("store", 0, ev("stored", H1, H2, H3, H4)))
        # A: HBM 1, host 1 (H2, the upper level first), the store 1 (H3), then H5 nobody holds
        # B: nothing of the prompt in HBM: the store's run from the first block
        assert await idx.lookup([H1, H2, H3, H5, H4]) == {"A": 1, "A#1": 1, "A#3": 1, "B#3": 3}
        assert await idx.lookup([H3, H4]) == {"A#3": 2, "B#3": 2}
        # the store never answers as a replica; a prompt past everyone's prefix asks nothing of it
        assert await idx.lookup([H6, H5]) == {"B": 1}
        assert await idx.lookup([H5, H1]) == {}
        reps = await idx.replicas()
        assert (reps["store"].blocks, reps["store"].synced) == (4, True)
        assert (await idx.stats())["entries"] == 7
        # removed and cleared: the store's set only
        await idx.apply(batch("store", 1, ev("removed", H2, H5)))
        assert await idx.lookup([H1, H2, H3]) == {"A": 1, "A#1": 1, "A#3": 1, "B#3": 1}
        await idx.apply(batch("store", 2, ev("cleared"), ev("stored", H3)))
        assert await idx.lookup([H1, H2, H3]) == {"A": 1, "A#1": 1, "A#3": 1}
        assert await idx.lookup([H3]) == {"A#3": 1, "B#3": 1}
        assert (await idx.stats())["entries"] == 4

    run(make, body)


def test_scope_groups_serve_their_own_replicas(make):
    async def body(idx):
        await idx.add_store(StoreScope("store-0", SHARED, ("A", "C")))  # C has sent nothing yet
        await idx.add_store(StoreScope("store-1", SHARED, ("B",)))
        await idx.apply(batch("A", 0, ev("stored", H1)))
        await idx.apply(batch("B", 0, ev("stored", H1)))
        await idx.apply(batch("store-0", 0, ev("stored", H2, H3)))
        await idx.apply(batch("store-1", 0, ev("stored", H1, H2)))
        assert await idx.lookup([H1, H2, H3]) == {"A": 1, "B": 1, "A#3": 2, "B#3": 1}
        assert await idx.lookup([H2, H3]) == {"A#3": 2, "C#3": 2, "B#3": 1}
        # a store's level is its own: a deeper hierarchy puts it further down
        await idx.add_store(StoreScope("store-2", 5, ("D",)))
        await idx.apply(batch("store-2", 0, ev("stored", H4)))
        assert await idx.lookup([H4]) == {"D#5": 1}

    run(make, body)


def test_epoch_gap_and_clear_rules_hold_for_a_store(make):
    async def body(idx):
        await idx.add_store(StoreScope("store", SHARED))
        await idx.apply(batch("A", 0, ev("stored", H6)))
        await idx.apply(batch("store", 0, ev("stored", H1, H2)))
        # events tagged with a level are still the store's: its one set
        await idx.apply(batch("store", 1, lev("stored", 2, H3)))
        assert await idx.lookup([H1, H2, H3]) == {"A#3": 3}
        r = await idx.apply(batch("store", 5, ev("stored", H4)))  # batches 2-4 lost: a gap clears it
        assert (r.reset, r.synced) == ("gap", False)
        assert await idx.lookup([H1, H2, H3]) == {} and await idx.lookup([H4]) == {"A#3": 1}
        r = await idx.apply(batch("store", 6, ev("cleared"), ev("stored", H5)))  # the resync
        assert r.synced and await idx.lookup([H4]) == {} and await idx.lookup([H5]) == {"A#3": 1}
        r = await idx.apply(batch("store", 0, ev("stored", H1), epoch="e2"))  # the store restarted
        assert (r.reset, r.synced) == ("epoch", True)
        assert await idx.lookup([H5]) == {} and await idx.lookup([H1]) == {"A#3": 1}
        assert await idx.apply(batch("store", 0, ev("stored", H2), epoch="e2")) is not None  # a duplicate
        assert await idx.lookup([H1, H2]) == {"A#3": 1}
        assert (await idx.stats())["entries"] == 2
        assert await idx.clear_replica("store") == 1
        assert await idx.lookup([H1]) == {} and (await idx.stats())["entries"] == 1

    run(make, body)


def test_store_entries_count_against_the_bound(make):
    async def body(idx):
        await idx.add_store(StoreScope("store", SHARED))
        await idx.apply(batch("A", 0, ev("stored", H1)))
        r = await idx.apply(batch("store", 0, ev("stored", H2, H3, H4)))
        assert (r.dropped_entries, r.synced) == (1, False)
        assert await idx.lookup([H1, H2, H3, H4]) == {"A": 1, "A#3": 2}
        assert (await idx.stats())["entries"] == 3
        r = await idx.apply(batch("store", 1, ev("removed", H2), ev("stored", H4)))
        assert (r.dropped_entries, await idx.lookup([H1, H2])) == (0, {"A": 1})
        assert await idx.lookup([H3, H4]) == {"A#3": 2}
        # a replica finds the room the store took: it is refused, not the store's entries evicted
        r = await idx.apply(batch("A", 1, ev("stored", H5)))
        assert r.dropped_entries == 1 and (await idx.stats())["entries"] == 3

    run(make, body, max_entries=3)


def test_a_feed_declared_a_store_late_drops_what_it_had_as_a_replica(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H6)))
        await idx.apply(batch("store", 0, ev("stored", H1, H2)))  # followed before it was known as a store
        assert await idx.lookup([H1]) == {"store": 1}
        await idx.add_store(StoreScope("store", SHARED))
        await idx.add_store(StoreScope("store", SHARED))  # idempotent
        assert await idx.lookup([H1]) == {} and not (await idx.replicas())["store"].synced
        await idx.apply(batch("store", 1, ev("cleared"), ev("stored", H1)))
        assert await idx.lookup([H1, H2]) == {"A#3": 1} and (await idx.replicas())["store"].synced
        assert (await idx.stats())["entries"] == 2

    run(make, body)


@pytest.mark.parametrize("scope, field", [
    (dict(store_id="", level=3), "store_id"),
    (dict(store_id="p", level=0), "level"),
    (dict(store_id="p", level=16), "level"),
    (dict(store_id="p", level=3, replicas=["A"]), "replicas"),
    (dict(store_id="p", level=3, replicas=("A,B",)), "replicas"),
    (dict(store_id="p", level=3, replicas=("p",)), "replicas"),
])
def test_a_bad_store_scope_names_the_field(scope, field):
    with pytest.raises(InputError) as e:
        StoreScope(**scope)
    assert e.value.field == field


def test_random_residency_answers_as_the_simulators_tier_stack(make):
    """Two replicas with host and SSD levels and one store: whatever each level holds, the index fed their
    events answers what ``TierStack.lower_overlap`` answers from the replica's HBM prefix (virtual time)."""
    settings = TierSettings(host_blocks=64, ssd_blocks=64, shared=SharedSettings(blocks=64))
    assert len(settings.levels()) == SHARED

    async def body(idx):
        rng = random.Random(5)
        universe = [rng.getrandbits(64) for _ in range(12)]
        store = SharedStore(settings.shared, emit_events=False)
        stacks = {rid: TierStack(settings, BlockPool(64, make_policy("lru")), 1, lambda d: 1.0, shared=store)
                  for rid in "AB"}
        await idx.add_store(StoreScope("store", SHARED))
        for rid in "AB":
            await idx.apply(batch(rid, 0, ev("stored", rng.getrandbits(64))))  # known to the index
        for trial in range(40):
            hbm = {rid: rng.sample(universe, rng.randint(0, 4)) for rid in "AB"}
            own = {rid: [rng.sample(universe, rng.randint(0, 5)) for _ in (1, 2)] for rid in "AB"}
            shared = rng.sample(universe, rng.randint(0, 8))
            for rid, stack in stacks.items():
                for lv, held in zip(stack.levels[:2], own[rid]):
                    pool = lv.pool
                    pool.remove(list(pool.resident))
                    pool.admit(held)
            store.chunks.clear()
            store.held.clear()
            store.admit(shared)
            for rid in "AB":
                await idx.apply(batch(rid, 1 + 4 * trial, ev("cleared"), ev("stored", *hbm[rid]),
                                      *(lev("stored", k, *held) for k, held in enumerate(own[rid], 1) if held)))
            await idx.apply(batch("store", 2 * trial, ev("cleared"), *([ev("stored", *shared)] if shared else [])))
            for _ in range(5):
                prompt = rng.sample(universe, rng.randint(1, 8))
                got = await idx.lookup(prompt)
                want: dict[str, int] = {}
                for rid, stack in stacks.items():
                    start = 0
                    while start < len(prompt) and prompt[start] in hbm[rid]:
                        start += 1
                    if start:
                        want[rid] = start
                    want.update(stack.lower_overlap(rid, prompt, start))
                assert got == want, (trial, prompt)

    run(make, body)


def test_a_store_ships_its_feed_to_redis_with_the_replicas_shipper(redis_server):
    """The store process, with a Redis index, ships its feed as a replica does (replica/shipper.py, given
    its StoreScope): declared a store before its first batch, its blocks answer the replicas it serves."""
    import asyncio
    from types import SimpleNamespace

    from replica.core.cache.pool import KvEvent
    from replica.events import EventFeed
    from replica.shipper import RedisShipper
    from shared.index import RedisIndex

    async def body():
        cluster = "store" + str(random.getrandbits(32))
        feed = EventFeed("shared-store", lambda: [], mode="push")
        shipper = RedisShipper(SimpleNamespace(feed=feed, settings=SimpleNamespace(replica_id="shared-store")),
                               redis_server.url, cluster, store=StoreScope("shared-store", SHARED))
        router = RedisIndex(redis_server.url, cluster=cluster)
        try:
            await router.apply(batch("A", 0, ev("stored", H1)))
            feed.publish([KvEvent("stored", (H1, H2, H3), SHARED)])
            assert await shipper._ship(feed.pop_ready())
            await router.add_store(StoreScope("shared-store", SHARED, ("A",)))
            assert await router.lookup([H1, H2, H3, H4]) == {"A": 1, "A#3": 2}
            assert (await router.replicas())["shared-store"].blocks == 3
        finally:
            await shipper.close()
            await router.close()

    asyncio.run(body())
