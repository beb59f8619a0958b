"""Disaggregated P/D in the scheduler core, hand-worked: the prefill side holds a finished request's
blocks until its KV has crossed (``SchedRequest.hold``, ``Scheduler.release_held``), the decode side
reserves blocks for KV arriving from elsewhere (``Scheduler.reserve_remote``, replica/core/sched/admission.py)."""

import pytest

from replica.core.cache.pool import PoolCapacityError
from replica.core.sched.sched_types import ContextLengthError
from tests.support.sched import COST, drain, req
from tests.support.sched import make as make_scheduler


def make(capacity=100, **kw):
    return make_scheduler(capacity, **kw)


def warm(sched, n_blocks, base=0, rid=99):
    """Make ``n_blocks`` blocks from ``base`` resident (a finished request's prompt), unpinned."""
    sched.submit(req(rid, n_blocks, out=1, base=base))
    drain(sched)


# ---- the prefill side: hold and release_held ----------------------------------------------------


def test_a_held_prefill_request_keeps_its_blocks_pinned_until_release_held():
    pool, sched = make()
    r = req(1, 10, out=1)
    r.hold = True
    sched.submit(r)
    res = sched.step(0.0)
    assert res.prefill_tokens == 160 and res.first_tokens == [r] and res.finished == [r]
    assert r.t_finished == r.t_first_token == pytest.approx(COST.prefill_time(160, 0))
    assert not sched.has_work()
    assert pool.pinned == 10 and pool.evictable == 0 and r.alloc is not None
    sched.release_held(r, 5.0)
    assert pool.pinned == 0 and pool.evictable == 10 and all(h in pool.resident for h in range(10))
    assert r.alloc is None and not r.hold
    sched.release_held(r, 6.0)  # a second release is nothing
    assert pool.pinned == 0 and pool.evictable == 10


def test_a_held_request_with_a_partial_tail_gives_its_tail_back_at_the_finish():
    # the tail block is private (decode KV's): freed when the request finishes; the hashed ones wait
    pool, sched = make()
    r = req(1, 4, tail=5, out=1)
    r.hold = True
    sched.submit(r)
    (res,), _ = drain(sched)
    assert res.finished == [r] and pool.pinned == 4 and pool.private == 0
    sched.release_held(r, 1.0)
    assert pool.pinned == 0 and pool.evictable == 4


def test_held_blocks_are_hits_for_the_next_request():
    pool, sched = make()
    r = req(1, 8, out=1)
    r.hold = True
    sched.submit(r)
    drain(sched)
    second = req(2, 12, out=1)
    sched.submit(second)
    results, _ = drain(sched)
    assert second.cached_tokens == 128 and results[0].prefill_tokens == 64
    assert pool.pinned == 8  # r's, still held
    sched.release_held(r, 1.0)
    assert pool.pinned == 0


def test_held_blocks_take_room_until_released():
    pool, sched = make(capacity=20)
    r = req(1, 15, out=1)
    r.hold = True
    sched.submit(r)
    drain(sched)
    other = req(2, 10, out=1, base=100)
    sched.submit(other)
    res = sched.step(1.0)
    assert res.prefill_tokens == 0 and sched.num_waiting == 1  # 15 held + 10 > 20
    sched.release_held(r, 2.0)
    res = sched.step(2.0)
    assert res.prefill_tokens == 160 and res.finished == [other]


def test_release_held_of_a_request_never_admitted_is_nothing():
    pool, sched = make()
    sched.release_held(req(1, 4), 0.0)
    assert pool.pinned == 0 and pool.used == 0


# ---- the decode side: reserve, arrived, cancel --------------------------------------------------


def test_reserve_pins_the_prompts_blocks_hits_and_new():
    pool, sched = make()
    warm(sched, 4)  # blocks 0..3 resident
    requests = pool.metrics.requests
    r = req(1, 10, out=5)
    assert sched.reserve_remote(r, 1.0)
    assert sched.reserved_hits(r) == 4  # the decoder held them: not transferred
    assert r.alloc.hit_idx == [0, 1, 2, 3] and r.alloc.new_idx == [4, 5, 6, 7, 8, 9]
    assert pool.pinned == 10 and all(h in pool.resident for h in range(10))
    assert pool.metrics.requests == requests  # not a lookup the hit metrics count
    assert not sched.has_work() and sched.running == [] and sched.num_waiting == 0  # in no queue
    assert r.t_queued == 1.0


