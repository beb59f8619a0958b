"""``Scheduler.abort``: a request whose client went away leaves the scheduler from wherever it is
(waiting, prefilling, decoding, waiting again after a preemption), never finishes, and gives its
blocks back as vLLM frees an aborted request's: full blocks whose KV was computed stay cached
(evictable), prompt blocks its prefill had not finished leave the pool, unhashed blocks are freed."""

import random

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.sched_types import prefill_len
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from replica.core.tiers.stack import TierSettings
from shared.costmodel import CostModel

COST = CostModel.from_names("llama-3-8b", "h100")
BS = 16


def make(capacity=1000, keep_response_kv=False, prefix_caching=True, emit_events=False, **kw):
    pool = BlockPool(capacity, make_policy("lru"), block_size=BS, emit_events=emit_events,
                     prefix_caching=prefix_caching)
    return pool, Scheduler(pool, COST, SchedulerSettings(**kw), keep_response_kv=keep_response_kv)


def req(rid, n_blocks, tail=0, out=3, base=0, t=0.0):
    return SchedRequest(rid, [base + i for i in range(n_blocks)], n_blocks * BS + tail, out, t)


def drain(sched, now=0.0):
    finished = []
    while sched.has_work():
        res = sched.step(now, now)
        finished += res.finished
        now += res.duration
    return finished, now


def idle(pool, sched):
    """Nothing running, queued or held: the scheduler as if the request had never come."""
    assert not sched.has_work() and sched.num_running == 0 and sched.num_waiting == 0
    assert sched.queued_prefill_tokens == 0 and not sched.prefilling and not sched._done_at
    assert (sched._dec_input, sched._dec_base, len(sched._decoders)) == (0, 0, 0)
    assert pool.pinned == 0 and pool.private == 0 and not pool.pin_counts


def test_abort_while_waiting_takes_it_off_the_queue_and_touches_no_block():
    pool, sched = make(capacity=20)
    a, b = req(1, 15, out=5, base=0), req(2, 15, out=3, base=100)
    sched.submit(a)
    sched.submit(b)
    now = sched.step(0.0, 0.0).duration
    assert sched.num_running == 1 and list(sched.waiting) == [b]  # 15 + 15 blocks > 20
    assert sched.queued_prefill_tokens == b.input_tokens
    resident, pinned, private = dict(pool.resident), pool.pinned, pool.private
    assert sched.abort(b, now) is True
    assert not sched.waiting and sched.queued_prefill_tokens == 0
    assert dict(pool.resident) == resident and (pool.pinned, pool.private) == (pinned, private) == (15, private)
    assert not any(h in pool.resident for h in b.hashes) and b.alloc is None
    assert sched.abort(b, now) is False  # gone already
    finished, _ = drain(sched, now)
    assert finished == [a] and a.generated == 5 and b.t_finished == -1.0
    assert sched.abort(a, now) is False  # finished: nothing to abort
    idle(pool, sched)
    assert sched.stats()["admissions"] == 1


def test_abort_while_prefilling_keeps_the_blocks_it_computed_and_drops_the_rest():
    """165 tokens (10 hashed blocks and a 5-token tail), 72 tokens a step: after one step blocks
    0-3 are computed and block 4 half; the abort leaves blocks 0-3 cached, unpinned, and drops 4-9
    (vLLM never cached them); the tail block is freed. The next request with this prompt hits 4."""
    pool, sched = make(capacity=100, token_budget=72, emit_events=True)
    r = req(1, 10, tail=5, out=4)
    sched.submit(r)
    now = sched.step(0.0).duration
    pool.drain_events()
    assert r.segments == [[72, 93]] and sched.queued_prefill_tokens == 93
    assert (pool.pinned, pool.private, pool.used) == (10, 1, 10)
    assert sched.abort(r, now) is True
    idle(pool, sched)
    assert set(pool.resident) == {0, 1, 2, 3} and pool.evictable == 4
    assert r.alloc is None and r.segments == [] and r.t_first_token == -1.0
    assert [(e.kind, e.hashes) for e in pool.drain_events()] == [("removed", (4, 5, 6, 7, 8, 9))]
    assert pool.metrics.evictions == 0 and pool.metrics.one_hit_evictions == 0  # never computed: no eviction
    again = req(2, 10, tail=5, out=1)
    sched.submit(again)
    drain(sched, now)
    assert again.cached_tokens == 4 * BS


