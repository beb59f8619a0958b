"""What a model's attention stores and computes beyond full attention in the model's dtype: multi-head latent
attention (MLA, DeepSeek-V2/V3, Kimi K2) and the KV cache's element type (``--kv-cache-dtype``).

**MLA** (the DeepSeek-V2 paper, arXiv 2405.04434, section 2.1; vLLM's ``vllm/v1/attention/backends/mla/common.py``).
A token's KV in a layer is one latent of ``kv_lora_rank`` values (the compressed K and V, Lkv) and the
decoupled rotary key of ``qk_rope_head_dim`` values (R), shared by every head: vLLM's ``MLAAttentionSpec`` has one
KV "head" of Lkv + R values and no separate V, so a token takes ``(Lkv + R) x layers x dtype bytes`` (DeepSeek-V3:
(512 + 64) x 61 x 2 = 70,272 bytes in BF16), and since one head cannot be split, every tensor-parallel rank holds
all of it (replicated, not divided by ``--tp``). With N query heads, P = ``qk_nope_head_dim``, V = ``v_head_dim``:

* prefill runs the normal ("compute-friendly") form: K and V are up-projected from the latent for every token
  and attention runs per head over P + R query/key dims and V value dims: ``2 N (P + R + V)`` FLOPs per query-key
  pair. A cached prefix is up-projected too (vLLM's ``_compute_prefill_context``: ``kv_b_proj`` over the cached
  latents), ``2 Lkv N (P + V)`` FLOPs per cached token, and its K and V read back, ``N (P + R + V)`` values;
* decode runs the absorbed ("data-movement friendly") form: the up-projections are folded into the query and
  the output, so attention reads the latent itself: per head a dot product over Lkv + R and a weighted sum over
  Lkv, ``2 N (2 Lkv + R)`` FLOPs per query token and context token (multi-query attention over one latent). The
  folded projections cost what ``kv_b_proj`` costs per token, so the products a token stay the layer's weights.

**FP8 KV** (vLLM's ``--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2``, ``CacheConfig.cache_dtype``; ``fp8`` is E4M3 on
NVIDIA): one byte a KV element instead of the model's two, so a block's page is half as many bytes and the memory
rule fits about twice the blocks; every read of the cache (decode KV, a cached prefix) moves half the bytes. vLLM
keeps a per-tensor scale for K and one for V per layer (two fp32 values a layer, 488 bytes for DeepSeek-V3's 61
layers): no share of a block, so left out. vLLM's MLA backends that store FP8 (FlashMLA, FlashInfer MLA) take
``fp8`` / ``fp8_e4m3`` only, so an MLA model refuses ``fp8_e5m2``.

**What each kind of layer reads and computes** (``layer_counts``, shared/kv_groups.py's kinds): a full-attention
layer attends a sequence's whole context; a sliding-window layer of ``W`` tokens at most the ``W`` before each query
(a decoding token reads ``min(context, W)`` tokens of KV, a prefill query at position ``p`` attends ``min(p, W)``
keys), as vLLM's FlashAttention backend passes the window to the kernel, which skips the blocks before it (and
vLLM frees them); AIConfigurator prices a window's decode read ``min(s - 1, W)`` tokens the same way. A state layer
(Gated DeltaNet) attends nothing: a step reads and writes each sequence's fixed state once (decoding: vLLM's
``fused_recurrent_gated_delta_rule`` updates it in place; a prefill chunk: ``chunk_gated_delta_rule`` starts
from the cached state and writes the final one, AIConfigurator's GDN estimate counts the same two transfers) and
its products are linear in the tokens (``STATE_DECODE_FLOPS``, ``STATE_PREFILL_FLOPS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from shared.errors import InputError
from shared.kv_groups import STATE, WINDOW

if TYPE_CHECKING:
    from shared.model_spec import ModelSpec

KV_FLAG = "--kv-cache-dtype"
# --kv-cache-dtype value -> bytes a KV element takes (0: the model's dtype, vLLM's "auto")
KV_CACHE_DTYPES: dict[str, int] = {"auto": 0, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# What vLLM's MLA backends on Hopper store (FlashMLA's and FlashInfer MLA's supported_kv_cache_dtypes)
MLA_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
# How the KV dtype travels inside the model setting, as ``@tpN`` travels inside the GPU's: "deepseek-v3@kv=fp8"
KV_SUFFIX = "@kv="
# Gated DeltaNet's FLOPs a token and layer per value of its state (``num_v_heads x head_k_dim x head_v_dim`` recurrent
# values, and the conv state's few: 4.5% of Qwen3-Next's, counted alike). Decoding, the recurrent form per value
# head: the state decays (1 a value), S^T k (2), the delta rule's rank-1 update (2), the output S^T q (2).
STATE_DECODE_FLOPS = 7
# A prefill, the chunked form (chunks of C = 64 tokens): three state-sized products a token (the chunk's corrected
# values W S, the state's update K^T U, the output Q S: 6), plus the chunk's own products (K K^T, Q K^T, the WY
# transform over keys and values: about 10 C / head_dim, 5 at Qwen3-Next's 128-dim heads).
STATE_PREFILL_FLOPS = 11


@dataclass(frozen=True, slots=True)
class MlaDims:
    """A DeepSeek config.json's MLA fields (its ``num_attention_heads`` are the query heads)."""

    kv_lora_rank: int  # Lkv: the compressed K/V latent a token keeps
    qk_rope_head_dim: int  # R: the rotary key part, one for all heads, kept beside the latent
    qk_nope_head_dim: int  # P: each head's query/key dims without rotary
    v_head_dim: int  # V: each head's value dims
    q_lora_rank: int = 0  # the query's compression; 0: projected from the hidden state directly (V2-Lite)

    @property
    def latent(self) -> int:
        """KV values a token keeps in a layer: Lkv + R."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def attn_params(self, hidden: int, heads: int) -> int:
        """One layer's attention weights: the query path (through q_lora_rank where set), ``kv_a_proj_with_mqa``
        (hidden -> Lkv + R), ``kv_b_proj`` (Lkv -> N (P + V)) and ``o_proj`` (N V -> hidden)."""
        qk = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = hidden * self.q_lora_rank + self.q_lora_rank * qk if self.q_lora_rank else hidden * qk
        kv = hidden * self.latent + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * hidden

    def replicated_params(self, hidden: int) -> int:
        """One layer's weights every --tp rank holds whole: the down projections ``q_a_proj`` and
        ``kv_a_proj_with_mqa`` (vLLM builds them as ReplicatedLinear: their outputs feed the whole latent)."""
        return hidden * (self.q_lora_rank + self.latent)

    def prefill_pair_flops(self, heads: int) -> int:
        """The normal form, per query-key pair and layer: QK over P + R dims, PV over V dims, every head."""
        return 2 * heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)

    def decode_pair_flops(self, heads: int) -> int:
        """The absorbed form, per query token and context token and layer: QK over Lkv + R, PV over Lkv."""
        return 2 * heads * (self.latent + self.kv_lora_rank)

    def context_flops(self, heads: int) -> int:
        """A cached prefix token in a prefill, per layer: ``kv_b_proj`` up-projects its latent to K and V."""
        return 2 * self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)

    def context_values(self, heads: int) -> int:
        """A cached prefix token in a prefill, per layer: the up-projected K (rotary part broadcast to every
        head) and V the attention kernel reads, in the model's dtype."""
        return heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)

    def activation_width(self, heads: int) -> int:
        """Values a token holds in a prefill's attention at its peak: Q, the up-projected K and V, the output."""
        return heads * (2 * (self.qk_nope_head_dim + self.qk_rope_head_dim) + 2 * self.v_head_dim)


