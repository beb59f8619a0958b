"""The reorder scheduler as FlashGen (Jeong and Ahn, ASPLOS 2025) describes it: loans beyond a
reserve, a bound on loans per request, preempted requests' KV kept (in HBM as vLLM v1 keeps full
blocks, and in the host tier, decode blocks copied as they fill), vLLM v0's watermark, and the
statistics the FlashGen benchmark reports."""

import random

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from replica.core.tiers.stack import TierSettings, TierStack
from shared.costmodel import CostModel
from shared.errors import InputError

COST = CostModel.from_names("llama-3-8b", "h100")


def make(capacity, tiers=None, keep=True, **kw):
    pool = BlockPool(capacity, make_policy("lru"), block_size=16, emit_events=False)
    stack = TierStack(tiers, pool, COST.block_bytes(16), lambda depth: 1.0) if tiers is not None else None
    return pool, stack, Scheduler(pool, COST, SchedulerSettings(**kw), tiers=stack, keep_response_kv=keep)


def req(rid, n_blocks, tail=0, out=3, base=0, t=0.0, response=0):
    """``response``: hashes of the full blocks its output completes (1_000_000 + base + j)."""
    r = SchedRequest(rid, [base + i for i in range(n_blocks)], n_blocks * 16 + tail, out, t)
    r.response_hashes = [1_000_000 + base + j for j in range(response)]
    return r


def run_steps(sched, n, now=0.0):
    for _ in range(n):
        now += sched.step(now, now).duration
    return now


def test_reorder_lends_only_beyond_one_block_per_running_request():
    # Capacity 12: R (7 blocks) runs, the head H (8) does not fit in the 5 idle blocks; S (5 blocks)
    # would fill them all, leaving nothing for R's and S's next decode blocks: it is not lent them.
    # T (3 blocks) leaves 2, one each: it is.
    pool, _, sched = make(12, admission="reorder")
    r, h = req(1, 6, tail=5, out=3, base=0), req(2, 8, out=1, base=100)
    s, t = req(3, 4, tail=5, out=5, base=200), req(4, 2, tail=5, out=5, base=300)
    for x in (r, h, s, t):
        sched.submit(x)
    sched.step(0.0, 0.0)
    assert [x.rid for x in sched.running] == [1, 4] and t.loans == 1 and s.loans == 0
    assert pool.room == 2 and sched.promotions == 1


def random_reorder(seed, max_loans):
    """Random traffic on a tight pool (60 blocks, 8 running): a third of the requests are big
    (30-50 blocks) and block the queue, the rest small (1-6 blocks) and are lent memory behind them."""
    rng = random.Random(seed)
    pool, _, sched = make(60, admission="reorder", max_loans=max_loans, token_budget=128, max_running=8)
    reqs, now = [], 0.0
    for k in range(300):
        if rng.random() < 0.5:
            n = rng.randint(30, 50) if rng.random() < 0.3 else rng.randint(1, 6)
            r = req(k, n, tail=rng.randint(0, 15), out=rng.randint(1, 30), base=1000 * (k + 1), t=now)
            reqs.append(r)
            sched.submit(r)
        now += sched.step(now, now).duration
    while sched.has_work():
        now += sched.step(now, now).duration
    assert all(r.generated == r.output_tokens for r in reqs) and pool.pinned == pool.private == 0
    return reqs, sched


@pytest.mark.parametrize("seed", [2, 3, 4, 5])
def test_no_request_is_lent_memory_more_than_max_loans_times(seed):
    # unbounded, one request of each of these runs is lent memory (and taken back) more than twice
    reqs, _ = random_reorder(seed, 100)
    assert max(r.loans for r in reqs) >= 3
    for bound in (1, 2):
        reqs, sched = random_reorder(seed, bound)
        assert max(r.loans for r in reqs) == bound
        assert sum(r.loans for r in reqs) == sched.promotions


def test_a_request_at_its_bound_waits_for_its_turn():
    pool, _, sched = make(12, admission="reorder", max_loans=1)
    r, h = req(1, 6, tail=5, out=3, base=0), req(2, 8, out=1, base=100)
    t = req(4, 2, tail=5, out=5, base=300)
    t.loans = 1  # lent once already (and preempted)
    for x in (r, h, t):
        sched.submit(x)
    sched.step(0.0, 0.0)
    assert [x.rid for x in sched.running] == [1] and sched.promotions == 0


def test_settings_refuse_bad_bounds():
    for kw in ({"max_loans": 0}, {"watermark": -0.1}, {"watermark": 0.9}, {"watermark": float("nan")}):
        with pytest.raises(InputError):
            SchedulerSettings(**kw)