def test_abort_while_prefilling_leaves_blocks_another_running_request_holds():
    """B (6 blocks) and A (B's 6, then 4 more) are admitted in one step of 128 tokens: B prefills its 96,
    A finds B's blocks and computes 32 tokens (blocks 6 and 7). A's abort drops blocks 8 and 9 (never
    computed); 6 and 7 stay cached, 0-5 stay pinned by B, which finishes."""
    pool, sched = make(capacity=100, token_budget=128)
    a, b = req(1, 10, out=2), req(2, 6, out=2)
    sched.submit(b)
    sched.submit(a)
    now = sched.step(0.0).duration
    assert list(sched.prefilling) == [a] and a.segments == [[128, 32]] and a.cached_tokens == 96
    assert sched.abort(a, now) is True
    assert not sched.prefilling and sched.queued_prefill_tokens == 0
    assert set(pool.resident) == set(range(8)) and pool.pin_counts == {h: 1 for h in range(6)}
    finished, _ = drain(sched, now)
    assert finished == [b] and b.generated == 2
    idle(pool, sched)
    assert set(pool.resident) == set(range(8))


def test_abort_while_decoding_frees_its_decode_blocks_and_keeps_its_prompt_cached():
    pool, sched = make(capacity=100)
    r = req(1, 4, out=50)  # 64 tokens: 4 hashed blocks, no tail
    sched.submit(r)
    now = 0.0
    while sched._tick - r.base < 20 or not r.resumed:  # one decode step at a time
        now += sched.step(now, now).duration
    generated = sched._tick - r.base
    assert generated == 20 and r.extra_blocks == 2 and (pool.pinned, pool.private) == (4, 2)  # 64 + 19 tokens' KV
    assert sched.abort(r, now) is True
    idle(pool, sched)
    assert set(pool.resident) == set(r.hashes) and pool.evictable == 4
    assert r.generated == generated and r.extra_blocks == 0 and r.alloc is None and r.t_finished == -1.0
    assert sched.abort(r, now) is False
    other = req(2, 4, base=500, out=40)  # the decode heap's stale entry for r is skipped
    sched.submit(other)
    finished, _ = drain(sched, now)
    assert finished == [other] and other.generated == 40
    idle(pool, sched)


def test_abort_while_decoding_keeps_the_full_response_blocks_it_generated_where_response_kv_is_kept():
    """Response KV kept (colocated vLLM): 64 prompt tokens, 70 out, whose 4 full response blocks
    a finish would cache. After 40 tokens (103 tokens' KV written: 2 full response blocks and a
    partial third) those 2 are hashed and pinned already (decoding filled them: 7 blocks held, 6 of
    them hashed, 1 private) and the abort leaves them cached, as vLLM v1 keeps every full block it computed."""
    pool, sched = make(capacity=100, keep_response_kv=True)
    r = req(1, 4, out=70)
    r.response_hashes = [1000, 1001, 1002, 1003]
    sched.submit(r)
    now = 0.0
    while sched._tick - r.base < 40 or not r.resumed:
        now += sched.step(now, now).duration
    assert (r.extra_blocks, r.fill_pins, pool.private, pool.pinned) == (1, 2, 1, 6)
    assert pool.prefix_match([0, 1, 2, 3, 1000, 1001, 1002]) == 6
    assert sched.abort(r, now) is True
    idle(pool, sched)
    assert set(pool.resident) == {0, 1, 2, 3, 1000, 1001} and pool.evictable == 6
    assert r.kept == 2


def test_abort_after_a_preemption_takes_it_off_the_queue():
    """The preemption scenario of test_scheduler: B is preempted with 17 tokens generated and waits
    again (its blocks released, its prompt cached) while A finishes. Aborted there, B leaves the
    queue with its 81 tokens to recompute; the pool keeps what the preemption left."""
    pool, sched = make(capacity=10)
    a, b = req(1, 4, out=20, base=0), req(2, 4, out=20, base=100)
    sched.submit(a)
    sched.submit(b)
    now, finished = 0.0, []
    for _ in range(3):
        res = sched.step(now)
        now += res.duration
        finished += res.finished
    assert finished == [a] and list(sched.waiting) == [b] and b.preemptions == 1 and b.generated == 17
    assert b.alloc is None and sched.queued_prefill_tokens == prefill_len(b) == 64 + 17
    resident = dict(pool.resident)
    assert sched.abort(b, now) is True
    idle(pool, sched)
    assert dict(pool.resident) == resident and set(b.hashes) <= set(pool.resident) and pool.evictable == 8
    assert sched.stats()["preemptions"] == 1 and sched.stats()["admissions"] == 2 and b.t_finished == -1.0


