import math
import random

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, PoolCapacityError
from replica.core.sched.sched_types import ContextLengthError, max_model_len_for
from replica.core.sched.scheduler import QueueFullError, SchedRequest, Scheduler, SchedulerSettings
from shared.costmodel import StepWork
from shared.errors import InputError
from tests.support.sched import COST, drain, make, req


def test_single_request_timeline():
    pool, sched = make()
    r = req(1, 10, tail=5, out=4)
    sched.submit(r)
    results, end = drain(sched, horizon=0.0)  # horizon=now: one decode step at a time
    prefill = COST.prefill_time(165, 0)
    assert results[0].prefill_tokens == 165
    assert r.t_first_token == pytest.approx(prefill)
    # 3 more tokens, one decode step each, batch of one holding 165 + generated tokens
    decode = sum(COST.decode_step_time(1, 165 + g) for g in (1, 2, 3))
    assert r.t_finished == pytest.approx(prefill + decode)
    assert [x.steps for x in results] == [1, 1, 1, 1]
    assert pool.evictable == 10  # released


def test_chunked_prefill_respects_the_token_budget():
    pool, sched = make(token_budget=100)
    r = req(1, 15, out=1)  # 240 tokens -> chunks of 100, 100, 40
    sched.submit(r)
    results, _ = drain(sched)
    assert [x.prefill_tokens for x in results] == [100, 100, 40]
    expected = COST.prefill_time(100, 0) + COST.prefill_time(100, 100) + COST.prefill_time(40, 200)
    assert r.t_first_token == pytest.approx(expected)
    assert r.t_finished == r.t_first_token  # one output token: done at the first token


def test_cached_prefix_only_prefills_the_rest():
    pool, sched = make()
    sched.submit(req(1, 8, out=1))
    drain(sched)
    second = req(2, 12, tail=7, out=1)
    sched.submit(second)
    results, _ = drain(sched)
    assert second.cached_tokens == 8 * 16
    assert results[0].prefill_tokens == 4 * 16 + 7
    assert second.t_first_token == pytest.approx(COST.prefill_time(71, 128))


def test_fully_cached_prompt_computes_its_last_block_again():
    # vLLM caps a hit at the prompt less one token (the last is run for its logits) in whole blocks:
    # a 64-token prompt cached whole hits 3 blocks and computes the 4th
    pool, sched = make()
    sched.submit(req(1, 4, out=1))
    drain(sched)
    again = req(2, 4, out=1)
    sched.submit(again)
    results, _ = drain(sched)
    assert results[0].prefill_tokens == 16 and again.cached_tokens == 48


def test_admission_waits_for_pinned_blocks():
    pool, sched = make(capacity=20)
    first = req(1, 15, out=5, base=0)
    second = req(2, 15, out=1, base=100)
    sched.submit(first)
    sched.submit(second)
    res = sched.step(0.0, horizon=0.0)
    assert sched.num_running == 1 and sched.num_waiting == 1  # 15 + 15 > 20 while first is pinned
    drain(sched, res.duration)
    assert second.t_admitted >= first.t_finished


def test_decode_fast_forward_matches_single_steps():
    _, a = make()
    _, b = make()
    ra, rb = req(1, 4, out=50), req(1, 4, out=50)
    a.submit(ra)
    b.submit(rb)
    res_a, _ = drain(a, horizon=float("inf"))
    res_b, _ = drain(b, horizon=0.0)
    assert len(res_a) == 2 and len(res_b) == 50
    assert ra.t_finished == pytest.approx(rb.t_finished, rel=1e-3)


def test_bad_input_and_limits():
    with pytest.raises(InputError) as err:
        SchedulerSettings(token_budget=0)
    assert err.value.field == "token_budget"
    pool, sched = make(capacity=10, max_waiting=1)
    with pytest.raises(PoolCapacityError):
        sched.submit(req(1, 11))
    sched.submit(req(2, 2))
    with pytest.raises(QueueFullError):
        sched.submit(req(3, 2))
    with pytest.raises(InputError) as err:
        SchedulerSettings(admission="lifo")
    assert err.value.field == "scheduler"


# ---- decode KV takes blocks; vLLM's recompute preemption ---------------------------------

