"""State layers (Qwen3-Next's Gated DeltaNet linear attention) read from config.json into KV cache groups and
sized as vLLM 0.33 sizes them, hand-worked with Qwen3-Next-80B-A3B's published numbers."""

import json

import pytest

from shared.costmodel import CostModel
from shared.errors import InputError
from shared.kv_groups import FULL, STATE, KvGroup, group_layers, state_block_size

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, the fields that size the model (no layer_types: transformers
# derives them from full_attention_interval)
QWEN3_NEXT_80B = {"architectures": ["Qwen3NextForCausalLM"], "decoder_sparse_step": 1, "full_attention_interval": 4,
                  "head_dim": 256, "hidden_size": 2048, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
                  "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                  "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [],
                  "model_type": "qwen3_next", "moe_intermediate_size": 512, "num_attention_heads": 16,
                  "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
                  "rope_scaling": None, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
                  "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}
# one Gated DeltaNet layer's state: conv (2 x 16 x 128 + 32 x 128) x (4 - 1) = 24,576 values, recurrent
# 32 x 128 x 128 = 524,288 values; 548,864 values x 2 bytes
GDN_STATE = 1_097_728


def _config(tmp_path, **change) -> str:
    cfg = {**QWEN3_NEXT_80B, **change}
    path = tmp_path / "Qwen3-Next-80B-A3B" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({k: v for k, v in cfg.items() if v is not None or k == "rope_scaling"}))
    return str(path)


def test_qwen3_next_reads_three_state_groups_and_one_full_group(tmp_path):
    cost = CostModel.from_names(_config(tmp_path))
    m = cost.model
    assert [k for k, _ in m.layer_kinds[:4]] == [STATE, STATE, STATE, FULL]  # layer 4k + 3 is full attention
    assert {size for k, size in m.layer_kinds if k == STATE} == {GDN_STATE}
    g = m.kv_groups  # 36 state layers, 12 full: groups of the fewest (12), the state layers first as they come
    assert g.group_size == 12 and g.state_bytes == GDN_STATE
    assert g.groups == (KvGroup(STATE, 12, 0, GDN_STATE),) * 3 + (KvGroup(FULL, 12),)
    assert m.attention_layers == 12
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2  # only the full-attention layers keep KV per token
    assert (m.experts, m.active_experts, m.shared_experts, m.intermediate) == (512, 10, 1, 512)


def test_layer_types_given_are_read_as_written(tmp_path):
    types = ["linear_attention", "full_attention"] * 24
    m = CostModel.from_names(_config(tmp_path, layer_types=types)).model
    assert [k for k, _ in m.layer_kinds[:2]] == [STATE, FULL] and m.attention_layers == 24


def test_the_block_holds_a_state_in_one_layers_attention_page_as_vllm_raises_it(tmp_path):
    path = _config(tmp_path)
    # one full-attention layer's token on one rank: 2 (K, V) x 2 heads x 256 x 2 bytes = 2,048; a state needs
    # ceil(1,097,728 / (16 x 2,048)) = 34 kernel blocks of 16: 544 tokens (vLLM's "Setting attention block size")
    assert CostModel.from_names(path).kv_block_size(16) == 544
    # --tp 2: a head a rank (1,024 bytes a token), half the state: the same 544
    assert CostModel.from_names(path, "h100@tp2").kv_block_size(16) == 544
    # --tp 4: still one head a rank (replicated), a quarter of the state: ceil(274,432 / 16,384) = 17 -> 272
    assert CostModel.from_names(path, "h100@tp4").kv_block_size(16) == 272
    # a block: one group's page, 12 layers of 544 tokens x 2,048 bytes (the state padded 1,097,728 -> 1,114,112)
    assert CostModel.from_names(path).block_bytes(544) == 13_369_344
    # a configured block past what the state needs is a multiple of itself: 1,024 tokens hold the state
    assert CostModel.from_names(path).kv_block_size(1024) == 1024
    assert state_block_size(64, 1_097_728, 2_048) == 576  # 9 blocks of 64 tokens
    assert state_block_size(16, 0, 2_048) == 16  # no state: the block as configured


def test_the_memory_rule_counts_blocks_of_the_raised_size(tmp_path):
    from shared.memory_rule import kv_budget

    cost = CostModel.from_names(_config(tmp_path), "h200@tp2")  # 80B parameters in BF16: two H200s
    budget = kv_budget(cost, 0.9, 8192, 256, 16)
    assert budget.block_size == 544
    # a GPU holds half of each 12-layer page of 544 tokens: 13,369,344 / 2 bytes
    assert budget.blocks == int(budget.kv_bytes // 6_684_672) > 0


@pytest.mark.parametrize("change, expected", [
    ({"linear_conv_kernel_dim": None}, "'linear_conv_kernel_dim' is missing"),
    ({"linear_conv_kernel_dim": 1}, "'linear_conv_kernel_dim' must be >= 2"),
    ({"layer_types": ["linear_attention"] * 48}, "'layer_types' has no full_attention layer"),
    ({"layer_types": ["mamba"] * 48}, "'layer_types' has mamba: kvemu models full_attention, sliding_attention,"
                                      " linear_attention"),
    ({"shared_expert_intermediate_size": 1024}, "'shared_expert_intermediate_size' (1024) differs"),
    ({"architectures": ["Qwen3ForCausalLM"], "intermediate_size": 5120, "layer_types": ["linear_attention"] * 48},
     "'layer_types' has linear_attention in a Qwen3ForCausalLM"),
    ({"hybrid_override_pattern": "M-M*-"}, "'hybrid_override_pattern' is set: Mamba2 state layers"),
    ({"mamba_d_ssm": 1024}, "'mamba_d_ssm' is set: Mamba2 state layers"),
])
def test_state_layers_kvemu_cannot_model_are_refused_naming_the_field(tmp_path, change, expected):
    with pytest.raises(InputError) as err:
        CostModel.from_names(_config(tmp_path, **change))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_groups_key_states_of_one_size_together():
    g = group_layers([(STATE, 100), (FULL, 0), (STATE, 100), (STATE, 100)])  # groups of the fewest, 1 layer
    assert g.groups == (KvGroup(STATE, 1, 0, 100),) * 3 + (KvGroup(FULL, 1),) and g.group_size == 1
    g = group_layers([(STATE, 100), (STATE, 100), (FULL, 0), (STATE, 200), (FULL, 0), (STATE, 200)])
    assert g.groups == (KvGroup(STATE, 2, 0, 100), KvGroup(FULL, 2), KvGroup(STATE, 2, 0, 200))
    assert g.group_size == 2 and g.state_bytes == 200
    assert g.describe()[0] == {"group": 0, "kind": STATE, "layers": 2, "state_bytes": 100}
    with pytest.raises(ValueError):
        group_layers([(STATE, 100)])  # no attention page to size a block by


def test_the_shipped_config_json_reads_as_the_fields_above():
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "bench" / "data" / "models" / "qwen3-next-80b-a3b" / "config.json"
    fields = json.loads(shipped.read_text())
    assert {k: fields[k] for k in QWEN3_NEXT_80B} == QWEN3_NEXT_80B
    m = CostModel.from_names(str(shipped)).model
    assert m.kv_groups.state_bytes == GDN_STATE and m.attention_layers == 12