def test_abort_without_prefix_caching_frees_every_block():
    pool, sched = make(capacity=100, prefix_caching=False, token_budget=64)
    r = req(1, 10, tail=5, out=4)
    sched.submit(r)
    now = sched.step(0.0).duration
    assert (pool.private, pool.used) == (11, 0)
    assert sched.abort(r, now) is True
    idle(pool, sched)
    assert pool.used == 0


def test_unknown_request_is_not_aborted():
    pool, sched = make()
    assert sched.abort(req(1, 2), 0.0) is False
    idle(pool, sched)


def random_run(pool, sched, rng, responses=False) -> set:
    """Random traffic with random aborts in every state until the scheduler is idle; checks that
    the others run to their last token, once, and aborted ones never finish. Returns the states
    aborted from."""
    reqs, aborted, finished, now = [], set(), [], 0.0
    states = set()
    for k in range(200):
        if rng.random() < 0.6:
            r = req(k, rng.randint(1, 30), tail=rng.randint(0, 15), out=rng.randint(1, 40),
                    base=rng.choice([0, 1000 * (k + 1)]), t=now)
            if responses:
                r.response_hashes = [10**6 * (k + 1) + j for j in range((r.input_tokens + r.output_tokens) // BS
                                                                         - len(r.hashes))]
            reqs.append(r)
            sched.submit(r)
        if rng.random() < 0.2:
            where = {"waiting": [r for r in sched.waiting if not r.preemptions],
                     "preempted": [r for r in sched.waiting if r.preemptions],
                     "prefilling": list(sched.prefilling), "decoding": list(sched._decoders.values()),
                     "finished": finished[-3:], "aborted": [r for r in reqs if r.rid in aborted][-3:]}
            state = rng.choice([name for name, rs in where.items() if rs] or ["none"])
            if state != "none":
                r = rng.choice(where[state])
                assert sched.abort(r, now) is (state not in ("finished", "aborted")), (state, r.rid)
                aborted.add(r.rid)
                states.add(state)
        res = sched.step(now, now)
        finished += res.finished
        now += res.duration
        assert len(pool.pin_counts) + pool.private <= pool.capacity
        assert sum(r.extra_blocks for r in sched.running) == pool.private
    while sched.has_work():
        res = sched.step(now, now)
        finished += res.finished
        now += res.duration
    aborted -= {r.rid for r in finished}  # those picked after they finished
    assert sorted(r.rid for r in finished) == sorted(r.rid for r in reqs if r.rid not in aborted)
    assert all(r.generated == r.output_tokens for r in finished)
    assert all(r.t_finished == -1.0 for r in reqs if r.rid in aborted)
    idle(pool, sched)
    assert not sched._lent and not sched._promoted
    return states


@pytest.mark.parametrize("admission", ["fcfs", "reorder"])
@pytest.mark.parametrize("seed", range(4))
def test_random_aborts_leave_consistent_bookkeeping(seed, admission):
    """A tight pool (preemptions, and under reorder loans taken back), random aborts in every state:
    at the end nothing is pinned, held, queued or lent."""
    pool, sched = make(capacity=40, token_budget=64, max_running=6, admission=admission)
    states = random_run(pool, sched, random.Random(seed))
    assert {"waiting", "prefilling", "decoding", "finished"} <= states, states


@pytest.mark.parametrize("mode, hbm_caching", [("inclusive", True), ("exclusive", True), ("exclusive", False)])
def test_random_aborts_with_memory_tiers(mode, hbm_caching):
    """The same with host and SSD tiers below HBM and response KV kept: the tiers' bookkeeping
    (plans, copies down, releases) survives aborts."""
    c = build_core(CoreSettings(capacity_blocks=40,
                                knobs=EngineKnobs(token_budget=64, max_running=6, response_kv="keep",
                                                  tiers=TierSettings(host_blocks=30, ssd_blocks=30, mode=mode,
                                                                     hbm_caching=hbm_caching, fetch="always"))), COST)
    states = random_run(c.pool, c.scheduler, random.Random(7), responses=True)
    assert {"waiting", "prefilling", "decoding"} <= states, states