def test_decode_fills_blocks_and_the_latest_admitted_is_preempted_when_none_is_left():
    """Capacity 10 blocks of 16 tokens. A and B (4 blocks = 64 tokens each, 20 tokens out) are
    admitted together in step 0 and prefill (8 blocks held, first tokens). Each decode step writes
    one token's KV: token 1 (65 tokens) needs a 5th block each (step 1 takes the last 2 free
    blocks), token 17 (81 tokens) a 6th: none is left, so the run of step 1 stops after 16 decode
    steps (tick 16). Step 2: A (admitted first) needs its block, B (admitted last) is preempted
    with 17 tokens generated, A gets the block, nothing is admitted, and A decodes its last 3
    tokens and finishes. Step 3: B is re-admitted (its 4 prompt blocks are still cached), takes
    2 blocks for its 81 tokens and recomputes its 17 generated tokens, which yields its 18th (vLLM
    samples after a recompute as after any prefill); 2 decode steps finish it."""
    pool, sched = make(capacity=10)
    a, b = req(1, 4, out=20, base=0), req(2, 4, out=20, base=100)
    sched.submit(a)
    sched.submit(b)
    res = [sched.step(0.0)]
    assert res[0].first_tokens == [a, b] and pool.private == 0
    res.append(sched.step(res[0].duration))
    assert res[1].steps == 16 and pool.private == 2 and pool.room == 0
    res.append(sched.step(sum(r.duration for r in res)))
    assert (b.preemptions, b.generated, [x.rid for x in sched.waiting]) == (1, 17, [2])
    assert a.preemptions == 0 and res[2].steps == 3 and res[2].finished == [a] and a.generated == 20
    res.append(sched.step(sum(r.duration for r in res)))
    assert b.cached_tokens == 64 and b.extra_blocks == 2 and res[3].prefill_tokens == 17
    assert res[3].first_tokens == []  # no second first token
    now = sum(r.duration for r in res)
    while sched.has_work():
        step = sched.step(now)
        now += step.duration
        res.append(step)
    assert res[-1].finished == [b] and b.generated == 20 and sum(r.steps for r in res[4:]) == 2
    assert sched.stats()["preemptions"] == 1 and sched.stats()["admissions"] == 3
    assert pool.private == 0 and not pool.pin_counts


def test_decode_blocks_evict_cached_ones_before_anyone_is_preempted():
    pool, sched = make(capacity=7)
    sched.submit(req(1, 3, out=1, base=500))  # leaves 3 cached blocks behind
    drain(sched)
    r = req(2, 4, tail=5, out=30)  # 69 tokens: 4 hashed blocks + the partial 5th, then 99 tokens: 7 blocks
    sched.submit(r)
    results, _ = drain(sched)
    assert sched.stats()["preemptions"] == 0 and r.generated == 30
    assert pool.metrics.evictions == 3 and pool.used == 4 and pool.private == 0  # all 3 cached blocks went


def test_a_request_whose_output_could_never_fit_is_refused():
    pool, sched = make(capacity=10)
    sched.submit(req(1, 8, out=33))  # 128 + 32 tokens: exactly 10 blocks
    with pytest.raises(PoolCapacityError) as err:
        sched.submit(req(2, 8, out=34))  # 161 tokens: 11 blocks
    assert (err.value.field, err.value.need) == ("max_tokens", 11)
    drain(sched)
    # never cut short (vLLM stops at max_model_len only when max_tokens was left to it): refused, counted
    with pytest.raises(PoolCapacityError):
        sched.submit(req(3, 8, tail=3, out=100))
    assert sched.stats()["refused"] == 2 and not sched.has_work()


def test_vllm_length_rule_refuses_prompt_plus_max_tokens_over_max_model_len():
    pool, sched = make(capacity=100, max_model_len=160)
    ok = req(1, 8, tail=2, out=30)  # 130 + 30 = 160 tokens: at the limit
    sched.submit(ok)
    with pytest.raises(ContextLengthError) as err:
        sched.submit(req(2, 8, tail=2, out=31))  # 161 tokens
    assert (err.value.field, err.value.limit, err.value.length) == ("max_tokens", 160, 161)
    assert "max_model_len) is 160 tokens" in str(err.value) and "asks for 161 (130 in the prompt" in str(err.value)
    assert sched.stats()["refused"] == 1
    drain(sched)
    assert ok.generated == 30
    assert max_model_len_for(8192, 100, 16) == 1600 and max_model_len_for(1000, 100, 16) == 1000


# ---- reorder (seed 001, FlashGen) ----------------------------------------------------

