"""The compiled pool leaves exactly the pool the same calls on the Python ``BlockPool`` leave."""

import math
import os
import random
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, PoolBusyError
from replica.core.cache.types import Lookup
from replica.core.compiled import pool as compiled_pool
from replica.core.compiled.pool import CompiledPool
from replica.core.compiled.snapshot import PoolSnapshot
from shared.errors import InputError
from sim.simulator import NextUses

needs_compiled = pytest.mark.skipif(not compiled_pool.compiled(), reason="the compiled pool is not built (no C compiler)")


@dataclass
class Req:
    hash_ids: list
    session: str
    input_tokens: int | None
    t: float
    next_use: list | None = None  # the oracle's: position of each block's next access
    position: float | None = None  # the oracle's now: where the request starts in the access order


def with_next_uses(trace: list[Req]) -> list[Req]:
    future = NextUses(SimpleNamespace(requests=trace))
    for k, r in enumerate(trace):
        r.next_use, r.position = future.of(k), future.position(k)
    return trace


def random_trace(seed: int, n: int = 600, universe: int = 400) -> list[Req]:
    """Sessions whose turns extend their previous prompt, requests sharing system prompts, random
    blocks (holes), odd token counts and timestamps that repeat."""
    rng = random.Random(seed)
    prompts: dict[str, list[int]] = {}
    systems = [[rng.randrange(1 << 63) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    out = []
    for i in range(n):
        s = f"s{rng.randrange(30)}"
        kind = rng.random()
        if kind < 0.5 and s in prompts:
            hs = prompts[s] + [rng.randrange(1 << 63) for _ in range(rng.randint(0, 5))]
        elif kind < 0.8:
            hs = list(rng.choice(systems)) + [rng.randrange(1 << 63) for _ in range(rng.randint(0, 8))]
        else:
            hs = list(dict.fromkeys(rng.randrange(universe) for _ in range(rng.randint(1, 20))))
        hs = list(dict.fromkeys(hs))[:40]
        prompts[s] = hs
        tokens = None if rng.random() < 0.1 else rng.randint(1, len(hs) * 16 + 7)
        out.append(Req(hs, s, tokens, float(i // 3)))
    return out


def state(pool) -> PoolSnapshot:
    """Everything of a pool that a later request or a report can see."""
    return PoolSnapshot.of(pool)


def depth_cost(d: int) -> float:
    return 1.0 / (d + 3) + 0.1 * d


def python_pool(policy: str, capacity: int, hit_mode: str, params: dict, trace) -> BlockPool:
    pool = BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                     metrics=PoolMetrics(block_size=16, block_cost=depth_cost), block_cost=depth_cost)
    for r in trace:
        pool.serve(Lookup(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens, next_use=r.next_use,
                   position=r.position))
    return pool


def compiled_replay(policy: str, capacity: int, hit_mode: str, params: dict, trace) -> tuple[CompiledPool, int]:
    pool = BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                     metrics=PoolMetrics(block_size=16, block_cost=depth_cost), block_cost=depth_cost)
    assert compiled_pool.why_not(pool) is None
    fast = CompiledPool(pool)
    future = np.array([u for r in trace for u in r.next_use]) if trace and trace[0].next_use is not None else None
    return fast, fast.serve_requests(trace, next_use=future)


CASES = [("lru", {}), ("belady", {}), ("belady_compute", {}), ("s3fifo", {}), ("s3fifo", {"move_to_main_threshold": 1, "small_ratio": 0.3}),
         ("s3fifo", {"ghost_ratio": 0.0}), ("s3fifo", {"move_to_main_threshold": 3, "ghost_ratio": 2.5})]


@needs_compiled
@pytest.mark.parametrize("policy,params", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
@pytest.mark.parametrize("capacity", [40, 97, 300])
def test_the_compiled_replay_leaves_the_pool_the_python_loop_leaves(policy, params, hit_mode, capacity):
    for seed in range(3):
        trace = with_next_uses(random_trace(seed * 7 + capacity))
        expected = python_pool(policy, capacity, hit_mode, params, trace)
        got, served = compiled_replay(policy, capacity, hit_mode, params, trace)
        assert served == len(trace)
        assert state(got) == state(expected)
        # the costs are floats: equal to the last bit, not approximately
        assert got.metrics.cost_hit.hex() == expected.metrics.cost_hit.hex()
        # and the Python pool goes on from there exactly as it would have
        more = with_next_uses(random_trace(seed + 99, n=150))
        for pool in (expected, got):  # one request at a time now: acquire and release
            for r in more:
                pool.serve(Lookup(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens, next_use=r.next_use,
                           position=r.position))
        assert state(got) == state(expected)


@needs_compiled
def test_a_hand_worked_lru_replay():
    # capacity 4; each request's blocks go to the tail deepest first, so block 0 is the newest.
    trace = [Req([1, 2, 3], "a", 48, 0.0), Req([1, 2, 4], "b", 40, 1.0), Req([5, 6], "c", None, 2.0)]
    pool, served = compiled_replay("lru", 4, "holes", {}, trace)
    assert served == 3
    # after r1: order 3,2,1; r2 hits 1,2, inserts 4 (free slot): order 3,4,2,1;
    # r3 needs 2 blocks, none free: evicts 3 (never reused: one-hit) and 4 (one-hit), order 2,1,6,5
    pool = pool.settle()
    assert list(pool.resident.items()) == [(1, "a"), (2, "a"), (5, "c"), (6, "c")]
    assert list(pool.policy._queue) == [2, 1, 6, 5]
    assert pool.footprint == {"a": 2, "c": 2}
    s = pool.stats()
    assert (s["block_accesses"], s["block_hits"], s["evictions"], s["one_hit_blocks"]) == (8, 2, 2, 4)
    assert (s["tokens_queried"], s["tokens_hit"]) == (48 + 40 + 32, 32)


@needs_compiled
@pytest.mark.parametrize("bad", ["repeat", "too_long"])
def test_a_request_the_replay_cannot_serve_stops_it_and_serve_raises_the_pools_error(bad):
    trace = random_trace(5, n=200)
    cut = 120
    trace[cut].hash_ids = [7, 8, 7] if bad == "repeat" else list(range(1000, 1100))
    served_python = python_pool("lru", 60, "holes", {}, trace[:cut])
    pool, served = compiled_replay("lru", 60, "holes", {}, trace)
    assert served == cut
    assert state(pool) == state(served_python)
    r = trace[cut]
    with pytest.raises(InputError, match="block_hashes" if bad == "repeat" else "prompt"):
        pool.serve(Lookup(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens))
    assert state(pool) == state(served_python)  # nothing changed


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "array"])
def test_hashes_that_are_not_64_bit_unsigned_keep_the_python_pool(kernel, monkeypatch):
    if kernel and not compiled_pool.compiled():
        pytest.skip("the compiled pool is not built (no C compiler)")
    if not kernel:
        monkeypatch.setattr(compiled_pool, "_pool", None)
    assert compiled_pool.hashes_u64([[1, 2], [(1 << 64) - 1]]).tolist() == [1, 2, (1 << 64) - 1]
    assert compiled_pool.hashes_u64([[1, 2], [-5]]) is None
    assert compiled_pool.hashes_u64([[1 << 64]]) is None
    assert compiled_pool.hashes_u64([[1.0]]) is None
    assert compiled_pool.hashes_u64([(3, 4), [], [np.uint64(5), True]]).tolist() == [3, 4, 5, 1]  # __index__ too
    assert compiled_pool.hashes_u64([]).tolist() == compiled_pool.hashes_u64([[]]).tolist() == []
    big = [[random.Random(k).getrandbits(64) for _ in range(k % 7)] for k in range(500)]
    assert compiled_pool.hashes_u64(big).tolist() == [h for hs in big for h in hs]


@needs_compiled
def test_a_hash_the_compiled_pool_cannot_key_is_a_clear_error_and_changes_nothing():
    fast = CompiledPool(BlockPool(8, make_policy("lru"), emit_events=False))
    fast.serve(Lookup([1, 2], session="a"))
    before = state(fast)
    with pytest.raises(InputError, match="block_hashes.*64-bit"):
        fast.serve(Lookup([3, -1], session="a"))
    assert fast.serve_requests([Req([1 << 70], "a", None, 0.0)]) == 0
    assert state(fast) == before


def random_calls(seed: int, capacity: int, n: int = 700, stores: bool = False, fills: bool = False):
    """What a batching scheduler does to its pool: requests admitted (some refused for room), held
    while others come, decode KV taken and given back, released in another order; a re-admission
    that is not recorded."""
    rng = random.Random(seed)
    trace = random_trace(seed, n=n, universe=capacity * 3)
    calls, held = [], []
    for r in trace:
        if len(r.hash_ids) > capacity // 3:
            r.hash_ids = r.hash_ids[: capacity // 3]
        r.next_use = [rng.choice([float(rng.randrange(50)), math.inf]) for _ in r.hash_ids]  # ties too
        calls.append(("acquire", r, rng.choice([0, 0, 1, 2]), rng.random() > 0.1))
        held.append(len(calls) - 1)
        while held and (len(held) > rng.randint(1, 12)):
            calls.append(("release", held.pop(rng.randrange(len(held)))))
        if rng.random() < 0.3:
            calls.append(("take_private", rng.randint(1, capacity // 4)))
        if stores and rng.random() < 0.4:  # a response: new blocks after the prompt, some already cached, a repeat
            extra = [rng.randrange(1 << 63) for _ in range(rng.randint(0, capacity // 2))]
            calls.append(("store", r.hash_ids[-2:] + extra + extra[:1], r.session, r.t))
        if fills and rng.random() < 0.5:  # blocks decoding filled: new ones, a cached one, one another request pins
            running = [calls[j][1].hash_ids for j in held[:-1] if calls[j][0] == "acquire"]
            other = rng.choice(running) if running else []
            new = [rng.randrange(1 << 63) for _ in range(rng.randint(0, 3))]
            calls.append(("fill", new[:1] + r.hash_ids[-1:] + other[:1] + new[1:] + new[:1], r.session, r.t))
            held.append(len(calls) - 1)
    return calls + [("release", i) for i in held]


def run_calls(pool, calls, random_uses: bool = True) -> list:
    """Apply ``calls``; returns what each gave (an allocation's fields, or the error it raised)."""
    out, allocs, private = [], {}, 0
    for i, call in enumerate(calls):
        try:
            if call[0] == "acquire":
                _, r, extra, record = call
                a = pool.acquire(Lookup(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens,
                                 record=record, extra=extra, next_use=r.next_use if random_uses else None,
                                 position=float(i // 3)))  # repeats: several requests at one now
                allocs[i], private = (a, extra), private + extra
                out.append((a.hit_idx, a.new_idx, a.touched_idx, a.holes, a.hole_lengths))
            elif call[0] == "release":
                if call[1] in allocs:
                    a, extra = allocs.pop(call[1])
                    if a is not None:
                        pool.release(a, 0.0)
                    pool.free_private(extra)
                    private -= extra
                out.append(None)
            elif call[0] == "store":
                out.append(pool.store(call[1], call[2], call[3]))
            elif call[0] == "fill":  # private blocks its request held, some of them hashed now
                _, hashes, session, t = call
                pool.take_private(len(hashes))
                a = pool.fill(hashes, session, t)
                left = len(hashes) - (len(a.hashes) if a is not None else 0)
                allocs[i], private = (a, left), private + left
                out.append(None if a is None else (list(a.hashes), a.hit_idx, a.new_idx, a.touched_idx))
            else:
                pool.take_private(call[1])
                pool.free_private(call[1])
                out.append(None)
        except (PoolBusyError, InputError) as e:
            out.append((type(e).__name__, str(e)))
    return out


@needs_compiled
@pytest.mark.parametrize("policy,params", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
def test_acquire_release_and_private_blocks_as_a_scheduler_calls_them_give_the_same_pool(policy, params, hit_mode):
    for seed, capacity in ((1, 30), (2, 64), (3, 150)):
        calls = random_calls(seed, capacity)
        def make(capacity=capacity):
            return BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                             metrics=PoolMetrics(block_size=16, block_cost=lambda d: 1.0 + d % 3),
                             block_cost=lambda d: 1.0 + d % 3)  # equal scores at many depths: ties

        expected, got = make(), CompiledPool(make())
        results = run_calls(expected, calls)
        assert run_calls(got, calls) == results
        assert any(isinstance(x, tuple) and x[0] == "PoolBusyError" for x in results)  # the calls run out of room
        assert state(got) == state(expected)
        assert (got.room, got.free, got.pinned, got.private, got.usage()) == \
               (expected.room, expected.free, expected.pinned, expected.private, expected.usage())


STORE_CASES = [c for c in CASES if c[0] in ("lru", "s3fifo")]


@needs_compiled
@pytest.mark.parametrize("policy,params", STORE_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
def test_stored_responses_as_a_scheduler_keeps_them_give_the_same_pool(policy, params, hit_mode):
    """Kept response KV (``store``) between a scheduler's calls: what each store inserts (a block
    already resident and a repeat are skipped, room runs out while requests hold blocks) and the
    whole pool after, compiled and Python."""
    for seed, capacity in ((4, 30), (5, 64), (6, 150)):
        calls = random_calls(seed, capacity, stores=True)
        def make(capacity=capacity):
            return BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                             metrics=PoolMetrics(block_size=16, block_cost=lambda d: 1.0 + d % 3),
                             block_cost=lambda d: 1.0 + d % 3)

        expected, got = make(), CompiledPool(make())
        # midway, while requests hold blocks: the pin counts the reorder scheduler asks for
        half = len(calls) // 2
        first = run_calls(expected, calls[:half], random_uses=False)
        assert run_calls(got, calls[:half], random_uses=False) == first
        probe = [h for c in calls[:half] if c[0] == "acquire" for h in c[1].hash_ids]
        assert got.pins_of(probe) == expected.pins_of(probe) and any(got.pins_of(probe))
        results = first + run_calls(expected, calls[half:], random_uses=False)
        assert first + run_calls(got, calls[half:], random_uses=False) == results
        stored = [x for c, x in zip(calls, results) if c[0] == "store"]
        assert any(stored) and any(isinstance(x, list) and not x for x in stored)  # some insert, some find no room
        assert state(got) == state(expected)


@needs_compiled
@pytest.mark.parametrize("policy,params", STORE_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
def test_blocks_filled_as_decoding_fills_them_give_the_same_pool(policy, params, hit_mode):
    """``fill`` between a scheduler's calls (blocks a running request's decoding filled: new ones, one
    cached and unpinned, one another request pins, a repeat), with stored responses: what each fill pins
    and the whole pool after, compiled and Python."""
    for seed, capacity in ((7, 30), (8, 64), (9, 150)):
        calls = random_calls(seed, capacity, stores=True, fills=True)
        def make(capacity=capacity):
            return BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                             metrics=PoolMetrics(block_size=16, block_cost=lambda d: 1.0 + d % 3),
                             block_cost=lambda d: 1.0 + d % 3)

        expected, got = make(), CompiledPool(make())
        results = run_calls(expected, calls, random_uses=False)
        assert run_calls(got, calls, random_uses=False) == results
        filled = [(c[1], x) for c, x in zip(calls, results) if c[0] == "fill" and isinstance(x, tuple)
                  and isinstance(x[0], list)]
        assert any(x[2] for _, x in filled)  # some insert new blocks
        assert any(x[3] for _, x in filled)  # some pin cached ones
        assert any(len(x[0]) < len(set(asked)) for asked, x in filled)  # some leave one private: another pins it
        assert state(got) == state(expected)
        assert (got.room, got.free, got.pinned, got.private) == (expected.room, expected.free, expected.pinned,
                                                                 expected.private)


@needs_compiled
@pytest.mark.parametrize("policy,params", STORE_CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("capacity", [40, 300])
def test_the_compiled_replay_stores_responses_as_the_python_loop_does(policy, params, capacity):
    for seed in range(3):
        trace = random_trace(seed * 5 + capacity)
        rng = random.Random(seed)
        responses = [[rng.randrange(1 << 63) for _ in range(rng.randint(0, 6))] + r.hash_ids[-1:] for r in trace]
        expected = BlockPool(capacity, make_policy(policy, **params), emit_events=False,
                             metrics=PoolMetrics(block_size=16, block_cost=depth_cost), block_cost=depth_cost)
        for r, resp in zip(trace, responses):
            expected.serve(Lookup(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens))
            expected.store(resp, r.session, r.t)
        got = CompiledPool(BlockPool(capacity, make_policy(policy, **params), emit_events=False,
                                     metrics=PoolMetrics(block_size=16, block_cost=depth_cost), block_cost=depth_cost))
        assert got.serve_requests(trace, responses=responses) == len(trace)
        assert state(got) == state(expected)
        assert got.metrics.cost_hit.hex() == expected.metrics.cost_hit.hex()


@needs_compiled
def test_a_settled_pool_reads_the_same_midway_and_the_compiled_pool_goes_on():
    calls = random_calls(9, 40)
    expected, got = (BlockPool(40, make_policy("s3fifo"), emit_events=False) for _ in range(2))
    fast = CompiledPool(got)
    half = len(calls) // 2
    run_calls(expected, calls[:half]), run_calls(fast, calls[:half])
    assert state(fast) == state(expected)
    assert dict(fast.pin_counts) == dict(expected.pin_counts)
    run_calls(expected, calls[half:]), run_calls(fast, calls[half:])
    assert state(fast) == state(expected)


def test_why_not_names_what_keeps_the_compiled_pool_out():
    pool = BlockPool(10, make_policy("arc"), emit_events=False)
    if compiled_pool.compiled():
        assert "policy arc" in compiled_pool.why_not(pool)
        assert "events" in compiled_pool.why_not(BlockPool(10, make_policy("lru"), emit_events=True))
        busy = BlockPool(10, make_policy("lru"), emit_events=False)
        busy.serve(Lookup([1, 2]))
        assert compiled_pool.why_not(busy) is not None
        with pytest.raises(ValueError, match="no compiled pool"):
            CompiledPool(busy)
        huge = BlockPool(compiled_pool.MAX_BLOCKS + 1, make_policy("lru"), emit_events=False)
        assert "larger than" in compiled_pool.why_not(huge)
    else:
        assert "not built" in compiled_pool.why_not(pool)


@pytest.mark.skipif(not os.environ.get("KVEMU_REQUIRE_COMPILED"), reason="no C compiler was found by scripts/test")
def test_the_kernel_is_built_and_current_where_a_compiler_is():
    assert compiled_pool.compiled(), compiled_pool.why_not(BlockPool(1, make_policy("lru"), emit_events=False))


@needs_compiled
def test_the_policy_kinds_and_refusal_codes_come_from_the_extension():
    from replica.core.compiled.adapters import ADAPTERS, kernel_module

    kinds = [getattr(kernel_module, a.kind) for a in ADAPTERS.values()]
    assert len(set(kinds)) == len(ADAPTERS)  # one kind per compiled policy, defined once in _pool.c
    assert len({kernel_module.TOO_LONG, kernel_module.REPEATS, kernel_module.BUSY}) == 3


def scheduler_calls(pool, calls, between) -> list:
    """``run_calls``' steps one at a time, ``between(pool, i, out)`` after step i: what each acquire got
    (its hits, or the error's name) and whatever ``between`` adds."""
    out, allocs = [], {}
    for i, call in enumerate(calls):
        if call[0] == "acquire":
            _, r, extra, record = call
            try:
                allocs[i] = (pool.acquire(Lookup(r.hash_ids, session=r.session, now=r.t, extra=extra,
                                                 record=record)), extra)
                out.append(allocs[i][0].hit_idx)
            except (PoolBusyError, InputError) as e:
                out.append(type(e).__name__)
        elif call[0] == "release" and call[1] in allocs:
            alloc, extra = allocs.pop(call[1])
            pool.release(alloc)
            pool.free_private(extra)
        between(pool, i, out)
    return out


@needs_compiled
@pytest.mark.parametrize("policy,params", STORE_CASES, ids=lambda c: str(c))
def test_blocks_removed_as_a_tier_level_removes_them_give_the_same_pool(policy, params):
    """A tier level's fetched blocks leave it (``remove``): resident and unpinned ones only, never-reused
    ones counted one-hit when computed, none counted evicted; a repeat, a pinned block and an absent
    one are passed over. Between a scheduler's calls, compiled and Python give the same whole pool."""
    for seed, capacity in ((7, 30), (8, 64), (9, 150)):
        rng = random.Random(seed)
        calls = random_calls(seed, capacity)
        def make(capacity=capacity):
            return BlockPool(capacity, make_policy(policy, **params), emit_events=False,
                             metrics=PoolMetrics(block_size=16), block_cost=lambda d: 1.0)

        expected, got = make(), CompiledPool(make())
        removals = [(list(call[1].hash_ids[::2]) + [rng.randrange(1 << 63)], rng.random() < 0.8)
                    if call[0] == "acquire" and rng.random() < 0.5 else None for call in calls]
        def remove(pool, i, out, removals=removals):  # some of a request's blocks (pinned while it runs) and one absent
            if removals[i] is not None:
                pool.remove(*removals[i])

        results = [scheduler_calls(pool, calls, remove) for pool in (expected, got)]
        assert results[0] == results[1]
        assert state(got) == state(expected)
        assert got.used == expected.used and got.pinned == expected.pinned


def _writes_between_calls(policy: str, params: dict, seed: int, capacity: int, write) -> tuple[list, list]:
    """A Python pool and its compiled twin driven by a scheduler's random calls, with writes from above
    between them (some of a running request's blocks and new ones; once more than the pool holds,
    once a repeat): ``write(pool, hashes, now)`` returns what is recorded; what each recorded, after
    checking that both pools end in the same whole state."""
    rng = random.Random(seed)
    calls = random_calls(seed, capacity)
    def make():
        return BlockPool(capacity, make_policy(policy, **params), emit_events=False,
                         metrics=PoolMetrics(block_size=16), block_cost=lambda d: 1.0)

    expected, got = make(), CompiledPool(make())
    writes = [list(call[1].hash_ids[1::2]) + [rng.randrange(1 << 63) for _ in range(rng.randrange(4))]
              if call[0] == "acquire" and rng.random() < 0.5 else None for call in calls]
    writes[len(writes) // 2] = [rng.randrange(1 << 63) for _ in range(capacity + 1)]  # more than the pool
    writes[len(writes) // 3] = [5, 6, 5]  # a repeat: refused, nothing changes
    def between(pool, i, out):
        if writes[i] is not None:
            try:
                out.append(write(pool, writes[i], float(i)))
            except (PoolBusyError, InputError) as e:
                out.append(type(e).__name__)

    results = [scheduler_calls(pool, calls, between) for pool in (expected, got)]
    assert state(got) == state(expected)
    assert got.used == expected.used and got.pinned == expected.pinned
    return results[0], results[1]


@needs_compiled
@pytest.mark.parametrize("policy,params", STORE_CASES, ids=lambda c: str(c))
def test_blocks_written_in_as_a_tier_level_takes_them_give_the_same_pool(policy, params):
    """A tier level takes blocks written down from above (``admit``: served as one request of no
    session): compiled and Python give the same whole pool and errors, a write longer than the pool
    and a repeat refused."""
    for seed, capacity in ((17, 30), (18, 64), (19, 150)):
        want, got = _writes_between_calls(policy, params, seed, capacity,
                                          lambda pool, hashes, now: pool.admit(hashes, now) or "admitted")
        assert got == want and "admitted" in want
        assert "PoolCapacityError" in want and "InputError" in want


@needs_compiled
@pytest.mark.parametrize("policy,params", STORE_CASES, ids=lambda c: str(c))
def test_writes_a_level_takes_as_far_as_it_has_room_give_the_same_pool_and_the_same_new_blocks(policy, params):
    """``admit_absent`` (a tier level's write from above in one call): writes of resident and new
    blocks, some longer than the room left beside what is pinned, give the same new blocks, errors
    and whole pool compiled and in Python."""
    for seed, capacity in ((27, 30), (28, 64), (29, 150)):
        want, got = _writes_between_calls(policy, params, seed, capacity,
                                          lambda pool, hashes, now: ("new", pool.admit_absent(hashes, now)))
        assert got == want
        assert "InputError" in want and "PoolCapacityError" not in want
        assert any(isinstance(x, tuple) and len(x[1]) > 1 for x in want)


@needs_compiled
def test_a_hand_worked_write_from_above_stores_what_fits_beside_the_pinned_blocks():
    for pool in (BlockPool(4, make_policy("lru"), emit_events=False),
                 CompiledPool(BlockPool(4, make_policy("lru"), emit_events=False))):
        held = pool.acquire(Lookup([1, 2], session="a"))  # 2 pinned: room for 2 more
        assert pool.admit_absent([2, 3, 4, 5]) == [3, 4, 5]  # 2 resident; 3 and 4 fit; 5 is the caller's
        assert [h for h in (1, 2, 3, 4, 5) if h in pool.held] == [1, 2, 3, 4]
        pool.release(held)
        # 6 evicts the least recently used block: 4 (3 and 4 were written before 1 and 2 were released,
        # and a request's blocks are queued deepest first, as vLLM frees them: 4 before 3)
        assert pool.admit_absent([4, 6]) == [6]
        assert [h for h in (1, 2, 3, 4, 6) if h in pool.held] == [1, 2, 3, 6]
        assert pool.admit_absent([]) == []


@needs_compiled
def test_a_hand_worked_removal_leaves_the_lru_order_and_counts_it_as_python_does():
    for pool in (BlockPool(8, make_policy("lru"), emit_events=False),
                 CompiledPool(BlockPool(8, make_policy("lru"), emit_events=False))):
        pool.serve(Lookup([1, 2, 3], session="a"))
        pool.serve(Lookup([1, 4], session="b"))  # 1 reused
        held = pool.acquire(Lookup([2], session="c"))  # 2 pinned: stays
        pool.remove([1, 2, 3, 99])  # 1 (reused) and 3 (one-hit) leave; 2 pinned, 99 absent: passed over
        assert sorted(h for h in (1, 2, 3, 4) if h in pool.held) == [2, 4]
        assert pool.absent([1, 2, 3, 4, 5]) == [1, 3, 5]
        pool.release(held)
        settled = pool.settle()
        assert list(settled.policy._queue) == [4, 2]  # 4 queued after its request, 2 back at the tail
        assert settled.footprint == {"a": 1, "b": 1}
        s = settled.stats()
        assert (s["evictions"], s["one_hit_blocks"]) == (0, 1 + 1)  # 3 removed unreused; 4 resident unreused


@needs_compiled
def test_the_kernel_answers_the_tier_level_queries_the_python_definition_answers():
    """``KernelLevels`` (one call into the kernel) and ``HeldLevels`` (the definition, over membership):
    runs of depths one level holds, the upper level first, and the run after a start counted per level."""
    from replica.core.compiled.pool import KernelLevels
    from replica.core.tiers.stack import HeldLevels
    rng = random.Random(3)
    universe = [rng.randrange(1 << 63) for _ in range(300)]
    pythons, twins = [], []
    for capacity in (120, 200):
        python, twin = BlockPool(capacity, make_policy("lru"), emit_events=False), \
            CompiledPool(BlockPool(capacity, make_policy("lru"), emit_events=False))
        for _ in range(40):
            hs = list(dict.fromkeys(rng.sample(universe, rng.randint(1, 30))))
            python.serve(Lookup(hs))
            twin.serve(Lookup(hs))
        pythons.append(python)
        twins.append(twin)
    definition, kernel = HeldLevels([p.held for p in pythons]), KernelLevels(twins)
    for _ in range(300):
        hashes = rng.sample(universe, rng.randint(0, 60))
        depths = sorted(rng.sample(range(len(hashes)), rng.randint(0, len(hashes))))
        assert kernel.runs(hashes, depths) == definition.runs(hashes, depths)
        start = rng.randint(0, len(hashes))
        assert kernel.lower_counts(hashes, start) == definition.lower_counts(hashes, start)
    # by hand: level 0 holds a, b, d; level 1 holds b, c
    a, b, c, d, e = 11, 12, 13, 14, 15
    levels = [BlockPool(8, make_policy("lru"), emit_events=False) for _ in range(2)]
    levels[0].serve(Lookup([a, b, d]))
    levels[1].serve(Lookup([b, c]))
    twins = [CompiledPool(BlockPool(8, make_policy("lru"), emit_events=False)) for _ in range(2)]
    for queries in (HeldLevels([lv.held for lv in levels]), KernelLevels(twins)):
        if isinstance(queries, KernelLevels):
            for twin, hs in zip(queries._kernels, ([a, b, d], [b, c])):
                twin.acquire(hs, 0, -1, True, 0)
                twin.release(hs)
        assert queries.runs([a, b, c, e, d], [0, 1, 2, 3, 4]) == [(0, 0, 2), (1, 2, 3), (0, 4, 5)]
        assert queries.runs([a, b, c, e, d], [1, 4]) == [(0, 1, 2), (0, 4, 5)]
        assert queries.lower_counts([a, b, c, e, d], 0) == [2, 1]  # stops at e
        assert queries.lower_counts([a, b, c, e, d], 4) == [1, 0]


def _tracker(pool):
    return (pool.pool if isinstance(pool, CompiledPool) else pool).metrics.reuse


@needs_compiled
@pytest.mark.parametrize("max_tracked", [1 << 16, 24])
def test_shards_sampled_in_the_kernel_leaves_the_tracker_deferring_whole_requests_leaves(max_tracked):
    """The compiled pool samples SHARDS's blocks where their keys are (``ShardsTracker.sample_in``):
    after a scheduler's random calls, with shrinks (a small ``max_tracked``), a ``record`` between
    (it lowers the threshold after the kernel was told one) and requests deferred whole between
    (a replay's), the tracker holds exactly what the Python pool's tracker holds."""
    from replica.core.analysis.shards import ShardsTracker

    for seed, capacity in ((37, 30), (38, 150)):
        rng = random.Random(seed)
        calls = random_calls(seed, capacity)
        def make(capacity=capacity, seed=seed):
            tracker = ShardsTracker(rate=0.5, max_tracked=max_tracked, seed=seed)
            return BlockPool(capacity, make_policy("lru"), emit_events=False,
                             metrics=PoolMetrics(block_size=16, reuse_tracker=tracker), block_cost=lambda d: 1.0)

        expected, got = make(), CompiledPool(make())
        extra = [([rng.randrange(1 << 63) for _ in range(rng.randrange(1, 9))], rng.choice(["record", "defer"]))
                 if rng.random() < 0.1 else None for _ in calls]
        def between(pool, i, out, extra=extra):
            if extra[i] is not None:
                hashes, how = extra[i]
                getattr(_tracker(pool), how)(hashes, float(i))

        results = [scheduler_calls(pool, calls, between) for pool in (expected, got)]
        assert results[0] == results[1]
        want, have = _tracker(expected), _tracker(got)
        assert have.to_dict() == want.to_dict()
        assert (have.threshold, have.accesses, have.sampled) == (want.threshold, want.accesses, want.sampled)
        assert want.sampled > 0
        if max_tracked < 100:
            assert want.threshold < round(0.5 * want.P)  # it shrank
