"""KV cache groups seen from outside, worked by hand: a window of 32 tokens as group 0 and a full-attention group 1
(gpt-oss's order: its first layer is a window's), blocks of 16 tokens, a pool of 8 blocks. A prompt of 4 blocks is
stored in the full group at admission and in the window's as its chunk is cut (``extend``); its window then
passes blocks 0 and 1 (64 tokens computed), which go unpinned; a one-block request evicts them, one for each of
its groups. The pool's keys as each group's events, vLLM's wire, kvemu's feed and index, ``/stats``'s section
and the start line."""

from replica.core.cache.group_events import GroupKeys, for_index
from replica.core.cache.group_usage import GroupSampler, kv_groups_now, kv_groups_run
from replica.core.cache.grouped import GroupedPool
from replica.core.cache.groups import group_key
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import KvEvent, Lookup
from replica.core.sched.scheduler import SchedRequest, Scheduler
from replica.events import EventFeed
from replica.vllm_events import EventTranslator
from shared.costmodel import CostModel
from shared.index import EventBatch, MemoryIndex
from shared.kv_groups import FULL, WINDOW, group_layers
from shared.memory_rule import groups_note, kv_budget

GROUPS = group_layers([(WINDOW, 32), (FULL, 0)])


def _prompt_slide_evict() -> list[list[KvEvent]]:
    """The pool's events, drained after each of: the prompt's admission and chunk, its window's slide, the next
    request's admission and chunk."""
    base = BlockPool(8, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, GROUPS)
    alloc = pool.acquire(Lookup([1, 2, 3, 4], "a", 0.0, 64))
    pool.extend(alloc, 64, 4)
    drained = [base.drain_events()]
    pool.slide(alloc, 64)  # tokens 33.. read: blocks 0 and 1 of the window's table unpinned, nothing evicted yet
    drained.append(base.drain_events())
    nxt = pool.acquire(Lookup([5], "b", 1.0, 16))  # a free block wanted in each group: the unpinned ones go,
    pool.extend(nxt, 16, 1)  # deepest first
    drained.append(base.drain_events())
    return drained


def _keys() -> GroupKeys:
    keys = GroupKeys(GROUPS)
    keys.teach([1, 2, 3, 4], [5])  # as each request is submitted: the blocks the pool will key
    return keys


def test_the_pool_events_come_back_per_group_with_plain_hashes():
    stored, slid, evicted = _prompt_slide_evict()
    # the pool's own: group 1's keys are the 64-bit keys of (hash, 1), group 0's the hashes
    assert stored == [KvEvent("stored", tuple(group_key(h, 1) for h in (1, 2, 3, 4))), KvEvent("stored", (1, 2, 3, 4))]
    assert slid == []  # a window's slide unpins: no event until the blocks are evicted
    keys = _keys()
    assert keys.index_group == 1  # the full-attention group carries the prefix
    assert keys.resolve(stored) == [KvEvent("stored", (1, 2, 3, 4), 0, 1), KvEvent("stored", (1, 2, 3, 4), 0, 0)]
    assert keys.resolve(evicted) == [KvEvent("removed", (2,), 0, 0), KvEvent("stored", (5,), 0, 1),
                                     KvEvent("removed", (1,), 0, 0), KvEvent("stored", (5,), 0, 0)]
    assert len(keys) == 5  # the group-1 keys of blocks 1-5, each held in group 1
    # what the index applies: the full group's, as group 0's
    assert for_index(keys.lookup(stored), 1) == [KvEvent("stored", (1, 2, 3, 4))]
    # untaught, a full group's key stored before its hash reads as group 0's: why requests teach their blocks
    assert GroupKeys(GROUPS).resolve(stored)[0] == KvEvent("stored", tuple(group_key(h, 1) for h in (1, 2, 3, 4)))


def test_vllm_wire_publishes_every_group_with_its_index_and_kind():
    stored, _, evicted = _prompt_slide_evict()
    keys = _keys()
    t = EventTranslator(16, groups=GROUPS)
    t.register([1, 2, 3, 4])
    t.register([5])

    def stored_event(hashes, group):
        window = {"kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 32} if group == 0 else \
            {"kv_cache_spec_kind": "full_attention"}  # omit_defaults: a full group's window (None) is left out
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": [],
                "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": group, **window}

    assert t.translate(keys.resolve(stored)) == [stored_event([1, 2, 3, 4], 1), stored_event([1, 2, 3, 4], 0)]
    assert t.translate(keys.resolve(evicted)) == [
        {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU", "group_idx": 0}, stored_event([5], 1),
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0}, stored_event([5], 0)]
    # msgspec's array_like form: extra_keys (None) keeps its place, a trailing default is dropped
    array = EventTranslator(16, "array", groups=GROUPS)
    array.register([1, 2, 3, 4])
    assert array.translate(_keys().resolve(stored)) == [
        ["BlockStored", [1, 2, 3, 4], None, [], 16, None, "GPU", None, None, 1, "full_attention"],
        ["BlockStored", [1, 2, 3, 4], None, [], 16, None, "GPU", None, None, 0, "sliding_window", 32]]


