"""The presets of issue 54's models from their published config.json, hand-worked: gpt-oss-120b (MXFP4 experts,
alternating 128-token windows), Gemma-3-27B (five 1,024-token local layers to one global, a vision tower) and
Qwen3-Next-80B-A3B (Gated DeltaNet state layers, gated attention): KV bytes a token per group, weight bytes, and
vLLM's memory rule on H200s; a minute of kvemu sim on each sliding-window preset."""

import json
import math
import os

import pytest

from kvemu.cli import main
from shared.costmodel import CostModel, get_gpu, get_model
from shared.errors import InputError
from shared.model_presets import MODELS
from shared.model_spec import MXFP4_WEIGHT_BYTES

GIB, MIB = 1024**3, 1024**2
MODELS_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "data", "models")
# One H200 at vLLM's default 0.9: nvidia-smi's 143,771 MiB less the driver's 476 MiB (shared/memory_rule.py)
H200_REQUESTED = math.ceil(0.9 * (143771 - 476) * MIB)
# google/gemma-3-27b-it's config.json, its fields as published (no verbatim copy was found to ship; the preset's
# source is this list of fields): the text model's, the vision tower's, the dtype
GEMMA_3_27B_IT = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                  "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                                  "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
                                  "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
                                  "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
                  "torch_dtype": "bfloat16",
                  "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                                    "model_type": "siglip_vision_model", "num_attention_heads": 16,
                                    "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}


def test_gpt_oss_120b_is_its_published_config_with_two_groups_of_18_layers():
    spec = get_model(os.path.join(MODELS_DIR, "gpt-oss-120b", "config.json"))
    assert spec is MODELS["gpt-oss-120b"]  # every field: the preset itself
    assert spec.mxfp4_experts and not spec.fp8_weights and spec.max_context == 4096 * 32  # YaRN
    groups = spec.kv_groups
    assert [(g.kind, g.layers, g.window) for g in groups.groups] == [("window", 18, 128), ("full", 18, 0)]
    # a group's page a token: 18 layers x K and V x 8 KV heads x 64 x 2 bytes; the attention sinks hold none
    assert spec.kv_bytes_per_block_token == 18 * 2 * 8 * 64 * 2 == 36_864
    assert spec.kv_bytes_per_token == 36 * 2 * 8 * 64 * 2 == 73_728  # both groups, before a window frees any


def test_gpt_oss_120b_weights_are_mxfp4_experts_beside_bf16_attention_and_embeddings():
    spec = MODELS["gpt-oss-120b"]
    assert MXFP4_WEIGHT_BYTES == 4.25 / 8  # a 4-bit value and an 8-bit scale a block of 32
    attn = 2880 * (64 + 2 * 8) * 64 + 64 * 64 * 2880  # fused QKV and output
    router, expert = 2880 * 128, 3 * 2880 * 2880
    assert spec.total_params == 36 * (attn + router + 128 * expert) + 2 * 201088 * 2880 == 116_788_838_400
    experts = 36 * 128 * expert * 17 // 32  # 4.25 bits a weight, exactly
    assert spec.weight_bytes == experts + 2 * 36 * (attn + router) + 2 * 2 * 201088 * 2880 == 65_168_179_200
    # a fused-MoE layer reads its touched experts at 4.25 bits a weight (one token, its 4 experts)
    cost = CostModel(spec, get_gpu("h200"))
    eff = cost.efficiency
    read = 4 * expert * MXFP4_WEIGHT_BYTES / (cost.gpu.hbm_bandwidth * eff.moe_memory_eff)
    assert cost.moe_layer_s(1, 4) == pytest.approx(eff.moe_floor_s + read, rel=1e-12)


def test_gpt_oss_120b_on_one_h200_by_the_memory_rule():
    weights = 65_168_179_200 + (2 * 36 + 1) * 2880 * 2 + 131072 * 64 * 2  # the norms and the rotary cache
    sampler = 8192 * 2880 * 2 + 256 * 201088 * 28  # the sampler run beats the forward
    kv = H200_REQUESTED - weights - sampler - 0.25 * GIB
    b = CostModel(MODELS["gpt-oss-120b"], get_gpu("h200")).kv_budget(0.9, 8192, 256, 16)
    assert (b.weight_bytes, b.activation_bytes, b.kv_bytes) == (weights, sampler, kv)
    assert b.blocks == int(kv // (36_864 * 16)) == 115_776  # a block: one group's 18 layers of 16 tokens


def test_gemma_3_27b_reads_the_text_model_and_counts_the_vision_tower(tmp_path):
    path = tmp_path / "gemma-3-27b-it" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(GEMMA_3_27B_IT))
    spec = get_model(str(path))
    assert spec is MODELS["gemma-3-27b"]
    # transformers' defaults fill the rest: vocab 262,208, tied, 131,072 positions, unscaled (vLLM skips gemma3's)
    assert (spec.vocab, spec.tied_embeddings, spec.max_context) == (262_208, True, 131_072)
    # SigLIP: 27 layers of q, k, v, o and a 4,304 MLP, 14 x 14 x 3 patches, 64 x 64 positions; the projector
    assert spec.vision_params == 27 * (4 * 1152**2 + 2 * 1152 * 4304) + 588 * 1152 + 4096 * 1152 + 1152 * 5376
    layer = 5376 * (32 + 32) * 128 + 32 * 128 * 5376 + 3 * 5376 * 21504
    assert spec.total_params == 62 * layer + 262_208 * 5376 + 422_659_584 == 27_430_651_392
    assert spec.weight_bytes == 2 * 27_430_651_392
    # every sixth layer global: 10 full layers, 52 local in six groups of at most 10
    groups = spec.kv_groups
    assert [(g.kind, g.layers) for g in groups.groups] == [("window", 9)] * 4 + [("window", 8)] * 2 + [("full", 10)]
    assert spec.kv_bytes_per_block_token == 10 * 2 * 16 * 128 * 2 == 81_920
    assert spec.kv_bytes_per_token == 62 * 2 * 16 * 128 * 2 == 507_904
    bad = dict(GEMMA_3_27B_IT, text_config=dict(GEMMA_3_27B_IT["text_config"], num_hidden_layers=0))
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"'text_config.num_hidden_layers' must be an integer >= 1, got 0$"):
        get_model(str(path))


