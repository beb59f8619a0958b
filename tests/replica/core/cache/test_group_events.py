"""KV cache groups seen from outside, worked by hand: a window of 32 tokens as group 0 and a full-attention group 1
(gpt-oss's order: its first layer is a window's), blocks of 16 tokens, a pool of 8 blocks. A prompt of 4 blocks is
prefilled in two chunks of 32 tokens, each group taking a chunk's blocks as it is cut (``extend``, vLLM's
allocate_slots: one drained event holds group 0's hashes then group 1's keys); its window then passes blocks 0
and 1 (64 tokens computed), which go unpinned; a one-block request evicts them, one for each of its groups. The
pool's keys as each group's events in vLLM's order (group by group, as its cache_blocks publishes them), vLLM's
wire, kvemu's feed and index, ``/stats``'s section and the start line."""

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
from shared.kv_groups import FULL, STATE, WINDOW, KvGroup, KvGroups, group_layers
from shared.memory_rule import groups_note, kv_budget

GROUPS = group_layers([(WINDOW, 32), (FULL, 0)])


def _prompt_slide_evict() -> list[list[KvEvent]]:
    """The pool's events, drained after each of: the prompt's admission and first chunk, its second chunk, its
    window's slide, the next request's admission and chunk."""
    base = BlockPool(8, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, GROUPS)
    alloc = pool.acquire(Lookup([1, 2, 3, 4], "a", 0.0, 64))  # no hit: nothing held yet
    pool.extend(alloc, 32, 4)  # tokens 0-31: blocks 0 and 1 in each group
    drained = [base.drain_events()]
    pool.extend(alloc, 64, 4)  # tokens 32-63: blocks 2 and 3
    drained.append(base.drain_events())
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
    first, second, slid, evicted = _prompt_slide_evict()
    # the pool's own, one event a chunk: group 0's hashes, then group 1's keys (the 64-bit keys of (hash, 1))
    assert first == [KvEvent("stored", (1, 2, group_key(1, 1), group_key(2, 1)))]
    assert second == [KvEvent("stored", (3, 4, group_key(3, 1), group_key(4, 1)))]
    assert slid == []  # a window's slide unpins: no event until the blocks are evicted
    # the next request's chunk wants a free block in each group: the window's unpinned blocks go, deepest first
    # (block 1's hash 2, then block 0's hash 1), and its block is stored in each group
    assert evicted == [KvEvent("removed", (2, 1)), KvEvent("stored", (5, group_key(5, 1)))]
    keys = _keys()
    assert keys.index_group == 1  # the full-attention group carries the prefix
    # each chunk one event per group, in group order (vLLM's cache_blocks stores group by group)
    assert keys.resolve(first) == [KvEvent("stored", (1, 2), 0, 0), KvEvent("stored", (1, 2), 0, 1)]
    assert keys.resolve(second) == [KvEvent("stored", (3, 4), 0, 0), KvEvent("stored", (3, 4), 0, 1)]
    assert keys.resolve(evicted) == [KvEvent("removed", (2, 1), 0, 0), KvEvent("stored", (5,), 0, 0),
                                     KvEvent("stored", (5,), 0, 1)]
    assert len(keys) == 5  # the group-1 keys of blocks 1-5, each held in group 1
    # what the index applies: the full group's, as group 0's
    assert for_index(keys.lookup([*first, *second]), 1) == [KvEvent("stored", (1, 2)), KvEvent("stored", (3, 4))]
    # untaught, a block's hash stored in group 0 teaches its keys before the event is read (group 0's come first)...
    assert GroupKeys(GROUPS).resolve(first) == [KvEvent("stored", (1, 2), 0, 0), KvEvent("stored", (1, 2), 0, 1)]
    # ... but a key of group 1 alone (its group-0 copy let go) reads as group 0's: why requests teach their blocks
    assert GroupKeys(GROUPS).resolve([KvEvent("stored", (group_key(5, 1),))]) == [
        KvEvent("stored", (group_key(5, 1),))]


