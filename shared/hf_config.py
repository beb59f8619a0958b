"""A model's shape from its Hugging Face ``config.json`` (``--model PATH``, wherever a model preset is named).

What is read, per architecture (``architectures[0]``):

* Llama, Mistral, Qwen2, Qwen3 (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
  ``Qwen3ForCausalLM``): ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (GQA;
  absent: one KV head per query head, as transformers reads it), ``head_dim`` (absent: ``hidden_size /
  num_attention_heads``), ``hidden_size``, ``intermediate_size`` (a SwiGLU MLP), ``vocab_size``,
  ``tie_word_embeddings`` (absent: false, these classes' default);
* Qwen3-MoE (``Qwen3MoeForCausalLM``): the same attention, and every layer's MLP routed over
  ``num_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` a token;
* OPT (``OPTForCausalLM``): multi-head attention, a two-matrix MLP of ``ffn_dim``, the LM head tied to the
  input embedding unless ``tie_word_embeddings`` is false;
* every one: ``max_position_embeddings`` as vLLM's default ``--max-model-len`` (times a linear, dynamic or
  YaRN ``rope_scaling`` factor, as vLLM derives it; llama3 and longrope scaling leave it as it is), and
  ``torch_dtype`` (or ``dtype``): 2 bytes for bfloat16 and float16, and for float32 too, since vLLM's
  ``--dtype auto`` serves a float32 checkpoint in 16 bits.

What kvemu cannot price yet is refused in one line naming the field and the file: sliding-window layers
(``sliding_window`` where it applies, ``layer_types`` with sliding attention), MLA (``kv_lora_rank``),
quantized weights (``quantization_config``), MoE models with dense layers among the routed ones, OPT's
embedding projections, an architecture not listed above, a required field missing or not a positive integer.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shared.errors import InputError

FIELD = "--model"
LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
ARCHITECTURES = (*LLAMA_LIKE, "Qwen3MoeForCausalLM", "OPTForCausalLM")
# torch dtype name -> bytes a weight and a KV element take as vLLM serves it by default (--dtype auto)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2}
# rope_scaling types whose factor vLLM multiplies the context window by (``_get_and_verify_max_len``)
SCALED_ROPE = ("linear", "dynamic", "yarn")


@dataclass(frozen=True, slots=True)
class HfShape:
    """What a config.json says about the model's shape (``shared.costmodel`` makes it a ``ModelSpec``)."""

    name: str  # from the file's place: its folder, or the file name before ``.config.json`` / ``.json``
    path: str  # absolute
    architecture: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int  # MLP width (MoE: of one expert)
    vocab: int
    experts: int
    active_experts: int
    dtype_bytes: int
    mlp_matrices: int  # 3: SwiGLU; 2: OPT's fc1 -> ReLU -> fc2
    tied_embeddings: bool
    max_context: int


def is_config_path(spec: str) -> bool:
    """A ``--model`` value that names a file or folder rather than a preset."""
    return spec.endswith(".json") or os.sep in spec or os.path.isdir(spec)


def load_config(path: str) -> HfShape:
    """The shape in ``path`` (a config.json, or a model folder holding one), read once per file version."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        stat = os.stat(path)
    except OSError:
        raise InputError(FIELD, f"no model preset or config.json {path}") from None
    return _load(os.path.abspath(path), stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _load(path: str, _mtime: int) -> HfShape:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(FIELD, f"{path} is not a readable JSON config.json: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError(FIELD, f"{path}: a config.json is a JSON object, got {type(raw).__name__}")
    return _Reader(raw, path).shape()


class _Reader:
    """One file's fields, each check naming the field and the file."""

    def __init__(self, raw: dict[str, Any], path: str) -> None:
        self.raw, self.path = raw, path

    def refuse(self, field: str, why: str) -> InputError:
        return InputError(FIELD, f"{self.path}: {field!r} {why}")

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
        raw = self.raw
        if raw.get("kv_lora_rank") is not None:
            raise self.refuse("kv_lora_rank", "is set: multi-head latent attention (MLA) is not modelled yet")
        if raw.get("quantization_config") is not None:
            raise self.refuse("quantization_config", "is set: quantized weights are not modelled yet (kvemu prices"
                                                     " 16-bit weights)")
        types = raw.get("layer_types")
        if isinstance(types, list) and any(t != "full_attention" for t in types):
            raise self.refuse("layer_types", "has layers other than full_attention (sliding-window layers):"
                                             " not modelled yet")

    def check_window(self, arch: str, max_pos: int) -> None:
        raw = self.raw
        window = raw.get("sliding_window")
        # Qwen2 / Qwen3 keep a sliding_window that only use_sliding_window turns on; Mistral's applies when set
        applies = arch == "MistralForCausalLM" or (arch != "OPTForCausalLM" and raw.get("use_sliding_window") is True)
        if applies and window is not None and (not isinstance(window, int) or window < max_pos):
            raise self.refuse("sliding_window", f"is {window!r} (< max_position_embeddings {max_pos}): sliding-window"
                                                " attention is not modelled yet")

    def max_context(self) -> int:
        window = self.positive("max_position_embeddings")
        rope = self.raw.get("rope_scaling")
        if not isinstance(rope, dict):
            return window
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if kind not in SCALED_ROPE:
            return window
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

    def shape(self) -> HfShape:
        self.check_kinds()
        arch = self.architecture()
        max_pos = self.positive("max_position_embeddings")
        self.check_window(arch, max_pos)
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
        experts = active = 0
        if opt:
            if self.positive("word_embed_proj_dim", hidden) != hidden:
                raise self.refuse("word_embed_proj_dim", f"differs from hidden_size {hidden}: OPT's embedding"
                                                         " projections are not modelled yet")
            intermediate = self.positive("ffn_dim")
        elif arch == "Qwen3MoeForCausalLM":
            experts, active = self.positive("num_experts"), self.positive("num_experts_per_tok")
            intermediate = self.positive("moe_intermediate_size")
            if active > experts:
                raise self.refuse("num_experts_per_tok", f"({active}) exceeds num_experts ({experts})")
            if self.positive("decoder_sparse_step", 1) != 1 or self.raw.get("mlp_only_layers"):
                raise self.refuse("mlp_only_layers" if self.raw.get("mlp_only_layers") else "decoder_sparse_step",
                                  "puts dense MLP layers among the MoE ones: not modelled yet (every layer routed)")
        else:
            intermediate = self.positive("intermediate_size")
        return HfShape(name=model_name(self.path), path=self.path, architecture=arch, layers=layers, q_heads=heads,
                       kv_heads=kv_heads, head_dim=head_dim, hidden=hidden, intermediate=intermediate,
                       vocab=self.positive("vocab_size"), experts=experts, active_experts=active,
                       dtype_bytes=self.dtype_bytes(), mlp_matrices=2 if opt else 3,
                       tied_embeddings=self.flag("tie_word_embeddings", opt), max_context=self.max_context())


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