def test_gemma_3_27b_on_one_h200_by_the_memory_rule():
    weights = 2 * 27_430_651_392 + (2 * 62 + 1) * 5376 * 2 + 131072 * 128 * 2
    sampler = 8192 * 5376 * 2 + 256 * 262_208 * 28
    kv = H200_REQUESTED - weights - sampler - 0.25 * GIB
    b = CostModel(MODELS["gemma-3-27b"], get_gpu("h200")).kv_budget(0.9, 8192, 256, 16)
    assert (b.weight_bytes, b.activation_bytes, b.kv_bytes) == (weights, sampler, kv)
    assert b.blocks == int(kv // (81_920 * 16)) == 59_583


def test_qwen3_next_80b_a3b_is_its_published_config_of_gated_deltanet_and_gated_attention():
    spec = get_model(os.path.join(MODELS_DIR, "qwen3-next-80b-a3b", "config.json"))
    assert spec is MODELS["qwen3-next-80b-a3b"] and spec.max_context == 262_144
    # KV only in the 12 full-attention layers: K and V x 2 KV heads of 256 x 2 bytes; a Gated DeltaNet layer keeps
    # one state a sequence: the conv's 3 taps over q, k, v (2 x 16 x 128 + 32 x 128) and 32 heads of 128 x 128
    assert spec.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576
    assert spec.kv_groups.state_bytes == (8192 * 3 + 32 * 128 * 128) * 2 == 1_097_728
    # weights: gated attention (q_proj emits query and gate), the DeltaNet layers' projections and conv, the
    # routed and the shared expert, the router, untied embeddings
    attn = 2048 * (2 * 16 + 2 * 2) * 256 + 16 * 256 * 2048
    gdn = 2048 * 12288 + 2048 * 64 + 8192 * 4 + 4096 * 2048
    moe = 2048 * 512 + (512 + 1) * 3 * 2048 * 512
    assert spec.total_params == 12 * attn + 36 * gdn + 48 * moe + 2 * 151936 * 2048 == 79_674_081_280
    assert spec.weight_bytes == 2 * 79_674_081_280  # BF16: 148.4 GiB, more than one H200 holds


def test_qwen3_next_80b_a3b_at_tp_2_on_h200s_by_the_memory_rule():
    weights = 79_674_081_280 + (2 * 48 + 1) * 2048 * 2 + 262144 * 256 * 2  # half the matrices on each GPU
    sampler = 8192 * 2048 * 2 + 256 * 151936 * 28
    kv = H200_REQUESTED - weights - sampler - 2.07 * GIB  # non-torch memory at TP 2
    b = CostModel(MODELS["qwen3-next-80b-a3b"], get_gpu("h200"), tp=2).kv_budget(0.9, 8192, 256, 16)
    assert (b.weight_bytes, b.activation_bytes, b.kv_bytes) == (weights, sampler, kv)
    # a block is raised to 544 tokens: one layer's page on a rank (1 KV head: 1,024 bytes a token) holds half a
    # state (548,864 bytes), in multiples of 16; a block is 12 layers' pages
    assert b.block_size == 544 and b.blocks == int(kv // (12 * 544 * 1024)) == 7_790


@pytest.mark.parametrize(("model", "blocks", "page"), [("gpt-oss-120b", 115_776, 36_864),
                                                       ("gemma-3-27b", 59_583, 81_920)])
def test_kvemu_sim_runs_the_sliding_window_presets_for_a_minute(tmp_path, capsys, model, blocks, page):
    out = tmp_path / "run.json"
    assert main(["sim", "--workload", "chat", "--duration", "60", "--model", model, "--quiet", "--json", str(out)]) == 0
    assert capsys.readouterr().err.startswith(f"capacity ({model}): ceil(0.9 x 139.94 GiB of h200)")
    run = json.loads(out.read_text())["runs"][0]
    assert (run["capacity_blocks"], run["capacity_bytes"]) == (blocks, blocks * page * 16)  # a block: one group's
    assert run["refused"] == 0 and run["requests"] > 0