def test_every_group_stores_in_group_order_a_state_group_first_and_a_response_stored_at_finish():
    # Qwen3-Next's order, a state group before the full one: a chunk of 32 tokens ends on block 1's end, so the
    # state group keys its state there (its key is the hash: group 0) and the full group takes blocks 0 and 1
    state_first = KvGroups((KvGroup(STATE, 1, 0, 4), KvGroup(FULL, 1)), 1)
    base = BlockPool(16, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, state_first)
    pool.extend(pool.acquire(Lookup([1, 2, 3], "a", 0.0, 48)), 32, 3)
    drained = base.drain_events()
    assert drained == [KvEvent("stored", (2, group_key(1, 1), group_key(2, 1)))]
    keys = GroupKeys(state_first)
    keys.teach([1, 2, 3])
    assert keys.resolve(drained) == [KvEvent("stored", (2,), 0, 0), KvEvent("stored", (1, 2), 0, 1)]
    # a response's blocks stored as its request finishes (none filled while decoding): the window group 0's first,
    # then the full group's, whose new blocks pick what every group stores
    base = BlockPool(8, make_policy("lru"), block_size=16, hit_mode="prefix")
    pool = GroupedPool(base, GROUPS)
    assert pool.store([7, 8], "a") == [7, 8]
    drained = base.drain_events()
    assert drained == [KvEvent("stored", (7, 8)), KvEvent("stored", (group_key(7, 1), group_key(8, 1)))]
    keys = GroupKeys(GROUPS)
    keys.teach([7, 8])
    assert keys.resolve(drained) == [KvEvent("stored", (7, 8), 0, 0), KvEvent("stored", (7, 8), 0, 1)]


def test_vllm_wire_publishes_every_group_with_its_index_and_kind():
    first, second, _, evicted = _prompt_slide_evict()
    keys = _keys()
    t = EventTranslator(16, groups=GROUPS)
    t.register([1, 2, 3, 4])
    t.register([5])

    def stored_event(hashes, parent, group):
        window = {"kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 32} if group == 0 else \
            {"kv_cache_spec_kind": "full_attention"}  # omit_defaults: a full group's window (None) is left out
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": [],
                "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": group, **window}

    # a BlockStored per group, group 0's first; the second chunk's parent is block 1 in each group
    assert t.translate(keys.resolve(first)) == [stored_event([1, 2], None, 0), stored_event([1, 2], None, 1)]
    assert t.translate(keys.resolve(second)) == [stored_event([3, 4], 2, 0), stored_event([3, 4], 2, 1)]
    assert t.translate(keys.resolve(evicted)) == [
        {"type": "BlockRemoved", "block_hashes": [2, 1], "medium": "GPU", "group_idx": 0},
        stored_event([5], None, 0), stored_event([5], None, 1)]
    # msgspec's array_like form: extra_keys (None) keeps its place, a trailing default is dropped
    array = EventTranslator(16, "array", groups=GROUPS)
    array.register([1, 2, 3, 4])
    keys = _keys()
    assert [*array.translate(keys.resolve(first)), *array.translate(keys.resolve(second))] == [
        ["BlockStored", [1, 2], None, [], 16, None, "GPU", None, None, 0, "sliding_window", 32],
        ["BlockStored", [1, 2], None, [], 16, None, "GPU", None, None, 1, "full_attention"],
        ["BlockStored", [3, 4], 2, [], 16, None, "GPU", None, None, 0, "sliding_window", 32],
        ["BlockStored", [3, 4], 2, [], 16, None, "GPU", None, None, 1, "full_attention"]]


def test_one_group_keeps_the_wire_it_had():
    t = EventTranslator(16)
    t.register([1, 2])
    assert t.translate([KvEvent("stored", (1, 2)), KvEvent("removed", (2,))]) == [
        {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [], "block_size": 16,
         "lora_id": None, "medium": "GPU", "lora_name": None},
        {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}]


def test_kvemu_feed_and_index_hold_each_block_once():
    first, second, _, evicted = _prompt_slide_evict()
    keys = _keys()
    feed = EventFeed("r0", lambda: [], index_group=keys.index_group)
    for drained in (first, second, evicted):  # the window's removals are not the index's: only block 5's store
        feed.publish(keys.resolve(drained))
    assert [b.to_wire()["events"] for b in feed.since(0)] == [[["stored", (1, 2)]], [["stored", (3, 4)]],
                                                              [["stored", (5,)]]]
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
    now = s.step(0.0, horizon=0.0).duration  # one step at a time (no decode run)
    s.step(now, horizon=now)  # token 100 decodes: the window reads tokens 69.., its blocks 0-3 are gone
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
        now += s.step(now, horizon=now).duration  # one step at a time (no decode run)
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
