"""The compiled cache-only replay leaves exactly the pool the Python loop of ``BlockPool.serve`` leaves."""

import os
import random
from dataclasses import dataclass

import pytest

from loadgen.trace import TraceRequest
from replica.core import replay
from replica.core.metrics import PoolMetrics
from replica.core.policies import make_policy
from replica.core.pool import BlockPool
from shared.errors import InputError

needs_kernel = pytest.mark.skipif(not replay.compiled(), reason="the compiled kernel is not built (no C compiler)")


@dataclass
class Req:
    hash_ids: list
    session: str
    input_tokens: int | None
    t: float


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


def state(pool: BlockPool) -> dict:
    """Everything of a pool that a later request or a report can see."""
    p = pool.policy
    out = {"resident": list(pool.resident.items()), "footprint": list(pool.footprint.items()),
           "reused": pool._reused, "now": pool.now, "stats": pool.stats(top_k=50),
           "metrics": {k: v for k, v in vars(pool.metrics).items() if k not in ("costs", "reuse")}}
    if p.name == "lru":
        out["order"] = list(p._queue)
    else:
        out.update(freq=p._freq, small=list(p._small), main=list(p._main), ghost=list(p._ghost), evicted=p._evicted)
    return out


def python_pool(policy: str, capacity: int, hit_mode: str, params: dict, trace) -> BlockPool:
    pool = BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                     metrics=PoolMetrics(block_size=16, block_cost=lambda d: 1.0 / (d + 3) + 0.1 * d))
    for r in trace:
        pool.serve(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens)
    return pool


def compiled_pool(policy: str, capacity: int, hit_mode: str, params: dict, trace) -> tuple[BlockPool, int]:
    pool = BlockPool(capacity, make_policy(policy, **params), hit_mode=hit_mode, emit_events=False,
                     metrics=PoolMetrics(block_size=16, block_cost=lambda d: 1.0 / (d + 3) + 0.1 * d))
    assert replay.why_not(pool) is None
    return pool, replay.serve_requests(pool, trace)


CASES = [("lru", {}), ("s3fifo", {}), ("s3fifo", {"move_to_main_threshold": 1, "small_ratio": 0.3}),
         ("s3fifo", {"ghost_ratio": 0.0}), ("s3fifo", {"move_to_main_threshold": 3, "ghost_ratio": 2.5})]


@needs_kernel
@pytest.mark.parametrize("policy,params", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("hit_mode", ["holes", "prefix"])
@pytest.mark.parametrize("capacity", [40, 97, 300])
def test_the_compiled_replay_leaves_the_pool_the_python_loop_leaves(policy, params, hit_mode, capacity):
    for seed in range(3):
        trace = random_trace(seed * 7 + capacity)
        expected = python_pool(policy, capacity, hit_mode, params, trace)
        got, served = compiled_pool(policy, capacity, hit_mode, params, trace)
        assert served == len(trace)
        assert state(got) == state(expected)
        # the costs are floats: equal to the last bit, not approximately
        assert got.metrics.cost_hit.hex() == expected.metrics.cost_hit.hex()
        # and the Python pool goes on from there exactly as it would have
        more = random_trace(seed + 99, n=150)
        for pool in (expected, got):
            for r in more:
                pool.serve(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens)
        assert state(got) == state(expected)


@needs_kernel
def test_a_hand_worked_lru_replay():
    # capacity 4; each request's blocks go to the tail deepest first, so block 0 is the newest.
    trace = [Req([1, 2, 3], "a", 48, 0.0), Req([1, 2, 4], "b", 40, 1.0), Req([5, 6], "c", None, 2.0)]
    pool, served = compiled_pool("lru", 4, "holes", {}, trace)
    assert served == 3
    # after r1: order 3,2,1; r2 hits 1,2, inserts 4 (free slot): order 3,4,2,1;
    # r3 needs 2 blocks, none free: evicts 3 (never reused: one-hit) and 4 (one-hit), order 2,1,6,5
    assert list(pool.resident.items()) == [(1, "a"), (2, "a"), (5, "c"), (6, "c")]
    assert list(pool.policy._queue) == [2, 1, 6, 5]
    assert pool.footprint == {"a": 2, "c": 2}
    s = pool.stats()
    assert (s["block_accesses"], s["block_hits"], s["evictions"], s["one_hit_blocks"]) == (8, 2, 2, 4)
    assert (s["tokens_queried"], s["tokens_hit"]) == (48 + 40 + 32, 32)


@needs_kernel
@pytest.mark.parametrize("bad", ["repeat", "too_long", "negative", "huge"])
def test_a_request_the_kernel_cannot_serve_stops_it_and_the_python_pool_raises(bad):
    trace = random_trace(5, n=200)
    cut = 120
    if bad == "repeat":
        trace[cut].hash_ids = [7, 8, 7]
    elif bad == "too_long":
        trace[cut].hash_ids = list(range(1000, 1100))
    served_python = python_pool("lru", 60, "holes", {}, trace[:cut])
    pool, served = compiled_pool("lru", 60, "holes", {}, trace) if bad in ("repeat", "too_long") else (None, None)
    if bad in ("negative", "huge"):  # not a 64-bit unsigned hash: the kernel serves none, Python all
        trace[cut].hash_ids = [-5] if bad == "negative" else [1 << 70]
        pool, served = compiled_pool("lru", 60, "holes", {}, trace)
        assert served == 0 and not pool.resident
        return
    assert served == cut
    assert state(pool) == state(served_python)
    with pytest.raises(InputError):
        r = trace[cut]
        pool.serve(r.hash_ids, session=r.session, now=r.t, input_tokens=r.input_tokens)


def test_why_not_names_what_keeps_the_kernel_out():
    pool = BlockPool(10, make_policy("arc"), emit_events=False)
    if replay.compiled():
        assert "policy arc" in replay.why_not(pool)
        lru = BlockPool(10, make_policy("lru"), emit_events=True)
        assert "events" in replay.why_not(lru)
        busy = BlockPool(10, make_policy("lru"), emit_events=False)
        busy.serve([1, 2])
        assert "not empty" in replay.why_not(busy) or "not compiled or not fresh" in replay.why_not(busy)
    else:
        assert "not built" in replay.why_not(pool)
    assert replay.serve_requests(pool, [TraceRequest(0.0, "s", 0, [1], 16, 1)]) == 0


@pytest.mark.skipif(not os.environ.get("KVEMU_REQUIRE_COMPILED"), reason="no C compiler was found by scripts/test")
def test_the_kernel_is_built_and_current_where_a_compiler_is():
    assert replay.compiled(), replay.why_not(BlockPool(1, make_policy("lru"), emit_events=False))