def test_watermark_keeps_a_fraction_of_the_pool_free_at_admission():
    # vLLM v0: admit only if free - needed >= watermark x capacity. 100 blocks, watermark 0.05: a
    # 90-block request is admitted (10 left); a 96-block one would leave 4 < 5 and waits (vLLM v0
    # too: it fits the pool, so it is not refused); without the watermark it is admitted.
    pool, _, sched = make(100, watermark=0.05)
    sched.submit(req(1, 90, out=1))
    sched.step(0.0, 0.0)
    assert sched.admissions == 1
    pool2, _, sched2 = make(100, watermark=0.05)
    sched2.submit(req(1, 96, out=1))
    for _ in range(3):
        sched2.step(0.0, 0.0)
    assert sched2.admissions == 0 and sched2.num_waiting == 1
    _, _, plain = make(100)
    plain.submit(req(1, 96, out=1))
    plain.step(0.0, 0.0)
    assert plain.admissions == 1


def squeeze(tiers=None, keep=True):
    """Capacity 10, 16-token blocks. A (2 blocks, 60 tokens out: 4 more blocks as it decodes) and B
    (3 blocks + 8 tokens, 40 out) are admitted together. In step 34 A needs its 7th block and none
    is free: B, admitted last, is preempted, having generated 33 tokens into 3 blocks beyond its
    prompt: the first two (its 2 response blocks) full. A's next block (step 50) evicts the least
    recently used cached block, B's first prompt block; A ends in step 60, B is re-admitted in 61."""
    pool, stack, sched = make(10, tiers=tiers, keep=keep, token_budget=512)
    a = req(1, 2, out=60, base=0, response=4)
    b = req(2, 3, tail=8, out=40, base=100, response=2)
    for x in (a, b):
        sched.submit(x)
    return pool, stack, sched, a, b


def test_a_preempted_decoder_keeps_its_full_generated_blocks_cached():
    pool, _, sched, a, b = squeeze()
    now = run_steps(sched, 34)
    assert b.preemptions == 1 and b.generated == 33 and b.kept == 2
    assert all(h in pool.resident and not pool.is_pinned(h) for h in b.response_hashes)
    while sched.has_work():
        now += sched.step(now, now).duration
    # re-admitted: prompt blocks 1-2 and both response blocks hit; the evicted first block (16
    # tokens) and the 9 tokens of its partial last block are recomputed, not 56 + 33 - 48
    assert sched.readmission_prefill_tokens == 16 + 9 and b.generated == 40 and a.generated == 60
    assert pool.pinned == pool.private == 0


def test_without_kept_response_kv_a_preempted_decoder_recomputes_what_it_generated():
    pool, _, sched, a, b = squeeze(keep=False)
    run_steps(sched, 34)
    assert b.preemptions == 1 and b.kept == 0 and not any(h in pool.resident for h in b.response_hashes)
    now = run_steps(sched, 34)
    while sched.has_work():
        now += sched.step(now, now).duration
    # nothing it generated was kept (and its 3 prompt blocks alone leave A room to grow: all hit)
    assert sched.readmission_prefill_tokens == 56 + 33 - 48 and b.generated == 40


def test_decode_blocks_are_copied_to_host_as_they_fill_with_inclusive_tiers():
    tiers = TierSettings(host_blocks=100, mode="inclusive", fetch="always")
    pool, stack, sched, a, b = squeeze(tiers)
    host = stack.pool("host")
    now = 0.0
    seen = []
    while sched.has_work():
        now += sched.step(now, now).duration
        seen.append(sum(h in host.resident for h in a.response_hashes))
    # A's 4 response blocks reach host one at a time as decode fills them, before it finishes
    assert seen[-1] == 4 and sorted(set(seen)) == [0, 1, 2, 3, 4]
    assert all(h in host.resident for h in b.response_hashes)


def test_a_preempted_request_restores_from_the_host_copies_instead_of_recomputing():
    # As in the squeeze above, with an inclusive host tier: B's first prompt block, evicted from
    # HBM while B waited, and everything else it held are in host; its re-admission restores them
    # (the restore overlaps its prefill) and recomputes only the 9 tokens of its partial last block.
    tiers = TierSettings(host_blocks=100, mode="inclusive", fetch="always")
    pool, stack, sched, a, b = squeeze(tiers)
    now = run_steps(sched, 34)
    assert b.preemptions == 1 and b.kept == 2
    while sched.has_work():
        now += sched.step(now, now).duration
    assert sched.readmission_prefill_tokens == 9 and b.generated == 40
