"""State groups' cache rules (replica/core/cache/groups.py), hand-worked as vLLM 0.33's MambaManager in 'align'
mode keeps them, and replayed against the steps vLLM's own scheduler took with a full and a state group
(sched/vllm_golden/state_hybrid.jsonl, bench/record_vllm_steps.py --state)."""

import json
from pathlib import Path

from replica.core.cache.groups import (
    hit_blocks,
    state_blocks,
    state_cached_block,
    state_chunk_tokens,
    state_hit,
    window_of,
)
from replica.core.sched.steptrace import piece_tokens
from shared.hashing import block_hashes
from shared.kv_groups import FULL, STATE, WINDOW, KvGroup, KvGroups

GOLDEN = Path(__file__).parents[1] / "sched" / "vllm_golden" / "state_hybrid.jsonl"
HYBRID = KvGroups((KvGroup(FULL, 1), KvGroup(STATE, 1, 0, 4)), 1)


def test_a_prompt_stops_at_its_last_block_boundary_then_finishes():
    # blocks of 16, a 100-token prompt with a budget of 2,048 (what vLLM's scheduler did, probed on the CPU):
    # 96 tokens, so that the state after block 5 is kept, then the 4 left
    assert state_chunk_tokens(0, 100, 100, 100, 16, 2048) == 96
    assert state_chunk_tokens(96, 4, 100, 100, 16, 2048) == 4
    assert state_chunk_tokens(100, 1, 100, 101, 16, 2048) == 1  # decoding: one token, never cut
    assert state_chunk_tokens(0, 2048, 5000, 5000, 16, 2048) == 2048  # a chunk on a boundary stays whole
    assert state_chunk_tokens(0, 10, 100, 100, 16, 2048) == 0  # 10 tokens of budget reach no boundary: wait
    # a block of 544 tokens wider than the budget of 512: a sub-block chunk, then back to the boundary
    assert state_chunk_tokens(0, 512, 2000, 2000, 544, 512) == 512
    assert state_chunk_tokens(512, 512, 2000, 2000, 544, 512) == 32
    # a full-attention hit of 512 tokens where the state groups had none: stop there, keep that state
    assert state_chunk_tokens(0, 612, 612, 612, 16, 2048, junction=512) == 512
    assert state_chunk_tokens(512, 100, 612, 612, 16, 2048, junction=512) == 96


def test_a_request_holds_the_state_it_has_and_the_one_its_step_writes():
    assert state_blocks(0, 96, 16) == (5,)  # the first chunk writes the state after 96 tokens into block 5
    assert state_blocks(96, 100, 16) == (5, 6)  # reads block 5's state, writes block 6
    assert state_blocks(100, 101, 16) == (6,)  # block 5 freed (cached still): one block a group while decoding
    assert state_blocks(111, 112, 16) == (6,)
    assert state_blocks(112, 113, 16) == (6, 7)  # crossing a boundary: two for one step
    assert [state_cached_block(n, 16) for n in (96, 100, 112, 0)] == [5, -1, 6, -1]
    assert [window_of(g) for g in (KvGroup(FULL, 1), KvGroup(WINDOW, 1, 128), KvGroup(STATE, 1, 0, 9))] == [0, 128, 2]


def test_a_state_hit_is_the_last_state_held_below_the_full_groups_run():
    assert state_hit([False, True, False, True, False]) == 4 and state_hit([False] * 3) == 0
    full, states = set(range(10)), {2, 5}
    held = lambda g, i: i in (full if g == 0 else states)  # noqa: E731
    assert hit_blocks(HYBRID, held, 10, 16) == 6
    full = set(range(5))
    assert hit_blocks(HYBRID, held, 10, 16) == 3  # the full groups stop at block 5: the state of block 2
    full = set(range(10))
    assert hit_blocks(HYBRID, held, 5, 16) == 3  # at most 5 blocks: block 5's state is past it


def _replay(header: dict, steps: list[dict]) -> dict[str, list[tuple[int, int, int]]]:
    """Each request's admission (step, hit, -1) and chunks (step, -1, tokens) as the state rules give them: the
    running requests' chunks first, then the waiting ones' in arrival order, each with the budget whole (no
    request of this workload competes for it)."""
    w = header["workload"]
    bs, budget = w["settings"]["block_size"], w["settings"]["max_num_batched_tokens"]
    reqs = {r["id"]: r for r in w["requests"]}
    prompt = {rid: len(piece_tokens(r["prompt"])) for rid, r in reqs.items()}
    tokens = {rid: piece_tokens(r["prompt"]) + piece_tokens(r["output"]) for rid, r in reqs.items()}
    full: set[int] = set()
    states: dict[int, int] = {}  # a cached state's block hash -> the step that cached it
    done: dict[str, int] = {}  # computed tokens of the admitted requests
    junction: dict[str, int] = {}
    out: dict[str, list[tuple[int, int, int]]] = {rid: [] for rid in reqs}

    def chunk(rid: str, k: int) -> None:
        start, p = done[rid], prompt[rid]
        known = p if start < p else start + 1  # the prompt, or every token sampled so far
        n = state_chunk_tokens(start, min(known - start, budget), p, known, bs, budget, junction[rid])
        done[rid] = start + n
        out[rid].append((k, -1, n))
        hashes = block_hashes(tokens[rid][:start + n], bs)
        full.update(hashes)
        if state_cached_block(start + n, bs) >= 0:
            states.setdefault(hashes[-1], k)

    for k in range(len(steps)):
        for rid in [r for r, n in done.items() if n < len(tokens[r]) - 1]:  # the last token sampled, never computed
            chunk(rid, k)
        for rid in [r for r in reqs if reqs[r]["arrive"] <= k and r not in done]:
            hashes = block_hashes(tokens[rid][:prompt[rid]], bs)
            most = (prompt[rid] - 1) // bs
            runs = hit_blocks(HYBRID, lambda g, i: hashes[i] in (full if g == 0 else states), most, bs)  # noqa: B023
            if runs and states[hashes[runs - 1]] == k:
                break  # its state is being computed in this step: it waits, and so do those behind it
            first = next((i for i in range(most) if hashes[i] not in full), most)
            done[rid], junction[rid] = runs * bs, first * bs if first > runs else 0
            out[rid].append((k, runs * bs, -1))
            chunk(rid, k)
    return out


