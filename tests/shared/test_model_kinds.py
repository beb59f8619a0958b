"""MLA and the KV cache dtype (shared/model_kinds.py), hand-worked: DeepSeek-V3's KV bytes a token on any --tp and
in FP8, its preset against its published config.json, the memory rule's blocks with 1-byte KV elements, the
absorbed decode's and the normal prefill's attention, and the one-line refusals."""

import argparse
import json
import os

import pytest

from kvemu.options.kv_cache_dtype import model_setting
from replica.backends import check_backend_flags
from shared.costmodel import CostModel, StepWork, get_gpu, get_model
from shared.errors import InputError
from shared.model_kinds import MlaDims, served_model, split_kv_dtype, with_kv_dtype
from shared.model_presets import MODELS

DEEPSEEK_V3_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "data", "models", "deepseek-v3",
                                "config.json")


@pytest.mark.parametrize("tp", [1, 4, 8])
def test_deepseek_v3_keeps_70272_bytes_a_token_on_every_gpu_whatever_the_tp(tp):
    cost = CostModel(MODELS["deepseek-v3"], get_gpu("h200"), tp=tp)
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes (bfloat16), replicated on every rank
    assert cost.kv_bytes_per_token == cost.kv_bytes_per_gpu_token == (512 + 64) * 61 * 2 == 70_272
    assert cost.block_bytes(16) == 70_272 * tp * 16  # a block of the replica: one copy on each of its GPUs
    fp8 = CostModel(get_model("deepseek-v3@kv=fp8"), get_gpu("h200"), tp=tp)
    assert fp8.kv_bytes_per_gpu_token == (512 + 64) * 61 * 1 == 35_136


def test_grouped_kv_heads_split_over_tp_until_each_rank_has_one():
    llama = MODELS["llama-3.1-8b"]  # 8 KV heads: 131,072 bytes a token, split over up to 8 ranks
    assert CostModel(llama, get_gpu("h200"), tp=4).kv_bytes_per_gpu_token == 131_072 / 4
    # Qwen3-Coder's 4 KV heads at --tp 8: vLLM gives each rank one whole head, every head held twice
    qwen = CostModel(MODELS["qwen3-coder-30b-a3b"], get_gpu("h200"), tp=8)
    assert qwen.kv_bytes_per_gpu_token == 2 * 48 * 1 * 128 * 2 == 24_576
    assert qwen.block_bytes(16) == 2 * 98_304 * 16


def test_the_deepseek_v3_preset_is_its_published_config_and_671b_parameters():
    spec = get_model(DEEPSEEK_V3_PATH)
    assert spec is MODELS["deepseek-v3"]  # every field equal: the preset itself, name and all
    assert spec.mla == MlaDims(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                               q_lora_rank=1536)
    assert (spec.dense_layers, spec.dense_intermediate, spec.shared_experts) == (3, 18432, 1)
    assert (spec.experts, spec.active_experts, spec.intermediate, spec.fp8_weights) == (256, 8, 2048, True)
    assert spec.max_context == 4096 * 40  # YaRN: original_max_position_embeddings x factor
    # attention a layer: q_a 7168 x 1536, q_b 1536 x 128 x 192, kv_a 7168 x 576, kv_b 512 x 128 x 256, o 128 x 128 x 7168
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert attn == spec.attn_params == 187_105_280
    dense = 3 * (attn + 3 * 7168 * 18432)
    moe = 58 * (attn + 7168 * 256 + (256 + 1) * 3 * 7168 * 2048)
    # DeepSeek-V3's weight notes: 671B parameters in the main model (embedding and head included)
    assert spec.total_params == dense + moe + 2 * 129280 * 7168 == 671_025_397_760
    # FP8 layers, 16-bit embedding and head
    assert spec.weight_bytes == dense + moe + 2 * 2 * 129280 * 7168


def test_fp8_kv_fits_the_memory_rule_blocks_of_one_byte_elements():
    """Llama-3.1-8B on one H100 at 0.9, 8,192 batched tokens, 256 sequences, blocks of 16 (shared/memory_rule.py):
    ceil(85,029,158,912 x 0.9) = 76,526,243,021 bytes, less the weights 16,094,076,928 (8,029,995,008 parameters x 2,
    norms 65 x 4,096 x 2, rotary 131,072 x 128 x 2), the sampler's peak 986,447,872 (8,192 x 4,096 x 2 + 256 x
    128,256 x 28) and non-torch 0.25 GiB: 59,177,282,765 bytes of KV, the same under either dtype. A block is
    16 x 32 layers x 2 x 8 heads x 128 values: 2 MiB in BF16, 1 MiB in FP8."""
    bf16 = CostModel.from_names("llama-3.1-8b", "h100").kv_budget(0.9, 8192, 256, 16)
    fp8 = CostModel.from_names(model_setting(argparse.Namespace(model="llama-3.1-8b", kv_cache_dtype="fp8")),
                               "h100").kv_budget(0.9, 8192, 256, 16)
    assert bf16.kv_bytes == fp8.kv_bytes == 76_526_243_021 - 16_094_076_928 - 986_447_872 - 268_435_456
    assert bf16.blocks == 59_177_282_765 // 2_097_152 == 28_217
    assert fp8.blocks == 59_177_282_765 // 1_048_576 == 56_435


