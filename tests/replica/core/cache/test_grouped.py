"""A pool of KV cache groups under the scheduler (replica/core/cache/grouped.py), worked by hand against vLLM's
hybrid manager: a full-attention group and a window of 32 tokens, blocks of 16 tokens."""

import pytest

from replica.core.cache.grouped import GroupedAllocation, GroupedPool
from replica.core.cache.groups import group_key
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from shared.costmodel import CostModel
from shared.kv_groups import FULL, WINDOW, group_layers


def _hybrid(capacity: int = 100) -> tuple[Scheduler, GroupedPool, BlockPool]:
    base = BlockPool(capacity, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, group_layers([(FULL, 0), (WINDOW, 32)]))
    return Scheduler(pool, CostModel.from_names()), pool, base


def _run(s: Scheduler, pool: GroupedPool, r: SchedRequest) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Blocks ``r`` holds in each group after each step (none once it finished), and the pool's pinned and
    private blocks then."""
    held, pool_held, now = [], [], 0.0
    while s.has_work():
        now += s.step(now, horizon=now).duration  # one step at a time (no decode run)
        alloc = r.alloc
        running = isinstance(alloc, GroupedAllocation) and any(alloc.tables)
        held.append(pool.held_per_group(alloc, r.extra_blocks) if isinstance(alloc, GroupedAllocation) and running
                    else [])
        pool_held.append((pool.pinned, pool.private))
    return held, pool_held


def test_a_window_frees_the_blocks_it_passed_every_step_and_the_full_group_keeps_them():
    s, pool, base = _hybrid()
    r = SchedRequest(1, list(range(1, 7)), 100, 81, 0.0)  # 100 tokens: 6 full blocks and a partial one
    s.submit(r)
    held, pool_held = _run(s, pool, r)
    # step 0 prefills: 7 blocks in each group (no hit, nothing skipped): 6 hashed and a partial one each
    assert held[0] == [7, 7] and pool_held[0] == (12, 2)
    # step k >= 1 decodes token 99 + k: the full group holds (99 + k) // 16 + 1 blocks; before it the window
    # frees (99 + k - 31) // 16 blocks (tokens 100 - 31 = 69 on are read at step 1: blocks 0-3 go)
    assert held[1] == [7, 3] and pool_held[1] == (8, 2)
    assert held[1:12] == [[7, 3]] * 11
    assert held[12] == [7, 2]  # 111 computed: tokens 80-111 read, blocks 5 and 6
    assert held[13] == [8, 3] and pool_held[13] == (7, 4)  # token 112: block 7 in both groups
    assert held[76:80] == [[11, 2], [12, 3], [12, 3], [12, 3]]  # 5 blocks of decode: 12 in the full group
    assert len(held) == 81 and held[80] == []  # 80 decode steps after the prefill's first token
    assert (base.pinned, base.private, len(base.resident)) == (0, 0, 12)  # 6 hashed blocks a group stay cached


def test_a_repeated_prompt_hits_96_tokens_and_its_window_skips_what_it_passed():
    s, pool, base = _hybrid()
    a = SchedRequest(1, list(range(1, 7)), 100, 2, 0.0)
    s.submit(a)
    _run(s, pool, a)
    b = SchedRequest(2, list(range(1, 7)), 100, 2, 1.0)
    s.submit(b)
    s.step(1.0)
    alloc = b.alloc
    assert isinstance(alloc, GroupedAllocation) and alloc.hit_blocks == 6 and b.cached_tokens == 96  # vLLM: 96
    # at the hit (96 tokens) the window reads tokens 65 on: blocks 0-3 are skipped, 4 and 5 pinned
    assert alloc.freed == [0, 4] and pool.held_per_group(alloc, b.extra_blocks) == [7, 3]
    assert base.pinned == 8


def test_release_goes_group_by_group_each_tail_first():
    s, pool, base = _hybrid()
    a = SchedRequest(1, [11, 12], 40, 1, 0.0)  # 2 full blocks and a partial; window 32 keeps both at 40
    s.submit(a)
    _run(s, pool, a)
    # vLLM's coordinator.free: group 0's blocks tail first, then group 1's: the free queue's order
    assert base.policy.victims(4) == [12, 11, group_key(12, 1), group_key(11, 1)]


def test_the_compiled_pool_is_refused_for_a_model_of_several_groups():
    from replica.core.compiled.pool import why_not

    base = BlockPool(100, make_policy("lru"), block_size=16, hit_mode="prefix", emit_events=False)
    assert why_not(base, kv_groups=2) == "a model of 2 KV cache groups needs the Python pool (a block table per group)"
    assert why_not(base, kv_groups=1) != why_not(base, kv_groups=2)


def test_a_long_prompt_takes_its_window_blocks_chunk_by_chunk_as_vllm_allocates_them():
    # a budget of 64 tokens: a 200-token prompt (12 full blocks and a partial one) in four chunks. Each group takes
    # a chunk's blocks as it is scheduled (the full group 4, 8, 12, 13); the window (32 tokens) frees what it
    # passed ((computed - 31) // 16 blocks): after chunk 0 (tokens 0-63) blocks 0-3; after chunk 1 (64-127; 2
    # passed at 64) blocks 2-7; after chunk 2 (6 passed at 128) blocks 6-11; after chunk 3 (10 passed
    # at 192) blocks 10-12, the last its partial one
    base = BlockPool(100, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, group_layers([(FULL, 0), (WINDOW, 32)]))
    pool.in_flight = 64  # one step of 64 tokens in flight
    s = Scheduler(pool, CostModel.from_names(), SchedulerSettings(token_budget=64))
    r = SchedRequest(1, list(range(1, 13)), 200, 2, 0.0)
    s.submit(r)
    held, pool_held = _run(s, pool, r)
    assert held == [[4, 4], [8, 6], [12, 6], [13, 3], []]
    assert pool_held[0] == (8, 0) and pool_held[3] == (14, 2)  # at the end: 12 + 2 hashed, 2 partial blocks


def test_admission_counts_a_window_at_its_cap_and_the_refusal_counts_the_same():
    # window 32, 64 tokens a step in flight: vLLM counts a window group at ceil((31 + 64) / 16) + 1 = 7 blocks at
    # most, so the 200-token prompt (13 blocks) needs 13 + 7 = 20 free blocks on an idle pool, and its 201st
    # token's KV still 13 + 7. The refusal counts the same (a pool of 19 once left it waiting for ever: the
    # refusal counted the window's 3-block tail at the longest hit)
    from replica.core.cache.pool import PoolCapacityError

    def sched(capacity: int) -> tuple[Scheduler, GroupedPool]:
        pool = GroupedPool(BlockPool(capacity, make_policy("lru"), block_size=16, hit_mode="prefix"),
                           group_layers([(FULL, 0), (WINDOW, 32)]))
        pool.in_flight = 64  # one step of 64 tokens in flight
        assert pool.admission_need(13) == 20 and pool.admission_need(5) == 10
        return Scheduler(pool, CostModel.from_names(), SchedulerSettings(token_budget=64)), pool

    s, _ = sched(19)
    with pytest.raises(PoolCapacityError) as err:
        s.submit(SchedRequest(1, list(range(1, 13)), 200, 2, 0.0))
    assert str(err.value) == "prompt: needs 20 KV blocks but the pool holds only 19"
    assert s.refused == 1 and s.num_waiting == 0
    s, pool = sched(20)  # the idle pool of 20 admits it at once and runs it to the end
    r = SchedRequest(1, list(range(1, 13)), 200, 2, 0.0)
    s.submit(r)
    s.step(0.0)
    assert s.num_waiting == 0 and s.num_running == 1
    held, _ = _run(s, pool, r)
    assert held[-1] == [] and s.refused == 0
    # 80 tokens and 200 to generate: re-admitted after a preemption at its last token (279 tokens, 18 blocks) it
    # would count 18 + 7 = 25 (vLLM's startup rule refuses such a max_model_len on this pool)
    with pytest.raises(PoolCapacityError) as err:
        sched(22)[0].submit(SchedRequest(2, list(range(1, 6)), 80, 200, 0.0))
    assert str(err.value) == "max_tokens: needs 25 KV blocks but the pool holds only 22"


def test_a_decode_run_frees_what_its_windows_passed_at_the_next_step_as_single_steps_do():
    # the simulator's decode fast-forward (no horizon): the windows catch up at the step after the run, so a
    # request leaves the pool as one stepped one step at a time leaves it (the same blocks cached; their order in
    # the free queue is the run's, request by request: docs/vllm-conformance.md, "Departures kept")
    def end_state(horizon_now: bool) -> tuple:
        s, pool, base = _hybrid()
        s.submit(SchedRequest(1, list(range(1, 7)), 100, 81, 0.0))
        s.submit(SchedRequest(2, list(range(1, 4)) + [50, 51], 90, 40, 0.0))
        now = 0.0
        while s.has_work():
            now += s.step(now, horizon=now if horizon_now else float("inf")).duration
        return sorted(base.resident), base.policy.victims(len(base.resident)), base.pinned, base.private

    stepped, run = end_state(True), end_state(False)
    # the two prompts' 8 distinct blocks in both groups stay cached, nothing pinned or private left
    assert run[2:] == stepped[2:] == (0, 0) and run[0] == stepped[0] and len(run[0]) == 16
