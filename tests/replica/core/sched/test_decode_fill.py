"""Blocks shared as they fill: every full block a running request's decoding computes is hashed and
findable at once (vLLM caches each full block in the step that schedules its last token), with its KV
event then; the pool's ``fill`` rule; the simulator and the live replica build the same rule."""

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, KvEvent, fill_picks
from replica.core.cache.types import Lookup
from replica.core.compiled.pool import compiled
from replica.core.sched.scheduler import Scheduler, SchedulerSettings
from replica.core.sched.steptrace import piece_tokens
from replica.settings import ReplicaSettings
from shared.costmodel import CostModel
from shared.hashing import block_hashes
from sim.settings import SimSettings, core_settings

BS = 16
COST = CostModel.from_names()


def turn(rid: int, pieces: list, out_tag: int, out: int, t: float):
    """A request whose prompt is ``pieces`` and whose ``out`` output tokens are ``[out_tag, out]``'s:
    its response blocks hash from them (the last output token's KV is never computed)."""
    from replica.core.sched.sched_types import SchedRequest

    prompt, output = piece_tokens(pieces), piece_tokens([[out_tag, out]])
    full = block_hashes(prompt + output[:-1], BS)
    n = len(prompt) // BS
    return SchedRequest(rid, full[:n], len(prompt), out, t, response_hashes=full[n:])


def scheduler(capacity: int = 999, emit_events: bool = False) -> tuple[BlockPool, Scheduler]:
    pool = BlockPool(capacity, make_policy("lru"), block_size=BS, hit_mode="prefix", emit_events=emit_events)
    return pool, Scheduler(pool, COST, SchedulerSettings(token_budget=2048, max_running=16, max_waiting=100),
                           keep_response_kv=True)


def test_a_turn_arriving_while_the_previous_one_decodes_finds_what_it_generated_so_far():
    """vLLM's engine on the same case finds 448 tokens (golden overlapping_turns). t1: a 300-token
    prompt (18 full blocks and a 12-token tail), 200 output tokens. Step k >= 1 computes its (k-1)-th
    output token, so after step k its KV holds 300 + k tokens: block 18 + i is full at step 4 + 16 i.
    By step 149, 10 response blocks are full (i = 0..9, the last at step 148): 28 hashed blocks, pinned,
    and 1 private block (token 448). t2 (t1's prompt, its 200 output tokens, 50 more) arrives at step 150
    and finds 28 blocks: 448 tokens, where only t1's 18 prompt blocks (288) were found before."""
    pool, sched = scheduler(emit_events=True)
    t1 = turn(1, [[90, 300]], 91, 200, 0.0)
    assert len(t1.hashes) == 18 and len(t1.response_hashes) == 13  # 499 tokens' KV: 31 full blocks
    sched.submit(t1)
    stored_at = {}
    for k in range(150):
        sched.step(float(k), horizon=float(k))
        for e in pool.drain_events():
            for h in e.hashes:
                stored_at[h] = k
    assert [stored_at[h] for h in t1.response_hashes[:10]] == [4 + 16 * i for i in range(10)]
    assert t1.response_hashes[10] not in stored_at  # full at step 164
    assert (t1.fill_pins, t1.extra_blocks, pool.pinned, pool.private) == (10, 1, 28, 1)
    t2 = turn(2, [[90, 300], [91, 200], [92, 50]], 93, 20, 150.0)
    assert t2.hashes[:28] == [*t1.hashes, *t1.response_hashes[:10]]
    sched.submit(t2)
    sched.step(150.0, horizon=150.0)
    assert t2.cached_tokens == 448


def test_a_block_another_request_pins_as_it_fills_stays_a_private_copy_until_that_request_lets_go():
    """Going on from the case above: t2 (550 tokens: 34 full blocks) computed blocks 28..33, t1's future
    response blocks 10..15 by hash, and pins them. t1 fills response block 10 at step 164 while t2 still
    runs (it finishes at the end of step 169, its 20th token): vLLM holds two copies, so t1 keeps its
    block private (the same room). When t2 ends, t1 pins the hashed block instead: one private block
    less, and the hash stays findable while t1 runs, whatever evicts t2's blocks."""
    pool, sched = scheduler()
    t1 = turn(1, [[90, 300]], 91, 200, 0.0)
    t2 = turn(2, [[90, 300], [91, 200], [92, 50]], 93, 20, 150.0)
    sched.submit(t1)
    finished = []
    for k in range(170):
        if k == 150:
            sched.submit(t2)
        finished += sched.step(float(k), horizon=float(k)).finished
        if k == 164:
            assert t1.dups == [t1.response_hashes[10]] and t1.fill_pins == 10 and t1.extra_blocks == 1  # the copy
            assert pool.pin_counts[t1.response_hashes[10]] == 1  # t2's
    assert finished == [t2]
    assert t1.dups == [] and t1.fill_pins == 11 and t1.extra_blocks == 1
    assert pool.pin_counts[t1.response_hashes[10]] == 1  # t1's now
    assert pool.prefix_match(t2.hashes) == 34


def test_the_fill_rule_pins_new_and_cached_blocks_and_leaves_one_another_request_pins_private():
    pool = BlockPool(10, make_policy("lru"), block_size=BS, emit_events=True)
    other = pool.acquire(Lookup([7], "b"))
    pool.store([8], "a")  # cached, unpinned
    pool.take_private(4)  # the running request's private blocks (decode KV)
    pool.drain_events()
    assert fill_picks([5, 7, 8, 6, 5], pool.pins_of([5, 7, 8, 6, 5])) == [5, 8, 6]
    alloc = pool.fill([5, 7, 8, 6], "a", 1.0)
    assert alloc is not None and list(alloc.hashes) == [5, 8, 6] and alloc.new_idx == [0, 2]
    assert (pool.private, pool.pinned, pool.room) == (1, 4, 5)  # 4 private blocks: 3 pinned instead, 7 stays
    assert pool.drain_events() == [KvEvent("stored", (5, 6))]
    assert pool.fill([7], "a", 1.0) is None and pool.private == 1
    pool.release(alloc, 2.0)
    pool.release(other, 2.0)
    assert pool.pinned == 0 and set(pool.resident) == {5, 6, 7, 8}


def test_the_simulator_and_the_live_replica_build_the_same_rule():
    """Both build their core with ``build_core``: blocks are hashed as they fill wherever response KV is
    kept and decode KV takes blocks, and only there."""
    cost = CostModel.from_names()
    sim_keep = build_core(core_settings(SimSettings(capacity_blocks=100, knobs=EngineKnobs(response_kv="keep")), BS, cost, False, 9), cost)
    sim_drop = build_core(core_settings(SimSettings(capacity_blocks=100, knobs=EngineKnobs(response_kv="drop")), BS, cost, False, 9), cost)
    live_keep = build_core(ReplicaSettings(capacity_blocks=100).core_settings(), cost)
    live_drop = build_core(ReplicaSettings(capacity_blocks=100, knobs=EngineKnobs(response_kv="drop")).core_settings(), cost)
    no_decode_kv = build_core(CoreSettings(capacity_blocks=100, knobs=EngineKnobs(decode_kv=False)), cost)
    assert [c.scheduler.decode_kv.fills for c in (sim_keep, live_keep, sim_drop, live_drop, no_decode_kv)] == \
           [True, True, False, False, False]
    # the simulator's pool is the compiled twin where it is built: it fills by the same rule
    assert sim_keep.engine == ("compiled" if compiled() else "python") and live_keep.engine == "python"
