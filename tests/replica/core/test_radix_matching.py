"""Radix matching (``--matching radix``, SGLang's radix tree on the block pool): hand-worked matches,
page rounding, leaf-first eviction and reference counts."""

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core, check_matching
from replica.core.sched.scheduler import SchedRequest
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.hashing import block_hashes

COST = CostModel.from_names("llama-3-8b", "h100")


def core(capacity: int, page: int, **knobs):
    return build_core(CoreSettings(capacity_blocks=capacity, block_size=page,
                                   knobs=EngineKnobs(matching="radix", hit_mode="prefix", **knobs)), COST)


def run(c, reqs):
    now = 0.0
    for r in reqs:
        c.scheduler.submit(r)
    while c.scheduler.has_work():
        now += c.scheduler.step(now).duration
    return now


def ask(c, rid, tokens, page, out=1, response=()):
    r = SchedRequest(rid, block_hashes(tokens, page), len(tokens), out, 0.0, response_hashes=response)
    run(c, [r])
    return r


SYSTEM = list(range(1000, 1037))  # 37 tokens shared by both prompts


@pytest.mark.parametrize("page, cached", [(1, 37), (4, 36), (16, 32), (64, 0)])
def test_two_prompts_share_their_common_prefix_rounded_down_to_whole_pages(page, cached):
    # A = SYSTEM + 20 tokens, B = SYSTEM + 20 other tokens: they part at token 37. Radix reuses the
    # longest common prefix in whole pages: 37 tokens with pages of 1, 9 pages of 4 (36), 2 of 16 (32),
    # none of 64 (A's 57 tokens fill no page of 64: a partial page is never shared).
    c = core(10_000, page)
    ask(c, 1, SYSTEM + list(range(20)), page)
    b = ask(c, 2, SYSTEM + list(range(500, 520)), page)
    assert b.cached_tokens == cached


def test_a_prompt_cached_to_its_last_token_still_computes_that_token():
    c = core(10_000, 1)
    ask(c, 1, SYSTEM, 1)
    c.scheduler.submit(SchedRequest(2, block_hashes(SYSTEM, 1), len(SYSTEM), 1, 0.0))
    step = c.scheduler.step(0.0)
    assert step.prefill_tokens == 1  # the 37th token is run to produce the first output token's logits


def _evicted(c) -> list[int]:
    return [h for e in c.drain_events() if e.kind == "removed" for h in e.hashes]


def test_eviction_goes_leaf_first_and_a_response_leaves_before_the_prompt_it_extends():
    # Pages of 4: the shared system prompt is pages s0..s2 (12 tokens); A adds a0, a1 and a response
    # page ra; B adds b0. Pool of 7 pages: all resident. C, 4 pages of its own, needs 4 pages back.
    page, sys_tokens = 4, list(range(12))
    c = core(7, page, response_kv="keep")
    a_tokens = sys_tokens + list(range(100, 108))
    a_pages = block_hashes(a_tokens, page)
    ra = block_hashes(list(range(900, 904)), page, a_pages[-1])  # chained after A's last page
    ask(c, 1, a_tokens, page, response=ra)
    b_pages = block_hashes(sys_tokens + list(range(200, 204)), page)
    ask(c, 2, sys_tokens + list(range(200, 204)), page)
    c.drain_events()
    ask(c, 3, list(range(300, 316)), page)
    # LRU over leaves: A's branch is older than B's, its response page the leaf, then its own pages
    # tail first; the shared pages (parents of B's page) stay.
    assert _evicted(c) == [ra[0], a_pages[4], a_pages[3], b_pages[3]]
    assert c.pool.resident.keys() >= set(a_pages[:3])


def test_a_running_request_holds_its_pages_by_reference_count():
    page = 2
    c = core(40, page)
    shared = list(range(8))  # 4 pages
    long = SchedRequest(1, block_hashes(shared, page), 8, 20, 0.0)
    c.scheduler.submit(long)
    c.scheduler.step(0.0, horizon=0.0)  # admitted, prefilled, decoding: its pages are pinned
    pins = c.pool.pin_counts
    assert all(pins[h] == 1 for h in long.hashes)
    other = SchedRequest(2, block_hashes(shared + [50, 51], page), 10, 5, 0.0)
    c.scheduler.submit(other)
    c.scheduler.step(0.0, horizon=0.0)
    assert all(pins[h] == 2 for h in long.hashes)  # both hold the shared pages
    assert other.cached_tokens == 8


@pytest.mark.parametrize("policy", ["s3fifo", "arc", "session_lru"])
def test_policies_that_can_evict_a_parent_first_are_refused(policy):
    with pytest.raises(InputError, match="radix tree never does"):
        check_matching("radix", policy, "prefix", "on")


def test_radix_needs_prefix_hits_and_prefix_caching():
    with pytest.raises(InputError, match="leading run"):
        check_matching("radix", "lru", "holes", "on")
    with pytest.raises(InputError, match="prefix caching"):
        check_matching("radix", "lru", "prefix", "off")
    with pytest.raises(InputError, match="blocks, radix"):
        check_matching("trie", "lru", "prefix", "on")
    check_matching("blocks", "s3fifo", "holes", "on")  # blocks take every policy
