"""A model's shape from its Hugging Face ``config.json`` (``--model PATH``, wherever a model preset is named).

What is read, per architecture (``architectures[0]``):

* Llama, Mistral, Qwen2, Qwen3 (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
  ``Qwen3ForCausalLM``): ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (GQA;
  absent: one KV head per query head, as transformers reads it), ``head_dim`` (absent: ``hidden_size /
  num_attention_heads``), ``hidden_size``, ``intermediate_size`` (a SwiGLU MLP), ``vocab_size``,
  ``tie_word_embeddings`` (absent: false, these classes' default);
* Qwen3-MoE (``Qwen3MoeForCausalLM``): the same attention, and the MLP routed over ``num_experts`` experts of
  ``moe_intermediate_size``, ``num_experts_per_tok`` a token, but in the layers ``mlp_only_layers`` and
  ``decoder_sparse_step`` make dense (an MLP of ``intermediate_size``);
* DeepSeek-V2 / V3 and Kimi K2 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``): multi-head latent
  attention (``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``;
  shared/model_kinds.py) over ``num_attention_heads`` heads; ``first_k_dense_replace`` dense layers of
  ``intermediate_size``, then MoE layers of ``n_routed_experts`` experts of ``moe_intermediate_size``,
  ``num_experts_per_tok`` a token, plus ``n_shared_experts`` every token runs (``moe_layer_freq`` 1);
* OPT (``OPTForCausalLM``): multi-head attention, a two-matrix MLP of ``ffn_dim``, the LM head tied to the
  input embedding unless ``tie_word_embeddings`` is false;
* every one: ``max_position_embeddings`` as vLLM's default ``--max-model-len`` (times a linear, dynamic or
  YaRN ``rope_scaling`` factor, as vLLM derives it; llama3 and longrope scaling leave it as it is), and
  ``torch_dtype`` (or ``dtype``): 2 bytes for bfloat16 and float16, and for float32 too, since vLLM's
  ``--dtype auto`` serves a float32 checkpoint in 16 bits.

A ``quantization_config`` of ``quant_method`` fp8 (DeepSeek-V3's: E4M3 in 128 x 128 blocks) makes the decoder
layers' weights one byte each (their block scales, 4 bytes a block of 16,384 weights, left out); the embedding and
the LM head stay in the dtype. The FP8 products are priced at the card's 16-bit peak (an upper bound on their time).
One of ``quant_method`` mxfp4 (gpt-oss's) makes the routed experts' weights 4.25 bits each (shared/model_spec.py,
``MXFP4_WEIGHT_BYTES``): vLLM 0.33 quantizes only the fused-MoE experts, whatever ``modules_to_not_convert`` lists,
so attention (its sinks too: one value a head, no KV), the router and the embeddings stay in the dtype.

* Gemma 3 (``Gemma3ForCausalLM``): Llama's fields, the embedding tied unless ``tie_word_embeddings`` is false, the
  window ``max_position_embeddings`` unscaled (vLLM applies no rope factor to a gemma3 model); its image-text model
  (``Gemma3ForConditionalGeneration``): the text model of ``text_config`` (transformers' ``Gemma3TextConfig`` defaults
  for the fields it leaves out), and the SigLIP vision tower of ``vision_config`` with its projector, which vLLM loads
  by default: resident weights, no KV (an image's tokens are the text model's, as any token);
  gpt-oss (``GptOssForCausalLM``): every layer routed over ``num_local_experts`` experts of ``intermediate_size``;
* sliding-window layers, read into KV cache groups (shared/kv_groups.py): ``layer_types`` (``full_attention`` or
  ``sliding_attention``, one a layer: gpt-oss, Gemma 3), else Gemma 3's ``sliding_window_pattern`` (every P-th
  layer global), else Mistral's ``sliding_window`` on every layer where it is below the context window; the
  window is ``sliding_window`` tokens;
* Qwen3-Next (``Qwen3NextForCausalLM``): Qwen3-MoE's fields plus one shared expert of
  ``shared_expert_intermediate_size``; its ``layer_types`` (``linear_attention`` or ``full_attention``; absent:
  every ``full_attention_interval``-th layer full, as transformers' Qwen3NextConfig derives them) read into KV
  cache groups, a Gated DeltaNet layer a state layer whose state is vLLM's
  (``MambaStateShapeCalculator.gated_delta_net_state_shape``): a conv state of ``(2 linear_num_key_heads
  linear_key_head_dim + linear_num_value_heads linear_value_head_dim) x (linear_conv_kernel_dim - 1)`` values and
  a recurrent state of ``linear_num_value_heads x linear_value_head_dim x linear_key_head_dim``, both in the
  model's dtype (vLLM's ``--mamba-cache-dtype auto``). The layers' own weights are priced as full attention's.

What kvemu cannot price yet is refused in one line naming the field and the file: other layer types
(``linear_attention`` outside Qwen3-Next, whose state shape kvemu does not know), Mamba2 layers (Nemotron-H's
``hybrid_override_pattern``, Falcon-H1's ``mamba_*`` fields), Qwen's ``use_sliding_window``, other quantized weights
(``quantization_config``), DeepSeek's ``moe_layer_freq`` other than 1, OPT's embedding projections, an
architecture not listed above, a required field missing or not a positive integer.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from functools import lru_cache
from typing import Any, NamedTuple

from shared.errors import InputError
from shared.kv_groups import FULL, STATE, WINDOW
from shared.model_kinds import MlaDims
from shared.model_spec import ModelSpec

FIELD = "--model"
LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM")
GPT_OSS = "GptOssForCausalLM"
# DeepSeek-V2 / V3 (Kimi K2's config.json names DeepseekV3ForCausalLM too): MLA, DeepSeek's MoE
DEEPSEEK = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
GEMMA3_VL = "Gemma3ForConditionalGeneration"
QWEN3_NEXT = "Qwen3NextForCausalLM"  # Gated DeltaNet linear attention, full attention every 4th layer, MoE
ARCHITECTURES = (*LLAMA_LIKE, GEMMA3_VL, "Qwen3MoeForCausalLM", QWEN3_NEXT, GPT_OSS, *DEEPSEEK, "OPTForCausalLM")
# quantization_config's quant_method kvemu prices: FP8 decoder layers, MXFP4 routed experts
QUANT_METHODS = ("fp8", "mxfp4")
# transformers' Gemma3TextConfig defaults, for the fields a Gemma3ForConditionalGeneration's text_config leaves out
# (google/gemma-3-27b-it's names no vocab_size, max_position_embeddings nor sliding_window_pattern)
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "max_position_embeddings": 131_072, "sliding_window": 4096, "sliding_window_pattern": 6}
# transformers' SiglipVisionConfig defaults, the same for its vision_config
SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                   "image_size": 224, "patch_size": 16}
# config.json's layer_types -> the kind of shared/kv_groups.py (what vLLM makes a FullAttentionSpec, a
# SlidingWindowSpec or a MambaSpec of); anything else (mamba, chunked_attention) is refused naming the field, and
# linear_attention outside Qwen3-Next too (its state's shape is the architecture's)
LAYER_TYPES = {"full_attention": FULL, "sliding_attention": WINDOW, "linear_attention": STATE}
# Mamba2 hybrids' fields (Nemotron-H, Falcon-H1): their state layers are not read yet, refused naming the field
MAMBA_FIELDS = ("hybrid_override_pattern", "mamba_d_ssm", "mamba_d_state", "mamba_num_heads", "ssm_state_size")
# torch dtype name -> bytes a weight and a KV element take as vLLM serves it by default (--dtype auto)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2}
# rope_scaling types whose factor vLLM multiplies the context window by (``_get_and_verify_max_len``)
SCALED_ROPE = ("linear", "dynamic", "yarn")


class MlpShape(NamedTuple):
    """A config's MLP fields (``_Reader.mlp``)."""

    intermediate: int  # the MLP's width (MoE: one expert's)
    experts: int = 0
    active: int = 0
    dense_layers: int = 0
    dense_intermediate: int = 0
    shared_experts: int = 0