def test_held_blocks_before_reserve_is_zero():
    assert make()[1].reserved_hits(req(1, 4)) == 0


def test_reserve_on_a_cold_pool_holds_nothing_yet():
    pool, sched = make()
    r = req(1, 6, out=2)
    assert sched.reserve_remote(r, 0.0) and sched.reserved_hits(r) == 0
    assert pool.pinned == 6 and pool.metrics.requests == 0


def test_reserve_on_a_pool_too_full_returns_false_and_pins_nothing():
    pool, sched = make(capacity=20)
    running = req(1, 15, out=50, base=100)
    sched.submit(running)
    sched.step(0.0)  # prefilled, decoding: its 15 blocks pinned
    pinned, private = pool.pinned, pool.private
    r = req(2, 10, out=2)
    assert not sched.reserve_remote(r, 1.0)
    assert r.alloc is None and pool.pinned == pinned and pool.private == private
    assert all(h not in pool.resident for h in range(10))


def test_reserve_of_a_request_that_could_never_fit_raises():
    pool, sched = make(capacity=8)
    with pytest.raises(PoolCapacityError):
        sched.reserve_remote(req(1, 9), 0.0)
    assert sched.refused == 1 and pool.pinned == 0


def test_arrived_computes_the_last_token_and_then_decodes():
    pool, sched = make()
    r = req(1, 10, out=4)
    assert sched.reserve_remote(r, 0.0)
    admissions, prefill_tokens = sched.admissions, sched.prefill_tokens
    sched.remote_arrived(r, 1.0)
    assert sched.has_work() and sched.running == [r]
    assert sched.admissions == admissions + 1 and sched.prefill_tokens == prefill_tokens + 1
    assert r.cached_tokens == 159 and r.t_admitted == 1.0
    res = sched.step(1.0, horizon=1.0)
    assert res.prefill_tokens == 1 and res.first_tokens == [r] and res.finished == []
    assert res.duration == pytest.approx(COST.prefill_time(1, 159))
    assert r.t_first_token == 1.0 + res.duration and r.generated == 1
    results, _ = drain(sched, 1.0 + res.duration, horizon=0.0)
    assert [x.steps for x in results] == [1, 1, 1] and results[-1].finished == [r]
    assert all(x.prefill_tokens == 0 for x in results)
    assert r.generated == 4 and r.t_finished == 1.0 + sum(x.duration for x in [res, *results])
    assert pool.pinned == 0 and pool.private == 0 and pool.evictable == 10


def test_arrived_with_a_partial_tail_and_decode_blocks():
    # 4 blocks + 5 tokens: the tail block is private; decoding 30 tokens crosses into two more
    pool, sched = make()
    r = req(1, 4, tail=5, out=30)
    assert sched.reserve_remote(r, 0.0)
    assert pool.pinned == 4 and pool.private == 1
    sched.remote_arrived(r, 0.0)
    results, _ = drain(sched)
    assert results[0].prefill_tokens == 1 and results[0].first_tokens == [r]
    assert sum(x.prefill_tokens for x in results) == 1
    assert r.generated == 30 and results[-1].finished == [r]
    assert pool.pinned == 0 and pool.private == 0


def test_arrived_beside_a_local_request():
    # the arrived request joins the prefill queue at once, ahead of a waiting one admitted in the step:
    # one forward takes both
    pool, sched = make()
    local = req(1, 4, out=1, base=100)
    sched.submit(local)
    r = req(2, 10, out=1)
    assert sched.reserve_remote(r, 0.0)
    sched.remote_arrived(r, 0.0)
    res = sched.step(0.0)
    assert res.prefill_tokens == 65 and res.first_tokens == [r, local] and res.finished == [r, local]
    assert pool.pinned == 0


