"""A model's shape (``ModelSpec``): what the cost model prices and what a token's KV takes.

Its parameter counts (attention, MLP or experts, LM head, dense layers among MoE ones), the experts a step's
tokens touch, and the KV bytes of one token (shared/model_kinds.py: MLA's latent, the KV cache dtype). The
shipped shapes are in shared/model_presets.py; a Hugging Face config.json gives one (shared/hf_config.py).
Compiled with the cost model by mypyc (shared/compiled_modules.py): the step's price reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared import model_kinds as kinds
from shared.devspecs import Efficiency
from shared.kv_groups import STATE, KvGroups, full_attention, group_layers
from shared.model_kinds import MlaDims, kv_element_bytes

# MXFP4 (OCP microscaling): a 4-bit E2M1 value a weight and one 8-bit E8M0 scale a block of 32, so 4.25 bits a
# weight, as vLLM 0.33 holds a routed expert (uint8 weights of two values and uint8 scales a 32, mxfp4.py); the padding
# its kernel layout may add (intermediate rounded up to 64 on Hopper's Triton path) is left out
MXFP4_WEIGHT_BYTES = (4 + 8 / 32) / 8


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int  # MLP width (MoE: of one expert)
    vocab: int
    experts: int = 0  # 0: dense
    active_experts: int = 0
    dtype_bytes: int = 2
    efficiency: Efficiency | None = None  # None: the dense H200 fit
    mlp_matrices: int = 3  # 3: SwiGLU (gate, up, down); 2: fc1 -> activation -> fc2 (OPT)
    tied_embeddings: bool = False  # the LM head is the input embedding (one matrix resident)
    # The context window (config.json's max_position_embeddings): vLLM's default max_model_len
    max_context: int = 0
    # DeepSeek's MoE: ``dense_layers`` layers (first_k_dense_replace) have a dense MLP of ``dense_intermediate``;
    # each MoE layer also runs ``shared_experts`` experts on every token
    dense_layers: int = 0
    dense_intermediate: int = 0
    shared_experts: int = 0
    mla: MlaDims | None = None  # multi-head latent attention (shared/model_kinds.py); None: full attention
    fp8_weights: bool = False  # the decoder layers' weights in FP8 (config.json's quantization_config fp8)
    # The routed experts' weights in MXFP4 (quantization_config mxfp4, gpt-oss): ``MXFP4_WEIGHT_BYTES`` each; vLLM
    # quantizes only its fused-MoE experts, attention, router, shared experts and embeddings stay in the dtype
    mxfp4_experts: bool = False
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype (shared/model_kinds.py)
    # Each layer's attention, (kind, size) of shared/kv_groups.py (size: a window's tokens, a state's bytes), where a
    # layer is not full attention (config.json's layer_types, sliding_window, sliding_window_pattern, Qwen3-Next's
    # linear attention); (): every layer full attention
    layer_kinds: tuple[tuple[str, int], ...] = ()
    # Weights vLLM loads beside the decoder that no text step reads (a vision tower and its projector, Gemma 3's
    # SigLIP): resident, so counted in ``weight_bytes`` (in the dtype), never in a step's price
    vision_params: int = 0
    # Qwen3-Next: a state layer's mixer (Gated DeltaNet: its q/k/v/z and b/a input projections, the causal conv and
    # the output projection) in place of attention's weights; and a query projection that also emits a gate as wide
    # as the query (its gated attention)
    state_layer_params: int = 0
    gated_query: bool = False

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def attn_params(self) -> int:
        """Per layer: fused QKV and output projections (MLA: its latent projections)."""
        if self.mla is not None:
            return self.mla.attn_params(self.hidden, self.q_heads)
        q = (2 if self.gated_query else 1) * self.q_heads
        return self.hidden * (q + 2 * self.kv_heads) * self.head_dim + self.q_heads * self.head_dim * self.hidden

    @property
    def expert_params(self) -> int:
        """One MLP (SwiGLU: gate, up, down; OPT: fc1, fc2); the dense MLP when not MoE."""
        return self.mlp_matrices * self.hidden * self.intermediate

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts

    @property
    def head_params(self) -> int:
        """The LM head (hidden -> vocab), read by every step that samples a token."""
        return self.vocab * self.hidden

    def layer_params(self, experts: float | None = None) -> float:
        """Per layer with ``experts`` experts (default: all of them; dense: the MLP)."""
        if not self.moe:
            return self.attn_params + self.expert_params
        n = self.experts if experts is None else experts
        return self.attn_params + self.router_params + (n + self.shared_experts) * self.expert_params

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    def stack_params(self, experts: float | None = None) -> float:
        """Every layer's, each MoE layer with ``experts`` experts (``layer_params``); dense layers among MoE
        ones (``dense_layers``) with their own MLP; a state layer with its mixer (``state_layer_params``) in place
        of attention."""
        mixers = (self.layers - self.attention_layers) * (self.state_layer_params - self.attn_params)
        if not self.dense_layers:
            return self.layers * self.layer_params(experts) + mixers
        dense = self.attn_params + self.mlp_matrices * self.hidden * self.dense_intermediate
        return self.moe_layers * self.layer_params(experts) + self.dense_layers * dense + mixers

    @property
    def total_params(self) -> float:
        """Resident parameters: every layer and expert, the input embedding and the LM head (one
        matrix when they are tied). Norms, biases and learned positions are left out (<0.1%)."""
        return self.stack_params() + (1 if self.tied_embeddings else 2) * self.head_params + self.vision_params

    def touched_experts(self, tokens: int) -> float:
        """Expected distinct experts ``tokens`` tokens route to (uniform routing)."""
        if not self.moe:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.active_experts / self.experts) ** max(tokens, 0))

    @property
    def attention_layers(self) -> int:
        """Layers that keep KV per token: every layer but the state layers (shared/kv_groups.py's ``STATE``)."""
        return self.layers - sum(1 for kind, _ in self.layer_kinds if kind == STATE)

    @property
    def kv_bytes_per_token(self) -> int:
        """One copy of a token's KV over every attention layer (MLA: its one latent; shared/model_kinds.py); a
        state layer's fixed state is no token's."""
        return self.attention_layers * kinds.kv_values(self) * kv_element_bytes(self.kv_cache_dtype, self.dtype_bytes)

    @property
    def kv_groups(self) -> KvGroups:
        """The layers in KV cache groups as vLLM forms them (shared/kv_groups.py): one group of every layer
        unless some attend over a sliding window."""
        return group_layers(self.layer_kinds) if self.layer_kinds else full_attention(self.layers)

    @property
    def kv_bytes_per_block_token(self) -> int:
        """A token's share of one block: its KV over the layers of one group's page (every layer when
        the model is full attention, ``kv_bytes_per_token``)."""
        layers = self.kv_groups.group_size if self.layer_kinds else self.layers
        return layers * kinds.kv_values(self) * kv_element_bytes(self.kv_cache_dtype, self.dtype_bytes)

    @property
    def layer_weight_bytes(self) -> int:
        """Bytes a decoder layer's weight takes (FP8's block scales, 4 bytes a 128 x 128 block, left out)."""
        return 1 if self.fp8_weights else self.dtype_bytes

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes a routed expert's weight takes: MXFP4's 4.25 bits, else ``layer_weight_bytes``."""
        return MXFP4_WEIGHT_BYTES if self.mxfp4_experts else self.layer_weight_bytes

    @property
    def routed_params(self) -> float:
        """Every MoE layer's routed experts (0: dense)."""
        return self.moe_layers * self.experts * self.expert_params

    @property
    def weight_bytes(self) -> float:
        """The layers' weights at ``layer_weight_bytes`` each, the routed experts' at ``expert_weight_bytes``; the
        embedding, LM head and a vision tower in the dtype."""
        heads = ((1 if self.tied_embeddings else 2) * self.head_params + self.vision_params) * self.dtype_bytes
        routed = self.routed_params
        return (self.stack_params() - routed) * self.layer_weight_bytes + routed * self.expert_weight_bytes + heads

