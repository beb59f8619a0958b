"""KV cache groups (replica/core/cache/groups.py), hand-worked against vLLM's hybrid KV cache manager's rules."""

import pytest

from replica.core.cache.groups import group_key, hit_blocks, skipped_blocks, window_hit
from shared.kv_groups import FULL, WINDOW, KvGroup, full_attention, group_layers


def test_a_full_attention_model_is_one_group_of_all_its_layers():
    g = full_attention(32)
    assert g.groups == (KvGroup(FULL, 32),) and g.group_size == 32 and not g.hybrid
    assert g.block_bytes(1000) == 32_000  # a block: every layer's page, as before groups
    assert group_key(12345, 0) == 12345  # group 0 keys blocks by their hash: nothing changes


def test_gpt_oss_alternating_layers_make_two_groups_of_half_the_layers():
    g = group_layers([(WINDOW, 128), (FULL, 0)] * 12)
    assert g.groups == (KvGroup(WINDOW, 12, 128), KvGroup(FULL, 12)) and g.group_size == 12


def test_gemma3_five_local_to_one_global_makes_one_full_and_six_window_groups():
    # 62 layers, every sixth global: 10 full, 52 local of 1,024 tokens; groups of the fewest (10) layers,
    # the 52 local ones dealt round-robin over ceil(52 / 10) = 6 groups: 9, 9, 9, 9, 8, 8
    g = group_layers([(FULL, 0) if (i + 1) % 6 == 0 else (WINDOW, 1024) for i in range(62)])
    assert g.group_size == 10
    assert [(x.kind, x.layers) for x in g.groups] == [(WINDOW, 9)] * 4 + [(WINDOW, 8)] * 2 + [(FULL, 10)]


def test_kinds_under_one_and_a_half_times_apart_pad_to_the_larger():
    g = group_layers([(FULL, 0)] * 9 + [(WINDOW, 64)] * 7)  # 9 < 7 x 1.5: one group each, the window's padded
    assert g.group_size == 9 and [x.layers for x in g.groups] == [9, 7]
    g = group_layers([(FULL, 0)] * 15 + [(WINDOW, 64)] * 10)  # 15 = 10 x 1.5: groups of 10, the full layers in 2
    assert g.group_size == 10 and [(x.kind, x.layers) for x in g.groups] == [(FULL, 8), (FULL, 7), (WINDOW, 10)]


def test_other_groups_key_the_same_block_apart():
    assert len({group_key(7, 0), group_key(7, 1), group_key(7, 2), group_key(8, 1)}) == 4
    assert group_key(7, 1) == group_key(7, 1) < 1 << 64


def test_a_window_of_two_blocks_frees_the_blocks_it_has_moved_past():
    # window 32 tokens, blocks of 16: a 100-token prompt then 5 blocks (80 tokens) of decode
    assert skipped_blocks(32, 100, 16) == 4  # tokens 69..99 still read: blocks 0-3 go
    assert [skipped_blocks(32, 100 + 16 * k, 16) for k in range(1, 6)] == [5, 6, 7, 8, 9]
    assert skipped_blocks(32, 31, 16) == 0 and skipped_blocks(32, 47, 16) == 1  # token 16 on: block 0 unread


def test_a_window_hit_ends_at_the_last_run_of_enough_blocks():
    # window 48, blocks of 16: a hit needs ceil(47 / 16) = 3 held blocks before its end
    assert window_hit([True] * 10, 48, 16) == 10
    assert window_hit([False] * 6 + [True] * 3 + [False], 48, 16) == 9
    assert window_hit([False, False, True, True, True, False, False, True, True, False], 48, 16) == 5
    assert window_hit([True, True, False, True, True, False], 48, 16) == 2  # no run of 3: the run from block 0
    assert window_hit([False, True, True, False], 48, 16) == 0


def test_a_prefix_hit_is_the_longest_every_group_serves():
    groups = group_layers([(FULL, 0), (WINDOW, 48)])
    full_held = set(range(10))
    window_held = {2, 3, 4, 7, 8}
    held = lambda g, i: i in (full_held if groups.groups[g].kind == FULL else window_held)  # noqa: E731
    assert hit_blocks(groups, held, 10, 16) == 5  # the window's last run of 3 ends at block 5
    window_held = {6, 7, 8}
    assert hit_blocks(groups, held, 10, 16) == 9
    full_held = set(range(7))  # the full group stops at 7; the window holds 4, 5, 6 before it
    window_held = {2, 3, 4, 5, 6}
    assert hit_blocks(groups, held, 10, 16) == 7
    full_held = set(range(6))
    assert hit_blocks(groups, held, 10, 16) == 6
    assert hit_blocks(groups, held, 3, 16) == 0  # at most 3 blocks: the window holds 2 of them, not block 0


def test_bad_kinds_are_refused():
    with pytest.raises(ValueError):
        group_layers([("mamba", 0)])
    with pytest.raises(ValueError):
        group_layers([])


def test_the_core_runs_a_window_on_a_grouped_pool_and_refuses_what_cannot_run_with_it_in_one_line(tmp_path):
    import json
    from dataclasses import replace

    from replica.core.build import CoreSettings, EngineKnobs, build_core, check_groups
    from replica.core.cache.grouped import GroupedPool
    from shared.costmodel import CostModel
    from shared.errors import InputError

    check_groups(CostModel.from_names())  # the default preset: one full-attention group
    cfg = {"architectures": ["MistralForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
           "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
           "sliding_window": 64}
    path = tmp_path / "mistral-tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    cost = CostModel.from_names(str(path))
    core = build_core(CoreSettings(capacity_blocks=100), cost)
    assert isinstance(core.serving, GroupedPool) and core.serving.width == 1  # one window group: still a table
    with pytest.raises(InputError) as err:
        build_core(CoreSettings(capacity_blocks=100, knobs=replace(EngineKnobs(), scheduler="reorder")), cost)
    assert str(err.value) == ("--scheduler: mistral-tiny has sliding-window layers (KV cache groups,"
                              " cache/grouped.py): reorder's loans count one group's blocks: use --scheduler fcfs")
