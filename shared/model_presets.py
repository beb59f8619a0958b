"""The model presets (``--model NAME``): each shape as its Hugging Face config.json publishes it, its context
window, and the efficiencies its steps were fitted with (``DENSE_H200``, ``MOE_H200``; docs/calibration.md);
``get_model`` names one, or reads a config.json (``model_from_config``), with ``@kv=DTYPE`` its KV cache dtype.
"""

from __future__ import annotations

from dataclasses import replace

from shared import model_kinds as kinds
from shared.devspecs import Efficiency
from shared.errors import UnknownNameError
from shared.hf_config import is_config_path, load_config
from shared.kv_groups import FULL, STATE, WINDOW
from shared.model_kinds import MlaDims
from shared.model_spec import ModelSpec
from shared.moe_cost import FUSED_MOE_H200

# Fitted on the dense decoder layer stack of llama-3-8b on one H200 (7 prefill points, PyTorch
# SDPA, bf16; docs/calibration.md): mean error 1.2%, max 2.8% on those points; fitted on all
# but one, the left-out point within 3.5% on average, 10.8% at worst (bench/bench_costmodel_fit.py).
# A graph-replayed step's fixed cost, GRAPH_LAYER_S a layer, is not fitted (no graphed step was
# measured here): see its definition.
# vLLM's captured decode layer: 4 GEMMs, 2 add+RMSNorms, rotary, KV write, attention (2 with split-KV), SiLU-and-mul
GRAPH_NODES_PER_LAYER = 11
# The device-side gap between dependent kernels of a replayed graph: an estimate (sub-microsecond on
# recent GPUs), not a measurement; `bench/bench_step_cost.py --device cuda --decode-sweep` measures it.
GRAPH_NODE_S = 0.5e-6
# What a graph replay still costs a layer: every kernel node's launch gap (Vidur's per-kernel times,
# bench/bench_costmodel_vidur.py, exclude these gaps). The layer's small kernels' own time is in
# ``memory``: at batch 1 Vidur's H100 profile has llama-2-70b's GEMVs at 0.86 of HBM, and with them
# the norms, rotary and activation, at 0.80 (docs/calibration.md, "Decode at small batch").
GRAPH_LAYER_S = GRAPH_NODES_PER_LAYER * GRAPH_NODE_S
_K = FUSED_MOE_H200  # every H200 preset's fused-MoE layer, tiny-moe's too (bench/fit_moe.py)
DENSE_H200 = Efficiency(0.6432, 0.3415, 0.2162, 0.80, 5.09e-5, GRAPH_LAYER_S,
                        "llama-3-8b layer stack, 1x H200, PyTorch SDPA (docs/calibration.md)",
                        moe_floor_s=_K.floor_s, moe_memory=_K.memory, moe_linear=_K.linear)
# When Fancy Eviction Fails (arXiv 2609.28870; Qwen3-Coder-30B-A3B on one H200: 8K tokens from
# scratch 166 ms, after a 64K cached prefix 966 ms), measured on a serving stack whose attention
# reads the prefix at HBM speed (kv_read 0.8). Two points, two unknowns (linear, attention), the fused-MoE
# layer priced apart (bench/fit_moe.py solves them): exact on both.
MOE_H200 = Efficiency(0.3124, 0.5427, 0.80, 0.80, 0.0, 0.0,
                      "When Fancy Eviction Fails: Qwen3-Coder-30B-A3B, 1x H200, 8K prefill at depth 0 and 64K",
                        moe_floor_s=_K.floor_s, moe_memory=_K.memory, moe_linear=_K.linear)