def test_cancel_gives_the_blocks_back_and_drops_those_inserted_for_it():
    pool, sched = make()
    warm(sched, 4)
    r = req(1, 10, out=5)
    assert sched.reserve_remote(r, 1.0)
    sched.cancel_remote(r, 2.0)
    assert r.alloc is None and pool.pinned == 0
    assert all(h in pool.resident for h in range(4))  # the hits stay cached
    assert all(h not in pool.resident for h in range(4, 10))  # their KV never came
    assert pool.evictable == 4 and not sched.has_work()
    sched.cancel_remote(r, 3.0)  # a second cancel is nothing
    assert pool.pinned == 0 and pool.evictable == 4


def test_cancel_frees_the_private_tail_block():
    pool, sched = make()
    r = req(1, 4, tail=5, out=5)
    assert sched.reserve_remote(r, 0.0)
    assert pool.private == 1
    sched.cancel_remote(r, 1.0)
    assert pool.pinned == 0 and pool.private == 0


def test_a_reserved_request_is_never_preempted():
    # the running request needs a decode block at its 65th token; the pool is full (its 4 and the
    # reservation's 6, admitted after it): it preempts itself, never the reservation
    pool, sched = make(capacity=10)
    running = req(1, 4, out=20, base=100)
    sched.submit(running)
    res = sched.step(0.0, horizon=0.0)
    assert res.first_tokens == [running]
    r = req(2, 6, out=2)
    assert sched.reserve_remote(r, res.duration)
    assert pool.pinned == 10 and pool.room == 0
    now = res.duration
    for _ in range(3):
        now += sched.step(now, horizon=0.0).duration
    assert sched.preemptions == 1 and running.preemptions == 1 and running.alloc is None
    assert r.preemptions == 0 and r.alloc is not None and pool.pinned == 6
    assert sched.num_waiting == 1  # the running one waits for the reservation's blocks
    sched.remote_arrived(r, now)
    results, _ = drain(sched, now)
    assert r.generated == 2 and running.generated == 20 and pool.pinned == 0 and pool.private == 0


# ---- one admission bookkeeping: a reservation and a submit share it (replica/core/sched/admission.py) ----------


def test_reserve_remote_takes_its_place_in_arrival_order_between_submits():
    _, sched = make()
    a, b, c = req(1, 2, base=100), req(2, 2, base=200), req(3, 2, base=300)
    sched.submit(a)
    assert sched.reserve_remote(b, 0.5)
    sched.submit(c)
    assert (a.order, b.order, c.order) == (1, 2, 3)
    assert (a.t_queued, b.t_queued, c.t_queued) == (0.0, 0.5, 0.0)  # a submit queues at its arrival


def test_remote_arrived_counts_one_admission_numbered_after_the_local_ones():
    # a waits 0.5 s for the step that admits it; b's wait for its KV (1.0 to 3.0) is no queue wait
    _, sched = make()
    a = req(1, 4, out=50, base=100)
    sched.submit(a)
    sched.step(0.5, horizon=0.5)
    b = req(2, 4, out=2)
    assert sched.reserve_remote(b, 1.0)
    assert sched.admissions == 1 and b.admit_seq == 0 and b.t_admitted == -1.0  # reserved: not admitted yet
    sched.remote_arrived(b, 3.0)
    assert (a.admit_seq, b.admit_seq) == (1, 2) and b.t_admitted == 3.0
    stats = sched.stats()
    assert stats["admissions"] == 2 and stats["queue_wait_s_total"] == 0.5 and b.waited == 0.0
    assert stats["prefill_tokens"] == 64 + 1 and stats["readmission_prefill_tokens"] == 0
    assert sched.running == [b, a] and sched.queued_prefill_tokens == 1


def test_a_refusal_counts_once_whichever_way_the_request_came():
    _, sched = make(capacity=8, max_model_len=200)
    with pytest.raises(PoolCapacityError):
        sched.submit(req(1, 9))  # more blocks than the pool
    with pytest.raises(ContextLengthError):
        sched.reserve_remote(req(2, 6, out=110), 0.0)  # 96 + 110 tokens > max_model_len 200
    assert sched.refused == 2 and sched.num_waiting == 0
    sched.submit(first := req(3, 2))
    assert first.order == 1  # neither took a place in arrival order