class LayerCounts(NamedTuple):
    """A model's layers by what their attention reads (shared/kv_groups.py's kinds)."""

    full: int  # full attention (every layer of a model without layer kinds)
    window: int  # sliding-window layers
    window_tokens: int  # their window W (the largest, where windows differ: config.json gives one)
    state: int  # state layers
    state_bytes: int  # one sequence's states over the state layers, every --tp rank's share


def layer_counts(m: ModelSpec) -> LayerCounts:
    """``m``'s layers by kind; every layer full attention where ``layer_kinds`` is empty."""
    if not m.layer_kinds:
        return LayerCounts(m.layers, 0, 0, 0, 0)
    windows = [size for kind, size in m.layer_kinds if kind == WINDOW]
    states = [size for kind, size in m.layer_kinds if kind == STATE]
    return LayerCounts(m.layers - len(windows) - len(states), len(windows), max(windows, default=0), len(states),
                       sum(states))


def window_pairs(n: int, c: int, window: int) -> float:
    """Query-key pairs of a chunk of ``n`` new tokens after ``c`` cached ones in a layer of a ``window``-token
    window: sum_j min(c + j, window) (full attention: n c + n (n - 1) / 2)."""
    if c >= window:
        return float(n * window)
    below = min(n, window - c)  # queries whose keys all lie inside the window
    return below * c + below * (below - 1) / 2 + (n - below) * window