def test_the_rules_take_the_steps_vllm_took_with_a_state_group():
    lines = GOLDEN.read_text().splitlines()
    header, steps = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    assert header["vllm"] == "0.33.0" and header["workload"]["settings"]["kv_groups"] == [["full", 0], ["state", 0]]
    vllm: dict[str, list[tuple[int, int, int]]] = {}
    for s in steps:
        for rid, hit in s["cached"].items():
            vllm.setdefault(rid, []).append((s["step"], hit, -1))
        for rid, n in s["scheduled"].items():
            vllm.setdefault(rid, []).append((s["step"], -1, n))
    ours = _replay(header, steps)
    for rid in vllm:
        assert ours[rid] == vllm[rid], rid
    hits = {rid: s["cached"][rid] for s in steps for rid in s["cached"]}
    # the next turn finds the state its turn before left at 336 tokens while decoding; y waits a step for x's
    # state; a1 shares a0's 512-token prefix but no chunk of a0 ended there: no state, no hit
    assert hits == {"t1": 0, "t2": 336, "x": 0, "y": 240, "a0": 0, "a1": 0}


def test_the_grouped_pool_holds_a_state_block_or_two_and_a_hit_on_a_state_cached_now_waits_a_step():
    import pytest

    from replica.core.cache.grouped import GroupedPool
    from replica.core.cache.groups import group_key
    from replica.core.cache.policies.lru import LRUPolicy
    from replica.core.cache.pool import BlockPool, PoolBusyError
    from replica.core.cache.types import Lookup

    base = BlockPool(20, LRUPolicy(), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, HYBRID)
    hashes = [1, 2, 3, 4, 5]  # 80 tokens: the first chunk stops at 64, the last boundary before token 79
    a = pool.acquire(Lookup(hashes, "a", 0.0, 80))
    pool.extend(a, 64, 5)  # the full group takes blocks 0-3, the state group block 3 alone (its state at 64)
    assert a.tables == [[1, 2, 3, 4], [group_key(4, 1)]] and base.pinned == 5
    with pytest.raises(PoolBusyError, match="cached in this step"):
        pool.acquire(Lookup(hashes, "b", 0.0, 80))  # its hit's state is computed by this step's end
    pool.new_step()
    b = pool.acquire(Lookup(hashes, "b", 1.0, 80))
    assert b.hit_idx == [0, 1, 2, 3] and b.tables == [[1, 2, 3, 4], [group_key(4, 1)]]
    pool.slide(a, 64)  # the state after 64 tokens is block 3's: kept
    pool.extend(a, 80, 5)  # the rest: block 4 in both groups, its state at 80 kept (the chunk ends on it)
    pool.slide(a, 80)  # block 3's state is no longer a's (b still pins it)
    assert a.tables == [[1, 2, 3, 4, 5], [group_key(5, 1)]] and base.pinned == 7
    pool.release(a)
    pool.release(b)
    assert base.pinned == 0 and base.private == 0


def test_the_core_runs_qwen3_next_and_refuses_what_state_groups_cannot_run_in_one_line():
    import pytest

    from replica.core.build import CoreSettings, build_core, check_groups_served
    from replica.core.cache.grouped import GroupedPool
    from shared.costmodel import CostModel
    from shared.errors import InputError

    shipped = Path(__file__).parents[4] / "bench" / "data" / "models" / "qwen3-next-80b-a3b" / "config.json"
    cost = CostModel.from_names(str(shipped))
    core = build_core(CoreSettings(capacity_blocks=100), cost)
    assert isinstance(core.serving, GroupedPool) and core.serving.states.ids == (0, 1, 2)  # state layers first
    with pytest.raises(InputError) as err:
        check_groups_served(cost, "--role", "P/D's transfer of each group's blocks is not modelled yet")
    assert str(err.value) == ("--role: qwen3-next-80b-a3b has state layers (KV cache groups): P/D's transfer of each"
                              " group's blocks is not modelled yet")