def test_mla_decode_is_absorbed_and_prefill_is_the_normal_form():
    h200 = get_gpu("h200")
    for tp in (1, 8):
        cost = CostModel(MODELS["deepseek-v3"], h200, tp=tp)
        eff = cost.efficiency
        decode = cost.step_parts(StepWork(decoders=1, decode_kv=1000))
        # per context token and layer 2 x 128 heads x (576 + 512): QK over the latent and rope, PV over the latent
        assert decode.decode_attention == pytest.approx(1000 * 2 * 128 * 1088 * 61 / (h200.peak_flops * tp * eff.attention))
        # every rank reads the whole latent: --tp does not shorten the read
        assert decode.decode_kv == pytest.approx(1000 * 70_272 / (h200.hbm_bandwidth * eff.decode_kv_eff))
        prefill = cost.step_parts(StepWork.of([(100, 0)]))
        # 2 x 128 heads x (128 + 64 + 128) a query-key pair and layer, over 100 x 99 / 2 pairs
        assert prefill.attention == pytest.approx(4950 * 2 * 128 * 320 * 61 / (h200.peak_flops * tp * eff.attention))


def test_fp8_kv_halves_the_decode_read_and_the_cached_prefix_read():
    base = CostModel.from_names("llama-3.1-8b", "h200")
    fp8 = CostModel.from_names("llama-3.1-8b@kv=fp8", "h200")
    work = StepWork.of([(16, 4096)], decoders=8, decode_kv=32_000)
    a, b = base.step_parts(work), fp8.step_parts(work)
    assert b.decode_kv == pytest.approx(a.decode_kv / 2)
    assert b.kv_read == pytest.approx(a.kv_read / 2)
    assert (b.linear, b.attention, b.weights) == (a.linear, a.attention, a.weights)


def test_the_kv_dtype_travels_in_the_model_setting():
    assert with_kv_dtype("deepseek-v3", "fp8") == "deepseek-v3@kv=fp8"
    assert with_kv_dtype("deepseek-v3@kv=fp8", "auto") == "deepseek-v3@kv=fp8"  # a replica given up's setting
    assert with_kv_dtype("llama-3.1-8b", "auto") == "llama-3.1-8b"
    assert split_kv_dtype("/m/config.json@kv=fp8_e5m2") == ("/m/config.json", "fp8_e5m2")
    assert served_model("deepseek-v3@kv=fp8") == "deepseek-v3" and served_model("tiny") == "tiny"
    assert get_model("deepseek-v3@kv=fp8_e4m3").name == "deepseek-v3"  # a device profile fitted for it applies


@pytest.mark.parametrize(("model", "dtype", "message"), [
    ("llama-3.1-8b", "fp9", "--kv-cache-dtype: unknown KV cache dtype 'fp9'; valid: auto, fp8, fp8_e4m3, fp8_e5m2"),
    ("llama-3.1-8b", "bf16", "--kv-cache-dtype: unknown KV cache dtype 'bf16'"),
    ("deepseek-v3", "fp8_e5m2", "--kv-cache-dtype: fp8_e5m2 is not stored by vLLM's MLA backends"),
])
def test_a_kv_dtype_unknown_or_unsupported_is_refused_in_one_line(model, dtype, message):
    with pytest.raises(InputError) as err:
        model_setting(argparse.Namespace(model=model, kv_cache_dtype=dtype))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_torch_backend_refuses_what_its_layers_cannot_run():
    args = argparse.Namespace(backend="torch", device="cpu", layers=None, model="tiny@kv=fp8")
    with pytest.raises(InputError, match="--kv-cache-dtype: the torch backend keeps its KV in the model's dtype"):
        check_backend_flags(args)
    with pytest.raises(InputError, match="--backend: the torch backend's layers have no multi-head latent"):
        check_backend_flags(argparse.Namespace(**{**vars(args), "model": "deepseek-v3"}))


def test_config_json_reads_a_deepseek_query_without_compression_and_qwen3_moe_dense_layers(tmp_path):
    with open(DEEPSEEK_V3_PATH, encoding="utf-8") as fh:
        v3 = json.load(fh)
    lite = dict(v3, architectures=["DeepseekV2ForCausalLM"], q_lora_rank=None, quantization_config=None,
                first_k_dense_replace=1, n_shared_experts=2)
    path = tmp_path / "lite" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(lite))
    spec = get_model(str(path))
    assert spec.mla is not None and spec.mla.q_lora_rank == 0 and not spec.fp8_weights
    # the query projected from the hidden state directly: 7168 x 128 x 192 in place of the two LoRA factors
    assert spec.attn_params == 7168 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert (spec.dense_layers, spec.shared_experts) == (1, 2)
    qwen = {"architectures": ["Qwen3MoeForCausalLM"], "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
            "max_position_embeddings": 40960, "mlp_only_layers": [0, 47], "decoder_sparse_step": 1,
            "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
            "num_hidden_layers": 48, "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 151936}
    path = tmp_path / "q" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(qwen))
    dense_two = get_model(str(path))
    assert (dense_two.dense_layers, dense_two.dense_intermediate) == (2, 6144)
    # two layers' 128 experts of 3 x 2048 x 768 and router 2048 x 128 become one MLP of 3 x 2048 x 6144
    every_layer_routed = MODELS["qwen3-30b-a3b"]
    assert dense_two.total_params == (every_layer_routed.total_params
                                      - 2 * (128 * 3 * 2048 * 768 + 2048 * 128) + 2 * 3 * 2048 * 6144)