# Each shape is its published Hugging Face config.json (num_hidden_layers, num_attention_heads,
# num_key_value_heads, head_dim, hidden_size, intermediate_size / ffn_dim, vocab_size,
# tie_word_embeddings); tests/shared/test_costmodel.py checks each against the published
# parameter count.
_DENSE = {
    # meta-llama/Meta-Llama-3-8B, untied
    "llama-3-8b": (32, 32, 8, 128, 4096, 14336, 128256),
    # meta-llama/Meta-Llama-3-70B, untied
    "llama-3-70b": (80, 64, 8, 128, 8192, 28672, 128256),
    # meta-llama/Llama-3.1-8B: Llama-3-8B's shape, untied, a 131,072-token window (rope_scaling llama3)
    "llama-3.1-8b": (32, 32, 8, 128, 4096, 14336, 128256),
    # Qwen/Qwen3-32B: head_dim 128 set explicitly (hidden 5120 / 64 heads is 80), untied
    "qwen3-32b": (64, 64, 8, 128, 5120, 25600, 151936),
    # Qwen/Qwen3-8B: head_dim 128 set explicitly, tie_word_embeddings false
    "qwen3-8b": (36, 32, 8, 128, 4096, 12288, 151936),
    # The models of FlashGen. meta-llama/Llama-2-13b-hf (multi-head), Llama-2-70b-hf (GQA), untied.
    "llama-2-13b": (40, 40, 40, 128, 5120, 13824, 32000),
    "llama-2-70b": (80, 64, 8, 128, 8192, 28672, 32000),
}
# facebook/opt-13b and facebook/opt-30b: multi-head attention, a two-matrix ReLU MLP of
# ffn_dim = 4 x hidden, the LM head tied to the input embedding.
_OPT = {"opt-13b": (40, 40, 40, 128, 5120, 20480, 50272), "opt-30b": (48, 56, 56, 128, 7168, 28672, 50272)}
# Context windows: each model's config.json max_position_embeddings on Hugging Face (vLLM's
# default --max-model-len): meta-llama/Meta-Llama-3-8B and -70B 8192; Qwen/Qwen3-8B 40960;
# meta-llama/Llama-2-13b-hf and -70b-hf 4096; facebook/opt-13b and opt-30b 2048;
# Qwen/Qwen3-Coder-30B-A3B-Instruct 262144; meta-llama/Llama-3.1-8B 131072; Qwen/Qwen3-32B and
# Qwen/Qwen3-30B-A3B 40960; deepseek-ai/DeepSeek-V3 163840 (YaRN: 4096 x 40); openai/gpt-oss-120b 131072
# (YaRN: 4096 x 32); google/gemma-3-27b-it 131072 (transformers' default, already the scaled window: vLLM applies no
# rope factor to Gemma 3); Qwen/Qwen3-Next-80B-A3B 262144. The tiny shapes are not real models: 32768, chosen here.
CONTEXT = {"llama-3-8b": 8192, "llama-3-70b": 8192, "qwen3-8b": 40960, "llama-2-13b": 4096, "llama-2-70b": 4096,
           "opt-13b": 2048, "opt-30b": 2048, "qwen3-coder-30b-a3b": 262144, "tiny": 32768, "tiny-moe": 32768,
           "llama-3.1-8b": 131072, "qwen3-32b": 40960, "qwen3-30b-a3b": 40960, "deepseek-v3": 163840,
           "gpt-oss-120b": 131072, "gemma-3-27b": 131072, "qwen3-next-80b-a3b": 262144}