def test_one_group_keeps_the_wire_it_had():
    t = EventTranslator(16)
    t.register([1, 2])
    assert t.translate([KvEvent("stored", (1, 2)), KvEvent("removed", (2,))]) == [
        {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [], "block_size": 16,
         "lora_id": None, "medium": "GPU", "lora_name": None},
        {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}]


def test_kvemu_feed_and_index_hold_each_block_once():
    stored, _, evicted = _prompt_slide_evict()
    keys = _keys()
    feed = EventFeed("r0", lambda: [], index_group=keys.index_group)
    feed.publish(keys.resolve(stored))
    feed.publish(keys.resolve(evicted))  # the window's removals are not the index's: only block 5's store
    assert [b.to_wire()["events"] for b in feed.since(0)] == [[["stored", (1, 2, 3, 4)]], [["stored", (5,)]]]
    index = MemoryIndex()
    for b in feed.since(0):
        index.apply_sync(EventBatch("r0", feed.epoch, b.seq, b.events))
    assert index.lookup_sync([1, 2, 3, 4]) == {"r0": 4} and index.lookup_sync([5]) == {"r0": 1}
    assert index.stats_sync()["entries"] == 5  # not 10: one entry a block whatever groups hold it


def test_stats_section_counts_each_group_from_the_running_tables():
    base = BlockPool(100, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, group_layers([(FULL, 0), (WINDOW, 32)]))
    s = Scheduler(pool, CostModel.from_names())
    s.submit(SchedRequest(1, list(range(1, 7)), 100, 81, 0.0))  # 100 tokens: 6 full blocks and a partial one
    now = s.step(0.0).duration
    s.step(now)  # token 100 decodes: the window reads tokens 69.., its blocks 0-3 are gone
    assert kv_groups_now([(pool, s.running)]) == {
        "count": 2, "layers_per_group": 1,
        "groups": [{"group": 0, "kind": "full", "layers": 1, "held_blocks": 7},
                   {"group": 1, "kind": "window", "layers": 1, "window": 32, "held_blocks": 3,
                    "window_freed_blocks": 4}]}


def test_the_sim_section_weighs_each_step_by_its_duration():
    base = BlockPool(100, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, group_layers([(FULL, 0), (WINDOW, 32)]))
    s = Scheduler(pool, CostModel.from_names())
    s.submit(SchedRequest(1, list(range(1, 7)), 100, 81, 0.0))
    sampler, now = GroupSampler(pool), 0.0
    for seconds in (1.0, 1.0, 2.0):  # the prefill holds 7 blocks in each group, then the window 3 (4 let go)
        now += s.step(now).duration
        sampler.sample(s.running, seconds)
    out = kv_groups_run([sampler])
    assert out is not None
    rows = out["groups"]
    assert rows[0] == {"group": 0, "kind": "full", "layers": 1, "mean_held_blocks": 7.0, "peak_held_blocks": 7}
    assert rows[1] == {"group": 1, "kind": "window", "layers": 1, "window": 32, "peak_held_blocks": 7,
                       "mean_held_blocks": (7 + 3 + 2 * 3) / 4, "mean_window_freed_blocks": (4 + 2 * 4) / 4}
    assert kv_groups_run([]) is None  # a model of one group: no section


def test_the_start_line_says_what_a_request_holds_in_each_group():
    cost = CostModel.from_names("gpt-oss-120b", "h200")
    b = kv_budget(cost, 0.9, 8192, 256, 16)
    assert b.line().endswith(": 115,776 blocks of 16 tokens, each one KV cache group's page of 18 layers; 2 groups:"
                             " 1 window 128 (a request holds at most 9 blocks in it once its prefill is computed),"
                             " 1 full (a request of T tokens holds ceil(T/16) blocks in it)")
    assert "groups_note" not in b.breakdown()  # the JSON's kv_groups section says it
    assert groups_note(CostModel.from_names().model.kv_groups, 16) == ""  # one group: the line as it was