def steps_until(sched, done, now=0.0, limit=100):
    """Run one step at a time (horizon = now): (the index of the step after which ``done(result)``
    first holds, the time then)."""
    for k in range(limit):
        res = sched.step(now, now)
        now += res.duration
        if done(res):
            return k, now
    raise AssertionError("not within the limit")


def head_of_line(policy):
    """Capacity 14 blocks. R (6 blocks + 5 tokens: 7 blocks, and its 3 tokens out fit in the 7th)
    runs; the head H (10 blocks, 1 token) does not fit in the 7 free blocks; S (4 blocks + 5 tokens:
    5 blocks, its 5 tokens out fit in the 5th) behind it would, leaving the 2 blocks reorder keeps in
    reserve for the running requests' next decode blocks (R's and S's)."""
    pool, sched = make(capacity=14, admission=policy)
    r, h, s = req(1, 6, tail=5, out=3, base=0), req(2, 10, out=1, base=100), req(3, 4, tail=5, out=5, base=200)
    for x in (r, h, s):
        sched.submit(x)
    return pool, sched, r, h, s


def test_fcfs_head_of_line_blocking():
    pool, sched, r, h, s = head_of_line("fcfs")
    # step 0: R prefills (first token), steps 1-2 decode its 2 more tokens, it ends with step 2;
    # step 3: H runs (1 token, done); step 4: S prefills, steps 5-8 decode its 4 more tokens.
    assert steps_until(sched, lambda res: s in res.finished)[0] == 8
    assert sched.stats()["preemptions"] == 0 and sched.stats()["promotions"] == 0


def test_reorder_fills_idle_memory_then_preempts_for_the_head():
    pool, sched, r, h, s = head_of_line("reorder")
    told = []
    sched.on_preempt = lambda x, now: told.append((x.rid, x.alloc))  # where a host tier would keep its KV
    res0 = sched.step(0.0, 0.0)
    # S is admitted behind the blocked head into the 4 idle blocks and prefills with R.
    assert res0.prefill_tokens == 101 + 69 and res0.first_tokens == [r, s] and sched.num_waiting == 1
    # Steps 1-2 decode both; R ends with step 2. Step 3: after R, only S (5 lent blocks) stands
    # between H (10) and 14 blocks: S is preempted with 3 tokens generated, H runs in step 3 as
    # under fcfs (no later), and S waits again behind it.
    k, now = steps_until(sched, lambda res: h in res.finished, res0.duration)
    assert k == 2  # steps 1, 2, 3
    assert s.preemptions == 1 and s.generated == 3 and sched.num_waiting == 1
    assert told == [(3, None)]  # told after its blocks were released
    # H evicted R's 6 blocks (LRU: released before S's) into the 4 free ones. Step 4: S re-admitted
    # hits its 4 blocks and recomputes its 5-token tail and its 3 tokens, which yields token 4; no
    # second first token; step 5 decodes token 5: S is done 3 steps before fcfs.
    res4 = sched.step(now, now)
    assert s.cached_tokens == 64 and res4.prefill_tokens == 5 + 3 and res4.first_tokens == []
    assert steps_until(sched, lambda res: s in res.finished, now + res4.duration)[0] == 0  # step 5
    st = sched.stats()
    assert (st["preemptions"], st["promotions"], st["admissions"]) == (1, 1, 4)
    assert (st["prefill_tokens"], st["readmission_prefill_tokens"]) == (101 + 69 + 160 + 8, 8)
    # S's partial 5th block took one of H's cached blocks: 13 resident, none pinned
    assert s.generated == 5 and pool.evictable == pool.used == 13 and pool.private == 0 and not sched.has_work()


def test_reorder_preempts_a_prefilling_request_and_requeues_it_in_arrival_order():
    pool, sched = make(capacity=12, token_budget=40, admission="reorder")  # S lent 4, 2 kept in reserve
    r, h, s = req(1, 6, out=1, base=0), req(2, 9, out=1, base=100), req(3, 4, out=1, base=200)
    late = req(4, 4, out=1, base=300)  # 9 + 4 > 12: waits while H runs
    for x in (r, h, s):
        sched.submit(x)
    sched.step(0.0, 0.0)  # R 40 of 96 tokens; S admitted behind H, not reached by the budget
    sched.step(0.0, 0.0)  # R 40 more
    sched.step(0.0, 0.0)  # R's last 16 and 24 of S's 64: R done (one token out)
    assert s.segments == [[24, 40]] and r.t_finished >= 0
    sched.submit(late)
    sched.step(0.0, 0.0)  # H takes S's lent blocks: S loses its 24 tokens and waits behind H
    assert s.preemptions == 1 and s.segments == [] and s.generated == 0
    assert [x.rid for x in sched.waiting] == [3, 4]
    assert sched.queued_prefill_tokens == (144 - 40) + 64 + 64  # H's rest, S again, late