def is_config_path(spec: str) -> bool:
    """A ``--model`` value that names a file or folder rather than a preset."""
    return spec.endswith(".json") or os.sep in spec or os.path.isdir(spec)


def load_config(path: str) -> ModelSpec:
    """The shape in ``path`` (a config.json, or a model folder holding one), read once per file version; named
    after its place (``model_name``), with no efficiencies (``shared.model_presets.model_from_config`` gives
    those of its kind)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        stat = os.stat(path)
    except OSError:
        raise InputError(FIELD, f"no model preset or config.json {path}") from None
    return _load(os.path.abspath(path), stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _load(path: str, _mtime: int) -> ModelSpec:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(FIELD, f"{path} is not a readable JSON config.json: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError(FIELD, f"{path}: a config.json is a JSON object, got {type(raw).__name__}")
    archs = raw.get("architectures")
    if isinstance(archs, list) and GEMMA3_VL in archs:
        return _gemma3_image_text(raw, path)
    return _Reader(raw, path).shape()


def _gemma3_image_text(raw: dict[str, Any], path: str) -> ModelSpec:
    """Gemma 3's image-text model: its text model read as a Gemma3ForCausalLM (the file's dtype and quantization),
    plus the vision tower's and projector's weights (SigLIP: patch and position embeddings, per layer q, k, v, o and
    a two-matrix MLP; the projector one vision x text matrix; norms and biases left out, as elsewhere)."""
    subs = [raw.get(field) or {} for field in ("text_config", "vision_config")]
    for field, sub in zip(("text_config", "vision_config"), subs, strict=True):
        if not isinstance(sub, dict):
            raise InputError(FIELD, f"{path}: {field!r} must be a JSON object")
    outer: dict[str, Any] = {k: raw[k] for k in ("torch_dtype", "dtype", "quantization_config") if k in raw}
    text = _Reader({**GEMMA3_TEXT_DEFAULTS, **outer, **subs[0], "architectures": ["Gemma3ForCausalLM"]}, path,
                   "text_config.").shape()
    v = _Reader({**SIGLIP_DEFAULTS, **subs[1]}, path, "vision_config.")
    hidden, patch = v.positive("hidden_size"), v.positive("patch_size")
    layer = 4 * hidden * hidden + 2 * hidden * v.positive("intermediate_size")
    tower = (v.positive("num_hidden_layers") * layer + v.positive("num_channels") * patch * patch * hidden
             + (v.positive("image_size") // patch) ** 2 * hidden)
    return replace(text, vision_params=tower + hidden * text.hidden)


class _Reader:
    """One file's fields, each check naming the field and the file."""

    def __init__(self, raw: dict[str, Any], path: str, prefix: str = "") -> None:
        self.raw, self.path, self.prefix = raw, path, prefix  # prefix: a nested config's, "text_config."

    def refuse(self, field: str, why: str) -> InputError:
        return InputError(FIELD, f"{self.path}: {self.prefix + field!r} {why}")

    def positive(self, field: str, default: int | None = None) -> int:
        value = self.raw.get(field)
        if value is None:
            if default is not None:
                return default
            raise self.refuse(field, "is missing: kvemu needs it to size the model")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.refuse(field, f"must be an integer >= 1, got {value!r}")
        return value

    def flag(self, field: str, default: bool) -> bool:
        value = self.raw.get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.refuse(field, f"must be true or false, got {value!r}")
        return value

    def architecture(self) -> str:
        archs = self.raw.get("architectures")
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise self.refuse("architectures", f"is missing or not a list of class names; kvemu reads"
                                               f" {', '.join(ARCHITECTURES)}")
        known = [a for a in archs if a in ARCHITECTURES]
        if not known:
            raise self.refuse("architectures", f"is {archs!r}: an architecture kvemu cannot model yet; it reads"
                                               f" {', '.join(ARCHITECTURES)}")
        return known[0]

    def check_kinds(self) -> None:
        """Refuse what prices attention or weights otherwise than full attention over 16-bit weights (before
        the architecture: a DeepSeek file is better told it is MLA than that its class is unknown)."""
        mamba = next((f for f in MAMBA_FIELDS if f in self.raw), None)
        if mamba is not None:
            raise self.refuse(mamba, "is set: Mamba2 state layers (Nemotron-H, Falcon-H1) are not modelled yet;"
                                     " kvemu reads Qwen3-Next's linear-attention state layers")
        if self.quant_method() not in ("", *QUANT_METHODS):
            raise self.refuse("quantization_config", "is set and not fp8 or mxfp4: other quantized weights are not"
                                                     " modelled yet (kvemu prices 16-bit, FP8 or MXFP4 experts' weights)")

    def quant_method(self) -> str:
        """``quantization_config``'s ``quant_method`` ("" where there is none; "?" where it names none)."""
        quant = self.raw.get("quantization_config")
        if quant is None:
            return ""
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        return method if isinstance(method, str) else "?"

    def layer_kinds(self, arch: str, layers: int, max_pos: int) -> tuple[tuple[str, int], ...]:
        """Each layer's attention where some layer is not full attention (() where every one is): ``layer_types``
        (gpt-oss, Gemma 3, recent configs), else Gemma 3's ``sliding_window_pattern`` (every P-th layer global),
        else Mistral's ``sliding_window`` on every layer (below the context window; at or above it, no window)."""
        raw = self.raw
        types = raw.get("layer_types")
        if types is None and arch == QWEN3_NEXT:  # transformers' Qwen3NextConfig: every interval-th layer full
            interval = self.positive("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
        if types is not None:
            if not isinstance(types, list) or len(types) != layers:
                raise self.refuse("layer_types", f"must list one type for each of the {layers} layers")
            odd = sorted({str(t) for t in types if t not in LAYER_TYPES})
            if odd:
                raise self.refuse("layer_types", f"has {', '.join(odd)}: kvemu models {', '.join(LAYER_TYPES)}"
                                                 " (Mamba and other state layers are not modelled yet)")
            kinds = [LAYER_TYPES[t] for t in types]
            if STATE in kinds:
                return self.state_kinds(arch, kinds)
        elif arch == "Gemma3ForCausalLM":
            pattern = self.positive("sliding_window_pattern")
            kinds = [FULL if (i + 1) % pattern == 0 else WINDOW for i in range(layers)]
        elif arch == "MistralForCausalLM" and raw.get("sliding_window") is not None:
            kinds = [WINDOW if self.positive("sliding_window") < max_pos else FULL] * layers
        else:
            if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and raw.get("use_sliding_window") is True:
                raise self.refuse("use_sliding_window", "is true: Qwen's max_window_layers split is not modelled yet")
            kinds = [FULL] * layers
        if WINDOW not in kinds:
            return ()
        window = self.positive("sliding_window")
        return tuple((k, window if k == WINDOW else 0) for k in kinds)

    def state_kinds(self, arch: str, kinds: list[str]) -> tuple[tuple[str, int], ...]:
        """Qwen3-Next's layers: each linear-attention layer a state of ``gdn_state_bytes``."""
        if arch != QWEN3_NEXT:
            raise self.refuse("layer_types", f"has linear_attention in a {arch}: kvemu knows the state of"
                                             f" {QWEN3_NEXT}'s Gated DeltaNet layers only")
        if FULL not in kinds:
            raise self.refuse("layer_types", "has no full_attention layer: a model of state layers only is not"
                                             " modelled (vLLM sizes its blocks by an attention page)")
        state = self.gdn_state_bytes()
        return tuple((k, state if k == STATE else 0) for k in kinds)

    def gdn_state_bytes(self) -> int:
        """One sequence's state in one Gated DeltaNet layer, as vLLM sizes it (all --tp ranks together)."""
        k_heads, v_heads = self.positive("linear_num_key_heads"), self.positive("linear_num_value_heads")
        k_dim, v_dim = self.positive("linear_key_head_dim"), self.positive("linear_value_head_dim")
        kernel = self.positive("linear_conv_kernel_dim")
        if kernel < 2:
            raise self.refuse("linear_conv_kernel_dim", f"must be >= 2 (a conv state keeps kernel - 1 tokens),"
                                                        f" got {kernel}")
        conv = (2 * k_heads * k_dim + v_heads * v_dim) * (kernel - 1)
        return (conv + v_heads * v_dim * k_dim) * self.dtype_bytes()

    def gdn_params(self, hidden: int) -> int:
        """A Gated DeltaNet layer's weights (vLLM's Qwen3NextGatedDeltaNet): in_proj_qkvz (hidden x (2 keys + 2
        values)), in_proj_ba (hidden x 2 value heads), the depthwise conv over q, k and v (kernel taps a channel),
        out_proj (values x hidden); its per-head A and dt and its norm, a few thousand values, left out."""
        keys = self.positive("linear_num_key_heads") * self.positive("linear_key_head_dim")
        heads = self.positive("linear_num_value_heads")
        values = heads * self.positive("linear_value_head_dim")
        return (hidden * (2 * keys + 2 * values) + hidden * 2 * heads + (2 * keys + values) * self.positive(
            "linear_conv_kernel_dim") + values * hidden)

    def max_context(self) -> int:
        window = self.positive("max_position_embeddings")
        rope = self.raw.get("rope_scaling")
        if not isinstance(rope, dict):
            return window
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if kind not in SCALED_ROPE or self.raw.get("architectures") == ["Gemma3ForCausalLM"]:
            return window  # vLLM: Gemma 3's max_position_embeddings is already the scaled window
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor < 1:
            raise self.refuse("rope_scaling", f"of type {kind!r} needs a factor >= 1, got {factor!r}")
        if kind == "yarn":
            window = rope.get("original_max_position_embeddings") or window
        return int(window * factor)

    def dtype_bytes(self) -> int:
        name = self.raw.get("torch_dtype", self.raw.get("dtype"))
        if name is None:
            return 2  # vLLM's --dtype auto: 16 bits
        if name not in DTYPE_BYTES:
            raise self.refuse("torch_dtype", f"is {name!r}: kvemu reads {', '.join(DTYPE_BYTES)}")
        return DTYPE_BYTES[name]

    def shape(self) -> ModelSpec:
        self.check_kinds()
        arch = self.architecture()
        max_pos = self.positive("max_position_embeddings")
        layers, heads, hidden = self.positive("num_hidden_layers"), self.positive("num_attention_heads"), self.positive("hidden_size")
        opt = arch == "OPTForCausalLM"
        kv_heads = heads if opt else self.positive("num_key_value_heads", heads)
        if heads % kv_heads:
            raise self.refuse("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
        if "head_dim" in self.raw and not opt:
            head_dim = self.positive("head_dim")
        elif hidden % heads:
            raise self.refuse("head_dim", f"is missing and hidden_size {hidden} is not a multiple of"
                                          f" num_attention_heads {heads}")
        else:
            head_dim = hidden // heads
        mlp = self.mlp(arch, hidden, layers)
        mla = self.mla() if arch in DEEPSEEK else None
        if mla is not None:  # the query/key head: its dims without and with rotary
            head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        return ModelSpec(name=model_name(self.path), layers=layers, q_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         hidden=hidden, intermediate=mlp.intermediate, vocab=self.positive("vocab_size"),
                         experts=mlp.experts, active_experts=mlp.active, dtype_bytes=self.dtype_bytes(),
                         mlp_matrices=2 if opt else 3,
                         tied_embeddings=self.flag("tie_word_embeddings", opt or arch == "Gemma3ForCausalLM"),
                         max_context=self.max_context(),
                         dense_layers=mlp.dense_layers, dense_intermediate=mlp.dense_intermediate,
                         shared_experts=mlp.shared_experts, mla=mla,
                         fp8_weights=self.quant_method() == "fp8", mxfp4_experts=self.mxfp4(mlp),
                         layer_kinds=self.layer_kinds(arch, layers, max_pos),
                         state_layer_params=self.gdn_params(hidden) if arch == QWEN3_NEXT else 0,
                         gated_query=arch == QWEN3_NEXT)

    def mxfp4(self, mlp: MlpShape) -> bool:
        """MXFP4 routed experts; refused on a model without any (vLLM would leave every other layer unquantized)."""
        if self.quant_method() != "mxfp4":
            return False
        if not mlp.experts:
            raise self.refuse("quantization_config", "is mxfp4 on a model without routed experts: vLLM quantizes only"
                                                     " fused-MoE experts with it")
        return True

    def mlp(self, arch: str, hidden: int, layers: int) -> MlpShape:
        if arch == "OPTForCausalLM":
            if self.positive("word_embed_proj_dim", hidden) != hidden:
                raise self.refuse("word_embed_proj_dim", f"differs from hidden_size {hidden}: OPT's embedding"
                                                         " projections are not modelled yet")
            return MlpShape(self.positive("ffn_dim"))
        if arch in ("Qwen3MoeForCausalLM", QWEN3_NEXT):
            # Qwen3-MoE routes layer i unless it is in mlp_only_layers or (i + 1) % decoder_sparse_step != 0
            step, only = self.positive("decoder_sparse_step", 1), self.raw.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in only):
                raise self.refuse("mlp_only_layers", f"must be a list of layer indices below {layers}")
            dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
            return self.experts("num_experts", "moe_intermediate_size", dense, layers, self.qwen_shared_expert(arch))
        if arch == GPT_OSS:  # every layer routed: num_local_experts of intermediate_size
            return self.experts("num_local_experts", "intermediate_size", 0, layers, 0)
        if arch in DEEPSEEK:
            if self.positive("moe_layer_freq", 1) != 1:
                raise self.refuse("moe_layer_freq", "is not 1: MoE layers between dense ones are not modelled yet")
            dense = self.count("first_k_dense_replace")
            return self.experts("n_routed_experts", "moe_intermediate_size", dense, layers,
                                self.count("n_shared_experts"))
        return MlpShape(self.positive("intermediate_size"))

    def experts(self, count: str, width: str, dense: int, layers: int, shared: int) -> MlpShape:
        experts, active = self.positive(count), self.positive("num_experts_per_tok")
        if active > experts:
            raise self.refuse("num_experts_per_tok", f"({active}) exceeds {count} ({experts})")
        if dense >= layers:
            raise self.refuse("first_k_dense_replace" if count == "n_routed_experts" else "mlp_only_layers",
                              f"leaves no MoE layer among the {layers}")
        dense_width = self.positive("intermediate_size") if dense else 0
        return MlpShape(self.positive(width), experts, active, dense, dense_width, shared)

    def qwen_shared_expert(self, arch: str) -> int:
        """Qwen3-Next's one shared expert (``shared_expert_intermediate_size``, priced as a routed expert, so of
        that width); Qwen3-MoE has none."""
        if arch != QWEN3_NEXT or not self.count("shared_expert_intermediate_size"):
            return 0
        width, expert = self.positive("shared_expert_intermediate_size"), self.positive("moe_intermediate_size")
        if width != expert:
            raise self.refuse("shared_expert_intermediate_size", f"({width}) differs from moe_intermediate_size"
                                                                 f" ({expert}): a shared expert of another width"
                                                                 " is not modelled yet")
        return 1

    def count(self, field: str) -> int:
        """An integer >= 0 (absent: 0)."""
        value = self.raw.get(field)
        if value is None or value == 0:
            return 0
        return self.positive(field)

    def mla(self) -> MlaDims:
        """DeepSeek's MLA fields (q_lora_rank null: the query projected directly, as DeepSeek-V2-Lite)."""
        return MlaDims(self.positive("kv_lora_rank"), self.positive("qk_rope_head_dim"),
                       self.positive("qk_nope_head_dim"), self.positive("v_head_dim"), self.count("q_lora_rank"))


_SNAPSHOT = re.compile(r"^[0-9a-f]{40}$")


def model_name(path: str) -> str:
    """A name for the model from where its config.json lies: ``Qwen3-14B/config.json`` -> ``Qwen3-14B``,
    the Hugging Face cache's ``models--Qwen--Qwen3-14B/snapshots/<commit>/config.json`` the same,
    ``Llama-3.1-8B.config.json`` -> ``Llama-3.1-8B``."""
    folder, base = os.path.split(path)
    if base != "config.json":
        return base.removesuffix(".json").removesuffix(".config") or base
    parent = os.path.basename(folder)
    if _SNAPSHOT.match(parent):
        repo = os.path.basename(os.path.dirname(os.path.dirname(folder)))
        if repo.startswith("models--"):
            return repo.split("--")[-1]
    return parent or base
