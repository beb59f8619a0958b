"""The prefix index keeps each replica's host and SSD tiers too (events tagged with the tier):
hand-worked lookups, the epoch / gap / cleared rules over every tier, the bound, the wire form,
and random streams against a reference model, on both backends."""

from __future__ import annotations

import random

import msgpack
import pytest

from shared.errors import InputError
from shared.index import EventBatch, IndexEvent
from tests.support.index_cases import H1, H2, H3, H4, H5, H6, batch, ev, run

LEVEL = {"host": 1, "ssd": 2}


def tev(kind: str, tier: str, *hashes: int) -> IndexEvent:
    """An event of the level named ``tier``: host DRAM is level 1, SSD level 2."""
    return IndexEvent(kind, tuple(hashes), LEVEL[tier])


def test_lower_tiers_answer_the_run_after_the_hbm_prefix(make):
    async def body(idx):
        # A: H1 H2 in HBM, H3 in host, H4 H5 on SSD (H4 also in host: host is looked up first)
        await idx.apply(batch("A", 0, ev("stored", H1, H2), tev("stored", "host", H3, H4),
                              tev("stored", "ssd", H4, H5)))
        # B: nothing in HBM; H1 in host, H2 on SSD
        await idx.apply(batch("B", 0, tev("stored", "host", H1), tev("stored", "ssd", H2)))
        assert await idx.lookup([H1, H2, H3, H4, H5, H6]) == {
            "A": 2, "A#1": 2, "A#2": 1, "B#1": 1, "B#2": 1}
        # the run ends at the first block no tier holds: H6 after A's prefix
        assert await idx.lookup([H1, H2, H6, H3]) == {"A": 2, "B#1": 1, "B#2": 1}
        # a lower tier alone, from the first block
        assert await idx.lookup([H3, H4, H5]) == {"A#1": 2, "A#2": 1}
        # a block held in HBM after the prefix but in no lower tier ends the run (as in the simulator)
        await idx.apply(batch("A", 3, ev("stored", H6)))
        assert await idx.lookup([H1, H3, H6, H4]) == {"A": 1, "A#1": 1, "B#1": 1}
        reps = await idx.replicas()
        assert [(reps[r].blocks, reps[r].lower_blocks) for r in "AB"] == [(3, (2, 2)), (0, (1, 1))]
        assert (await idx.stats())["entries"] == 9

    run(make, body)


def test_removed_cleared_epoch_and_gap_cover_every_tier(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1), tev("stored", "host", H2, H3), tev("stored", "ssd", H4)))
        r = await idx.apply(batch("A", 3, tev("removed", "host", H3, H5), tev("removed", "ssd", H1)))
        assert (r.applied, r.reset) == (2, None)  # H5 never stored, H1 is not on SSD: no-ops
        assert await idx.lookup([H1, H2, H3, H4]) == {"A": 1, "A#1": 1}
        assert (await idx.stats())["entries"] == 3
        # a resync: cleared wipes HBM and both tiers, then each tier is stored again
        await idx.apply(batch("A", 5, ev("cleared"), ev("stored", H2), tev("stored", "ssd", H3)))
        assert await idx.lookup([H1, H2]) == {}
        assert await idx.lookup([H2, H3, H4]) == {"A": 1, "A#2": 1}
        assert (await idx.stats())["entries"] == 2
        # a gap, then a restart: each clears the lower tiers with HBM
        r = await idx.apply(batch("A", 10, tev("stored", "host", H5)))
        assert (r.reset, r.synced) == ("gap", False)
        assert await idx.lookup([H2, H3]) == {} and await idx.lookup([H5]) == {"A#1": 1}
        r = await idx.apply(batch("A", 0, ev("stored", H1), epoch="e2"))
        assert r.reset == "epoch" and await idx.lookup([H1, H5]) == {"A": 1}
        await idx.apply(batch("A", 1, tev("stored", "host", H5), epoch="e2"))
        assert await idx.clear_replica("A") == 1
        assert await idx.lookup([H1, H5]) == {} and (await idx.stats())["entries"] == 0
        # a tier emptied by removals stops answering
        await idx.apply(batch("B", 0, tev("stored", "ssd", H1), tev("removed", "ssd", H1)))
        assert await idx.lookup([H1]) == {} and (await idx.stats())["entries"] == 0

    run(make, body)