class NaiveReorder(Scheduler):
    """Reordering without taking lent memory back: what FlashGen's preemption prevents."""

    def _reclaim_for(self, head, now):
        return False


def adversarial(cls, steps):
    """Capacity 100 blocks, budget B = 256 tokens, M = 16 running. Ra (30 blocks, 10 tokens
    out) and Rb (30 blocks, 40 tokens out) run; the head H needs 60 blocks; one small request
    (10 blocks, 30 tokens out) arrives before every step and fits wherever 10 blocks are idle."""
    pool = BlockPool(100, make_policy("lru"), block_size=16, emit_events=False)
    sched = cls(pool, COST, SchedulerSettings(token_budget=256, max_running=16, admission="reorder"))
    ra, rb, head = req(1, 30, out=10, base=1000), req(2, 30, out=40, base=2000), req(3, 60, out=2, base=3000)
    for x in (ra, rb, head):
        sched.submit(x)
    now, admitted, preempted = 0.0, None, 0
    for k in range(steps):
        sched.submit(req(100 + k, 10, out=30, base=10_000 * (k + 1), t=now))
        res = sched.step(now, now)
        now += res.duration
        if admitted is None and head.t_admitted >= 0:
            admitted, preempted = k, sched.preemptions
    return sched, admitted, preempted


def test_reorder_is_starvation_free_under_adversarial_arrivals():
    # The bound (see Scheduler._reclaim_for): once H is the head (step s0 = 0), only requests
    # admitted in arrival order before it (Ra, Rb) hold memory H cannot take back; every step
    # gives prefill at least B - M tokens, in admission order, so they have their first tokens
    # within ceil(Q0 / (B - M)) steps (Q0 = 960 prompt tokens left at s0) and finish within
    # max output (40) more: H is admitted by step s0 + ceil(960 / 240) + 40 = 44, whatever arrives.
    bound = math.ceil((480 + 480) / (256 - 16)) + 40
    sched, admitted, preempted = adversarial(Scheduler, 120)
    # Hand-worked: Ra prefills in steps 0-1, decodes 9 more tokens in steps 2-10 (its 31st block
    # for them) and ends; the small requests lent the idle blocks hold what H needs beyond Rb's
    # 31: 3 are preempted and H is admitted in step 11.
    assert admitted == 11 <= bound and preempted == 3
    # Later, overloaded (a request arrives every step), running requests' decode KV runs out of
    # blocks now and then: the latest admitted is preempted (vLLM's recompute preemption).
    assert sched.stats()["preemptions"] > 3
    # Without taking lent memory back, small requests refill every block Ra and Rb free: H starves.
    _, never, _ = adversarial(NaiveReorder, 120)
    assert never is None


@pytest.mark.parametrize("policy", ["reorder", "fcfs"])
@pytest.mark.parametrize("seed", range(4))
def test_bookkeeping_survives_random_traffic(seed, policy):
    """Random sizes and arrivals on a tight pool (decode KV runs out of blocks, reorder lends and
    takes back): every request runs to its last token, once; nothing stays pinned, held or
    queued; the decode aggregates return to zero."""
    rng = random.Random(seed)
    pool, sched = make(capacity=40, token_budget=64, max_running=6, admission=policy)
    reqs, now = [], 0.0
    for k in range(120):
        if rng.random() < 0.6:
            r = req(k, rng.randint(1, 30), tail=rng.randint(0, 15), out=rng.randint(1, 40),
                    base=rng.choice([0, 1000 * (k + 1)]), t=now)  # base 0: shares a prefix with others
            reqs.append(r)
            sched.submit(r)
        res = sched.step(now, now)
        now += res.duration
    while sched.has_work():
        now += sched.step(now, now).duration
    # t_admitted is the last admission: after the first token for a request preempted while decoding
    assert all(r.t_finished >= max(r.t_first_token, r.t_admitted) >= r.arrival for r in reqs)
    assert all(r.t_first_token >= r.t_admitted or r.preemptions for r in reqs)
    assert all(r.generated == r.output_tokens for r in reqs)
    assert sched.stats()["preemptions"] == sum(r.preemptions for r in reqs) > 0
    assert len(pool.pin_counts) == 0 and sched.queued_prefill_tokens == 0 and not sched._lent
    assert pool.private == 0 and all(r.extra_blocks == 0 for r in reqs)
    assert (sched._dec_input, sched._dec_base, len(sched._decoders)) == (0, 0, 0)


