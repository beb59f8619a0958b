import pytest

from replica.core.policies import make_policy
from replica.core.pool import BlockPool, PoolCapacityError
from replica.core.scheduler import QueueFullError, SchedRequest, Scheduler, SchedulerSettings
from shared.costmodel import CostModel
from shared.errors import InputError

COST = CostModel.from_names("llama-3-8b", "h100")


def make(capacity=1000, **kw):
    pool = BlockPool(capacity, make_policy("lru"), block_size=16, emit_events=False)
    return pool, Scheduler(pool, COST, SchedulerSettings(**kw))


def req(rid, n_blocks, tail=0, out=3, base=0, t=0.0):
    return SchedRequest(rid, [base + i for i in range(n_blocks)], n_blocks * 16 + tail, out, t)


def drain(sched, now=0.0, horizon=float("inf")):
    results = []
    while sched.has_work():
        res = sched.step(now, horizon)
        results.append(res)
        now += res.duration
    return results, now


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


def test_fully_cached_prompt_still_runs_one_token():
    pool, sched = make()
    sched.submit(req(1, 4, out=1))
    drain(sched)
    again = req(2, 4, out=1)
    sched.submit(again)
    results, _ = drain(sched)
    assert results[0].prefill_tokens == 1 and again.cached_tokens == 64


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