def test_tier_entries_count_against_the_bound(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1, H2)))
        r = await idx.apply(batch("A", 1, tev("stored", "host", H3, H4)))
        assert (r.dropped_entries, r.synced) == (1, False)
        assert await idx.lookup([H1, H2, H3, H4]) == {"A": 2, "A#1": 1}
        r = await idx.apply(batch("A", 2, tev("stored", "host", H3)))  # held already: not a drop
        assert r.dropped_entries == 0
        await idx.apply(batch("A", 3, ev("cleared"), tev("stored", "ssd", H5)))
        assert await idx.lookup([H5]) == {"A#2": 1} and (await idx.stats())["entries"] == 1

    run(make, body, max_entries=3)


def test_wire_carries_the_tier_only_when_there_is_one():
    b = batch("A", 0, ev("stored", H1), tev("stored", "host", H2), tev("removed", "ssd", H3), ev("cleared"))
    raw = msgpack.unpackb(b.to_wire())
    assert raw["events"] == [["stored", [H1]], ["stored", [H2], 1], ["removed", [H3], 2], ["cleared", []]]
    assert EventBatch.from_wire(b.to_wire()) == b


@pytest.mark.parametrize("event, field", [
    (["stored", [1], "host"], "events[0].level"),  # a level is its index on the wire, not its name
    (["stored", [1], 16], "events[0].level"),
    (["stored", [1], -1], "events[0].level"),
    (["stored", [1], True], "events[0].level"),
    (["cleared", [], 1], "events[0].level"),
    (["stored", [1], 1, "x"], "events[0]"),
])
def test_a_bad_tier_names_the_field(event, field):
    data = msgpack.packb({"replica_id": "A", "epoch": "e1", "seq": 0, "events": [event]})
    with pytest.raises(InputError) as e:
        EventBatch.from_wire(data)
    assert e.value.field == field


def test_random_tier_streams_match_a_reference_model(make):
    """stored / removed per tier, cleared, lost batches and restarts on 3 replicas; every
    lookup equals the HBM prefix plus the host-first run after it, computed by hand."""
    tiers = (0, 1, 2)  # HBM, host DRAM, SSD

    async def body(idx):
        rng = random.Random(11)
        universe = [rng.getrandbits(64) for _ in range(16)]
        model = {r: {t: set() for t in tiers} for r in "ABC"}
        seqs, epochs = dict.fromkeys("ABC", 0), dict.fromkeys("ABC", 0)
        for _ in range(300):
            rid = rng.choice("ABC")
            roll = rng.random()
            if roll < 0.04:  # restart
                epochs[rid], seqs[rid] = epochs[rid] + 1, 0
                model[rid] = {t: set() for t in tiers}
            elif roll < 0.08:  # a batch is lost
                seqs[rid] += 1
                model[rid] = {t: set() for t in tiers}
            events = []
            for _ in range(rng.randint(0, 3)):
                kind = rng.choices(["stored", "removed", "cleared"], [6, 3, 1])[0]
                tier = 0 if kind == "cleared" else rng.choice(tiers)
                hs = [] if kind == "cleared" else rng.sample(universe, rng.randint(1, 6))
                events.append(IndexEvent(kind, tuple(hs), tier))
                if kind == "cleared":
                    model[rid] = {t: set() for t in tiers}
                elif kind == "stored":
                    model[rid][tier].update(hs)
                else:
                    model[rid][tier].difference_update(hs)
            await idx.apply(EventBatch(rid, f"e{epochs[rid]}", seqs[rid], events))
            seqs[rid] += len(events)
            prompt = rng.sample(universe, rng.randint(1, 10))
            assert await idx.lookup(prompt) == _expected(model, prompt)
        assert (await idx.stats())["entries"] == sum(len(s) for m in model.values() for s in m.values())

    run(make, body, gc_chunk=1)


def _expected(model: dict, prompt: list[int]) -> dict[str, int]:
    out = {}
    for rid, held in model.items():
        n = 0
        while n < len(prompt) and prompt[n] in held[0]:
            n += 1
        if n:
            out[rid] = n
        counts = {1: 0, 2: 0}
        for h in prompt[n:]:
            tier = 1 if h in held[1] else 2 if h in held[2] else None
            if tier is None:
                break
            counts[tier] += 1
        out.update({f"{rid}#{t}": c for t, c in counts.items() if c})
    return out