# gpt-oss-120b's layer_types: a 128-token sliding window and full attention alternating, the window first
_GPT_OSS_LAYERS = ((WINDOW, 128), (FULL, 0)) * 18
# Gemma 3's sliding_window_pattern 6: five local layers of a 1,024-token window, then one global, from the first
_GEMMA3_LAYERS = tuple((FULL, 0) if (i + 1) % 6 == 0 else (WINDOW, 1024) for i in range(62))
# Gemma-3-27B's SigLIP vision tower as vLLM loads it (hidden 1,152, MLP 4,304, 27 layers, 896-pixel images of
# 14-pixel patches, 3 channels) and its projector into the text model's 5,376: 422,659,584 parameters
_GEMMA3_27B_VISION = 27 * (4 * 1152 * 1152 + 2 * 1152 * 4304) + 3 * 14 * 14 * 1152 + 64 * 64 * 1152 + 1152 * 5376
# Qwen3-Next's Gated DeltaNet layers (linear_num_key_heads 16 and linear_num_value_heads 32 of 128, a conv of 4 taps):
# a sequence's state a layer, the conv state over q, k and v (3 taps kept) and the 32 heads' 128 x 128 recurrent
# state, in BF16 (shared/hf_config.py, gdn_state_bytes); the layer's weights (gdn_params): in_proj_qkvz, in_proj_ba,
# the conv and out_proj
_GDN_STATE = ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2
_GDN_PARAMS = 2048 * (2 * 2048 + 2 * 4096) + 2048 * 2 * 32 + (2 * 2048 + 4096) * 4 + 4096 * 2048
# full_attention_interval 4: three Gated DeltaNet layers, then one of full attention
_QWEN3_NEXT_LAYERS = tuple((FULL, 0) if (i + 1) % 4 == 0 else (STATE, _GDN_STATE) for i in range(48))

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        *(ModelSpec(name, *shape, efficiency=DENSE_H200, max_context=CONTEXT[name]) for name, shape in _DENSE.items()),
        *(ModelSpec(name, *shape, efficiency=DENSE_H200, mlp_matrices=2, tied_embeddings=True,
                    max_context=CONTEXT[name]) for name, shape in _OPT.items()),
        # Qwen/Qwen3-Coder-30B-A3B-Instruct: every layer MoE, 128 experts of moe_intermediate_size
        # 768, 8 a token, 4 KV heads, untied
        ModelSpec("qwen3-coder-30b-a3b", 48, 32, 4, 128, 2048, 768, 151936, 128, 8, efficiency=MOE_H200,
                  max_context=CONTEXT["qwen3-coder-30b-a3b"]),
        # Qwen/Qwen3-30B-A3B: the same shape, a 40,960-token window
        ModelSpec("qwen3-30b-a3b", 48, 32, 4, 128, 2048, 768, 151936, 128, 8, efficiency=MOE_H200,
                  max_context=CONTEXT["qwen3-30b-a3b"]),
        # deepseek-ai/DeepSeek-V3 (bench/data/models/deepseek-v3/config.json): MLA (kv_lora_rank 512, rope 64, nope
        # 128, v 128, q_lora_rank 1536) over 128 heads; 3 dense layers of 18432, then 58 MoE layers of 256 experts of
        # 2048, 8 a token, and one shared expert; FP8 weights (quantization_config fp8), untied. The MTP layer
        # (num_nextn_predict_layers) is not loaded without speculative decoding, so not here.
        ModelSpec("deepseek-v3", 61, 128, 128, 192, 7168, 2048, 129280, 256, 8, efficiency=MOE_H200,
                  max_context=CONTEXT["deepseek-v3"], dense_layers=3, dense_intermediate=18432, shared_experts=1,
                  mla=MlaDims(512, 64, 128, 128, 1536), fp8_weights=True),
        # openai/gpt-oss-120b (bench/data/models/gpt-oss-120b/config.json): 36 layers, 64 query / 8 KV heads of 64,
        # hidden 2,880, every layer routed over 128 experts of 2,880, 4 a token, untied; the experts in MXFP4
        # (quantization_config mxfp4), attention, router and embeddings in BF16; its attention sinks hold no KV
        ModelSpec("gpt-oss-120b", 36, 64, 8, 64, 2880, 2880, 201088, 128, 4, efficiency=MOE_H200,
                  max_context=CONTEXT["gpt-oss-120b"], mxfp4_experts=True, layer_kinds=_GPT_OSS_LAYERS),
        # google/gemma-3-27b-it's text model (Gemma3ForConditionalGeneration's text_config, transformers'
        # Gemma3TextConfig defaults for vocab_size 262,208 and the window): 62 layers, 32 query / 16 KV heads of 128,
        # hidden 5,376, a gated MLP of 21,504, the embedding tied; 52 local layers and 10 global; with the vision
        # tower vLLM loads beside it (no KV: an image's tokens are the text model's)
        ModelSpec("gemma-3-27b", 62, 32, 16, 128, 5376, 21504, 262208, efficiency=DENSE_H200, tied_embeddings=True,
                  max_context=CONTEXT["gemma-3-27b"], layer_kinds=_GEMMA3_LAYERS, vision_params=_GEMMA3_27B_VISION),
        # Qwen/Qwen3-Next-80B-A3B (bench/data/models/qwen3-next-80b-a3b/config.json, the Thinking model's; the
        # Instruct model's fields are the same): 48 layers, 12 of gated full attention (16 query heads, 2 KV heads of
        # 256) and 36 Gated DeltaNet; every layer routed over 512 experts of 512, 10 a token, and one shared expert
        # of 512; untied. Its MTP layer (loaded only for speculative decoding) is not counted
        ModelSpec("qwen3-next-80b-a3b", 48, 16, 2, 256, 2048, 512, 151936, 512, 10, efficiency=MOE_H200,
                  max_context=CONTEXT["qwen3-next-80b-a3b"], shared_experts=1, layer_kinds=_QWEN3_NEXT_LAYERS,
                  state_layer_params=_GDN_PARAMS, gated_query=True),
        # Tiny shapes for CPU tests and `kvemu calibrate --device cpu` (not real models).
        ModelSpec("tiny", 4, 4, 2, 32, 256, 512, 1024, max_context=CONTEXT["tiny"]),
        ModelSpec("tiny-moe", 4, 4, 2, 32, 256, 256, 1024, 8, 2, max_context=CONTEXT["tiny-moe"]),
    )
}

_ALIASES = {
    "qwen3-coder-30b": "qwen3-coder-30b-a3b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "llama3.1-8b": "llama-3.1-8b",
    "gemma-3-27b-it": "gemma-3-27b",
}


def model_preset(name: str) -> str | None:
    """The preset ``name`` names (an alias resolved), None where it names none."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in MODELS else None


def get_model(name: str) -> ModelSpec:
    """A preset by name, or the shape a Hugging Face config.json (or a folder holding one) describes; a
    ``@kv=DTYPE`` after either is its --kv-cache-dtype (shared/model_kinds.py)."""
    name, kv_dtype = kinds.split_kv_dtype(name)
    spec = _named_model(name)
    if kv_dtype == "auto":
        return spec
    return replace(spec, kv_cache_dtype=kinds.check_kv_cache_dtype(kv_dtype, spec.name, spec.mla is not None))


def _named_model(name: str) -> ModelSpec:
    key = model_preset(name)
    if key is not None:
        return MODELS[key]
    if is_config_path(name):
        return model_from_config(name)
    raise UnknownNameError("model", name, list(MODELS), "; or the path of a model's config.json")


def model_from_config(path: str) -> ModelSpec:
    """The ``ModelSpec`` of a config.json (``shared.hf_config``) with the efficiencies of its kind (the dense
    or the MoE fit). A shape equal to a preset's, context window included, is that preset, name and all, so
    a device profile fitted for the preset applies to the file and the other way round."""
    shape = load_config(path)
    spec = replace(shape, efficiency=MOE_H200 if shape.experts else DENSE_H200)
    for preset in MODELS.values():
        if replace(spec, name=preset.name, efficiency=preset.efficiency) == preset:
            return preset
    return spec