def kv_values(m: ModelSpec) -> int:
    """KV values a token keeps in a layer: K and V of each KV head, or MLA's one latent."""
    return m.mla.latent if m.mla is not None else 2 * m.kv_heads * m.head_dim


def kv_copies(m: ModelSpec, tp: int) -> float:
    """Copies of each KV value a --tp group holds: 1 where the KV heads split over the ranks. vLLM gives a rank
    at least one whole KV head, so with fewer heads than ranks each is held ``tp / heads`` times; MLA's one
    latent is on every rank."""
    heads = 1 if m.mla is not None else m.kv_heads
    return tp / heads if tp > heads else 1.0


def pair_flops(m: ModelSpec, decode: bool) -> int:
    """Attention FLOPs per query-key pair and layer, QK and PV over every query head: ``4 q_heads head_dim``;
    MLA: the normal form in a prefill, the absorbed form for a decoding token."""
    if m.mla is None:
        return 4 * m.q_heads * m.head_dim
    return m.mla.decode_pair_flops(m.q_heads) if decode else m.mla.prefill_pair_flops(m.q_heads)


def context_read_bytes(m: ModelSpec) -> int:
    """Bytes a prefill reads per cached prefix token and layer: K and V once per query head in the KV dtype (as
    kernels without GQA sharing read them); MLA: the latent, then the up-projected K and V in the model's dtype."""
    kv = kv_element_bytes(m.kv_cache_dtype, m.dtype_bytes)
    if m.mla is None:
        return 2 * m.q_heads * m.head_dim * kv
    return m.mla.latent * kv + m.mla.context_values(m.q_heads) * m.dtype_bytes


def kv_element_bytes(kv_cache_dtype: str, dtype_bytes: int) -> int:
    """Bytes a KV element takes: the model's dtype under ``auto``, else the named dtype's."""
    return KV_CACHE_DTYPES.get(kv_cache_dtype) or dtype_bytes


def check_kv_cache_dtype(value: str, model: str = "", mla: bool = False) -> str:
    """``value`` where vLLM would serve ``model`` with it; a one-line refusal naming the flag otherwise."""
    if value not in KV_CACHE_DTYPES:
        raise InputError(KV_FLAG, f"unknown KV cache dtype {value!r}; valid: {', '.join(KV_CACHE_DTYPES)}")
    if mla and value not in MLA_KV_CACHE_DTYPES:
        raise InputError(KV_FLAG, f"{value} is not stored by vLLM's MLA backends (FlashMLA, FlashInfer MLA take"
                                  f" {', '.join(MLA_KV_CACHE_DTYPES)}), and {model or 'this model'} uses MLA:"
                                  " give fp8 or fp8_e4m3")
    return value


def split_kv_dtype(model: str) -> tuple[str, str]:
    """``"deepseek-v3@kv=fp8"`` -> ("deepseek-v3", "fp8"); a setting without the suffix has ``auto``."""
    base, sep, dtype = model.rpartition(KV_SUFFIX)
    if not sep:
        return model, "auto"
    return base, check_kv_cache_dtype(dtype)


def with_kv_dtype(model: str, kv_cache_dtype: str) -> str:
    """The one model setting the commands carry: ``model`` with the KV dtype after it unless ``auto``."""
    base, given = split_kv_dtype(model)
    dtype = check_kv_cache_dtype(kv_cache_dtype)
    if dtype == "auto":
        dtype = given
    return base if dtype == "auto" else f"{base}{KV_SUFFIX}{dtype}"


def served_model(setting: str) -> str:
    """The name a replica serves under (``/v1/models``, ``/health``): the model setting without its KV dtype."""
    return setting.rpartition(KV_SUFFIX)[0] or setting