@pytest.mark.parametrize("policy", ["fcfs", "reorder"])
@pytest.mark.parametrize("seed", range(2))
def test_decode_blocks_follow_the_tokens_at_every_step(seed, policy):
    """Random traffic with random horizons (so decode runs are fast-forwarded and their blocks
    handed out ahead): after every step each request holds exactly the blocks its KV fills, as
    vLLM allocates them: a prefilling one its prompt (and, re-admitted, its generated tokens); a
    decoding one, with g tokens generated, prompt + g - 1 tokens (the next step writes token g's
    KV), or + g right after a re-admission's prefill wrote it; the pool's private count is their sum."""
    rng = random.Random(seed)
    pool, sched = make(capacity=60, token_budget=64, max_running=8, admission=policy)
    need, now = sched.decode_kv.need, 0.0
    for k in range(300):
        if rng.random() < 0.5:
            sched.submit(req(k, rng.randint(1, 20), tail=rng.randint(0, 15), out=rng.randint(1, 200),
                             base=rng.choice([0, 1000 * (k + 1)]), t=now))
        now += sched.step(now, now + rng.random() * 0.05).duration
        for r in sched.running:
            if r.segments:
                assert r.extra_blocks == need(r, r.generated if r.resumed else 0)
            else:
                g = sched._tick - r.base
                assert r.extra_blocks == need(r, g - 1) or (r.preemptions and r.extra_blocks == need(r, g))
        assert sum(r.extra_blocks for r in sched.running) == pool.private
        assert len(pool.pin_counts) + pool.private <= pool.capacity
    assert sched.preemptions > 0


def test_a_step_is_one_forward_over_its_chunks_and_decoders():
    """Two decoding requests and a new 64-token prompt in one step: priced as one forward."""
    pool, sched = make()
    a, b = req(1, 4, out=10), req(2, 4, out=10, base=100)
    sched.submit(a)
    sched.submit(b)
    first = sched.step(0.0, horizon=0.0)  # both prompts in one forward: 128 tokens
    assert first.duration == pytest.approx(COST.step_time(StepWork.of([(64, 0), (64, 0)])))
    c = req(3, 4, out=2, base=200)
    sched.submit(c)
    mixed = sched.step(first.duration, horizon=0.0)
    # a and b decode their second token (65 KV tokens each: prompt and first token), c prefills
    assert mixed.prefill_tokens == 64 and mixed.duration == pytest.approx(
        COST.step_time(StepWork.of([(64, 0)], decoders=2, decode_kv=2 * 65)))
    assert mixed.duration < COST.prefill_time(64) + COST.decode_step_time(2, 130)  # not two forwards


def test_sixteen_simultaneous_short_prompts_take_about_one_long_prompts_time():
    _, one = make()
    long = req(1, 64, out=1)
    one.submit(long)
    drain(one)
    _, many = make()
    short = [req(i, 4, out=1, base=1000 * i) for i in range(16)]
    for r in short:
        many.submit(r)
    drain(many)
    assert max(r.t_first_token for r in short) <= long.t_first_token  # one forward, less attention


def test_a_partial_last_block_is_priced_by_its_tokens():
    """Mooncake: 600 tokens in two 512-token ids, the second covering 88 tokens."""
    pool = BlockPool(100, make_policy("lru"), block_size=512, emit_events=False)
    sched = Scheduler(pool, COST, SchedulerSettings())
    r = SchedRequest(1, [7, 8], 600, 1, 0.0)
    sched.submit(r)
    res = sched.step(0.0)
    assert res.prefill_tokens == 600 and res.duration == pytest.approx(COST.prefill_time(600, 0))
    again = SchedRequest(2, [7, 9], 600, 1, res.duration)  # the first block cached: 88 new tokens
    sched.submit(again)
    assert sched.step(res.duration).prefill_tokens == 88
    assert again.cached_tokens == 512
