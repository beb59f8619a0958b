"""vLLM v0's step rule (``step_rule="v0"``), hand-worked: a step prefills whole prompts or decodes,
never both; prefills first whenever a waiting prompt fits the step's token budget and max_running."""

import pytest

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from shared.costmodel import CostModel, StepWork
from shared.errors import InputError

COST = CostModel.from_names("llama-3-8b", "h100")


def make(capacity=1000, **kw):
    pool = BlockPool(capacity, make_policy("lru"), block_size=16, emit_events=False)
    return pool, Scheduler(pool, COST, SchedulerSettings(step_rule="v0", **kw))


def req(rid, n_blocks, out=3, base=0, t=0.0):
    return SchedRequest(rid, [base + i for i in range(n_blocks)], n_blocks * 16, out, t)


def test_a_step_prefills_or_decodes_never_both():
    _, sched = make(token_budget=256)
    a = req(1, 4, out=3)  # 64 tokens
    sched.submit(a)
    s1 = sched.step(0.0, 0.0)  # prefill only: a's whole prompt, its first token
    assert s1.prefill_tokens == 64 and s1.first_tokens == [a]
    assert s1.duration == pytest.approx(COST.step_time(StepWork.of([(64, 0)])))
    b = req(2, 4, out=3, base=100, t=s1.duration)
    sched.submit(b)
    s2 = sched.step(s1.duration, s1.duration)  # b fits: a prefill step of b alone; a does not decode
    assert s2.prefill_tokens == 64 and s2.first_tokens == [b] and s2.decoded == []
    assert s2.duration == pytest.approx(COST.step_time(StepWork.of([(64, 0)])))
    s3 = sched.step(s1.duration + s2.duration, s1.duration + s2.duration)  # nothing waits: both decode
    assert s3.prefill_tokens == 0 and sorted(r.rid for r, n in s3.decoded) == [1, 2]
    assert s3.duration == pytest.approx(COST.decode_step_time(2, 130))  # 65 tokens of KV each


def test_v1_mixes_the_same_requests_in_one_step():
    pool = BlockPool(1000, make_policy("lru"), block_size=16, emit_events=False)
    sched = Scheduler(pool, COST, SchedulerSettings(token_budget=256))
    a = req(1, 4, out=3)
    sched.submit(a)
    s1 = sched.step(0.0, 0.0)
    sched.submit(req(2, 4, out=3, base=100, t=s1.duration))
    s2 = sched.step(s1.duration, s1.duration)
    assert s2.prefill_tokens == 64 and [r.rid for r, n in s2.decoded] == [1]  # a decodes beside b's prefill


def test_whole_prompts_within_the_token_budget_then_the_next_step():
    # budget 160: 64 + 64 fit (128), the third 64-token prompt would make 192: it waits for the next
    # prefill step, which comes before any decode (a waiting prompt fits)
    _, sched = make(token_budget=160)
    reqs = [req(i, 4, out=2, base=100 * i) for i in range(3)]
    for r in reqs:
        sched.submit(r)
    s1 = sched.step(0.0, 0.0)
    assert s1.prefill_tokens == 128 and s1.first_tokens == reqs[:2] and sched.num_waiting == 1
    assert not sched._blocked  # it waits for the step's room, not for memory
    s2 = sched.step(s1.duration, s1.duration)
    assert s2.prefill_tokens == 64 and s2.first_tokens == [reqs[2]] and s2.decoded == []
    s3 = sched.step(s1.duration + s2.duration, s1.duration + s2.duration)
    assert s3.prefill_tokens == 0 and len(s3.finished) == 3  # one decode step: each one's second token


def test_max_running_bounds_admission():
    _, sched = make(token_budget=1024, max_running=2)
    for i in range(3):
        sched.submit(req(i, 4, out=5, base=100 * i))
    s1 = sched.step(0.0, 0.0)
    assert s1.prefill_tokens == 128 and sched.num_waiting == 1
    s2 = sched.step(s1.duration, s1.duration)  # the third cannot run: the two decode
    assert s2.prefill_tokens == 0 and len(s2.decoded) == 2


def test_a_head_that_does_not_fit_memory_lets_decodes_run_and_is_counted_blocked():
    # 10 blocks: a takes 4 (+1 as it decodes), the head b needs 8: it waits for memory while a decodes
    _, sched = make(capacity=10, token_budget=512)
    a, b = req(1, 4, out=20), req(2, 8, out=2, base=100)
    sched.submit(a)
    s1 = sched.step(0.0, 0.0)
    sched.submit(b)
    s2 = sched.step(s1.duration, s1.duration)
    assert s2.prefill_tokens == 0 and [r.rid for r, n in s2.decoded] == [1] and sched._blocked
    assert sched.blocked_s == pytest.approx(s2.duration) and sched.queued_s == pytest.approx(s2.duration)


def test_a_prompt_longer_than_a_step_is_refused():
    _, sched = make(token_budget=64)
    with pytest.raises(InputError, match="max_num_batched_tokens 64"):
        sched.submit(req(1, 5))  # 80 tokens
    assert sched.refused == 1


def test_the_step_rule_is_checked():
    with pytest.raises(InputError, match="step_rule"):
        SchedulerSettings(step_rule="v2")
